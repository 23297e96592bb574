"""scripts/sass_variants.py: the comparison that says whether a kernel change moved any variant's SASS (CPU), and
the hash of one compiled variant is the same on a second compile (needs triton's bundled ptxas, no GPU)."""

from __future__ import annotations

import json

import pytest

from tests.load_file import load_script


@pytest.fixture(scope="module")
def sv():
    return load_script("sass_variants")  # it puts scripts/ on sys.path itself (for inspect_sass)


def _rec(sha="a" * 64, regs=162, n=900, **config):
    return {"sha256": sha, "registers": regs, "instructions": n, "config": {"BLOCK_M": 64, **config}}


def test_compare_names_every_variant_that_moved(sv):
    before = {"zyfa/hd128/noncausal": _rec(WS=False), "fa3/hd64/causal": _rec(), "ck/mla/causal": _rec(),
              "bf16/hd64/causal": {"refused": "recipe 'bf16': no"}, "aiter/hd256/causal": _rec(MAD_CVT=0)}
    same = json.loads(json.dumps(before))
    same["zyfa/hd128/noncausal"]["config"].pop("WS")  # a removed switch's key may go
    assert sv.compare(before, same) == []
    after = json.loads(json.dumps(same))
    after["fa3/hd64/causal"] = _rec(sha="b" * 64, regs=168, n=901)
    after["bf16/hd64/causal"] = _rec()
    del after["ck/mla/causal"]
    after["aiter/hd256/causal"]["config"]["MAD_CVT"] = 3
    assert sv.compare(before, after) == [
        "aiter/hd256/causal: same SASS, config values changed {'MAD_CVT': (0, 3)}",
        "bf16/hd64/causal: refusal \"recipe 'bf16': no\" -> None",
        "ck/mla/causal: only in before",
        "fa3/hd64/causal: SASS aaaaaaaaaaaa -> bbbbbbbbbbbb (registers 162 -> 168, instructions 900 -> 901)"]


def test_digest_ignores_only_the_temporary_cubin_name(sv):
    a = "Fatbin elf code:\nidentifier = /tmp/tmpab12.cubin\n  /*0000*/ QGMMA.64x64x32 ;\n"
    b = a.replace("tmpab12", "tmpzz99")
    assert sv.sass_digest(a) == sv.sass_digest(b)
    assert sv.sass_digest(a) != sv.sass_digest(a.replace("QGMMA.64x64x32", "QGMMA.64x128x32"))


def test_compare_cli_refuses_a_file_that_is_not_its_output(sv, tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit) as e:
        sv.main(["--compare", str(bad), str(bad)])
    assert e.value.code == 2 and capsys.readouterr().err.startswith(f"sass_variants: {bad}: not a --out file")


def test_a_variant_compiles_to_the_same_hash_twice(sv, tmp_path, monkeypatch):
    """Two compiles from empty Triton caches (so ptxas really runs twice) give one hash: a hash that moves
    between before and after is the change's, not the compiler's."""
    pytest.importorskip("triton", reason="triton is not installed here (the offline compile needs its ptxas)")
    hashes = []
    for i in range(2):
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / f"cache{i}"))
        hashes.append(sv.variant_record("zyfa-hopper", 64, 64, True)["sha256"])
        assert any((tmp_path / f"cache{i}").rglob("*.cubin")), "the compile did not use the fresh cache"
    assert hashes[0] == hashes[1]
    assert sv.variant_record("bf16", 64, 64, True) == {
        "refused": "recipe 'bf16': the Triton FP8 kernel does not support q_format='bf16' (supported: 'e4m3fn')"}
