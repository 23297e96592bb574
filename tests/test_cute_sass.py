"""scripts/cute_sass.py's SASS reading on a listing written here (CPU, no DSL): a KV loop is a backward branch over a
wgmma, a retry path after the exits is not, and the epilogue is counted from the last loop to the last EXIT."""

from __future__ import annotations

from tests.load_file import load_script

LISTING = "\n".join(f"        /*{a:04x}*/                   {t} ;" for a, t in [
    (0x0000, "MOV R1, c[0x0][0x28]"),
    (0x0010, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2"),  # loop 1: 0x0010-0x0040
    (0x0020, "QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8], RZ, !UPT"),
    (0x0030, "STL [R1], R92"),
    (0x0040, "@P1 BRA 0x10"),
    (0x0050, "FFMA R2, R3, R4, R5"),  # a loop without wgmma: not a KV loop
    (0x0060, "@P2 BRA 0x50"),
    (0x0070, "QGMMA.64x64x32.F32.E4M3.E4M3 R24, R8, gdesc[UR8], R24"),  # loop 2: 0x0070-0x0090
    (0x0080, "LDL R5, [R1]"),
    (0x0090, "@P1 BRA 0x70"),
    (0x00a0, "STG.E [R2.64], R4"),
    (0x00b0, "STG.E [R2.64+0x10], R6"),
    (0x00c0, "EXIT"),
    (0x00d0, "BRA 0x10"),  # the mbarrier retry path: jumps back over everything, an EXIT inside
])


def test_kv_loops_and_the_code_after_them():
    sass = load_script("cute_sass")
    loops = sass.sass_kv_loops(LISTING)
    assert [len(body) for body in loops] == [4, 3]
    assert sum(t.startswith("STL") for t in loops[0]) == 1 and any(t.startswith("LDL") for t in loops[1])
    assert sass.after_last_loop(LISTING) == 3  # the two stores and the EXIT


def test_a_loop_around_kv_loops_is_not_one():
    """The PERSISTENT form's loop over work items encloses the KV loops: only the innermost count."""
    sass = load_script("cute_sass")
    outer = LISTING.replace("/*00a0*/                   STG.E [R2.64], R4", "/*00a0*/                   @P3 BRA 0x10")
    assert [len(body) for body in sass.sass_kv_loops(outer)] == [4, 3]


def test_a_turn_is_counted_from_its_wait_to_its_hand_over():
    sass = load_script("cute_sass")
    body = ["SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2", "BAR.SYNC R3, 0x100", "UMOV UR7, 0x40000040",
            "QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], RZ, !UPT", "BAR.ARV R4, 0x100", "FFMA R2, R3, R4, R5"]
    assert sass.turn_length(body) == 4
    assert sass.turn_length(body[2:]) is None  # no wait for a turn in this loop
