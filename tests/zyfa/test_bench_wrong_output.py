"""zyfa bench's 'where we land' table: a peer whose output is wrong is shown as wrong, never as a speed."""

from zyfa.bench.table import WRONG_OUTPUT_REL_L2, summary_lines


def _row(impl, recipe, tflops, err, d_qk=192, d_v=128):
    return {"input": "gaussian", "s": 4096, "d_qk": d_qk, "d_v": d_v, "causal": False, "impl": impl,
            "recipe": recipe, "tflops": tflops, "rel_l2_vs_sdpa_bf16": err}


def _line(rows):
    lines = [ln for ln in summary_lines(rows) if ln.startswith("| MLA") or ln.startswith("| hd")]
    assert len(lines) == 1
    return [c.strip() for c in lines[0].strip("|").split("|")]


def test_a_peer_with_wrong_output_is_no_speed():
    rows = [_row("triton-fp8", "zyfa-hopper", 800.0, 0.056), _row("sdpa-bf16:cudnn", "bf16", 600.0, 0.0),
            _row("cudnn-fp8", "cudnn-fp8", 700.0, 0.06), _row("flash-attn-triton-amd", "triton-amd", 65.0, 0.51)]
    cells = _line(rows)
    assert cells[9] == "wrong output (rel-L2 0.51)"
    assert cells[14] == "-"  # no ratio against a wrong output
    assert cells[10] == "1.33" and cells[12] == "1.14"  # the plausible peers keep theirs
    assert cells[8] == "-" and cells[13] == "-"  # no FA3 row


def test_the_threshold_separates_fp8_error_from_a_wrong_output():
    ok = [_row("triton-fp8", "zyfa-hopper", 800.0, 0.056, 128, 128),
          _row("flash-attn-triton-amd", "triton-amd", 200.0, WRONG_OUTPUT_REL_L2, 128, 128)]
    cells = _line(ok)
    assert cells[9] == "200" and cells[14] == "4.00"
    bad = [ok[0], _row("flash-attn-triton-amd", "triton-amd", 200.0, WRONG_OUTPUT_REL_L2 * 1.01, 128, 128)]
    assert _line(bad)[9].startswith("wrong output")


def test_fa3_through_flashinfer_has_its_own_columns():
    """FlashInfer's FA3 FP8 row: its speed and our ratio against it, beside cuDNN FP8's (the header names both)."""
    rows = [_row("triton-fp8", "zyfa-hopper", 800.0, 0.056, 128, 128), _row("cudnn-fp8", "cudnn-fp8", 1000.0, 0.06,
                                                                           128, 128),
            _row("flashinfer-fa3", "fa3:p_scale=fmax", 640.0, 0.05, 128, 128)]
    cells = _line(rows)
    assert cells[7] == "1000" and cells[8] == "640" and cells[12] == "0.80" and cells[13] == "1.25"
    header = [ln for ln in summary_lines(rows) if ln.startswith("| shape")][0]
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols[8] == "FA3 FP8 (FlashInfer)" and cols[13] == "× FA3 FP8" and len(cols) == 16


def test_our_headline_speed_includes_v_transpose():
    """The summary counts our kernel with V's transpose (what a caller with V as stored pays) where it was timed,
    and a peer as timed; the ratios follow."""
    from zyfa.bench.table import headline_tflops

    ours = dict(_row("triton-fp8", "zyfa-hopper", 800.0, 0.056, 128, 128), tflops_incl_transpose=780.0)
    peer = dict(_row("cudnn-fp8", "cudnn-fp8", 650.0, 0.06, 128, 128), tflops_incl_transpose=1.0)  # never read
    assert headline_tflops(ours) == 780.0 and headline_tflops(peer) == 650.0
    assert headline_tflops(_row("triton-fp8", "fa3", 900.0, 0.05)) == 900.0  # no transpose timed: as timed
    cells = _line([ours, peer])
    assert cells[3] == "780" and cells[12] == "1.20"


def test_speed_accuracy_plane_lists_configurations_that_beat_cudnn_fp8_on_both():
    """Per shape: our configurations faster (with V's transpose) and more accurate than cuDNN FP8, fastest first;
    where none is, the fastest more accurate one is named as the closest; a wrong output is never a candidate."""
    from zyfa.bench.table import plane_lines

    def ours(recipe, t, incl, err, d=128):
        return dict(_row("triton-fp8", recipe, t, err, d, d), tflops_incl_transpose=incl)

    rows = [ours("fast-accurate", 1000.0, 990.0, 0.050), ours("faster-accurate", 1100.0, 1090.0, 0.055),
            ours("fast-inaccurate", 1200.0, 1190.0, 0.070), ours("only-fast-without-transpose", 960.0, 940.0, 0.04),
            ours("wrong", 2000.0, 2000.0, 0.9), _row("cudnn-fp8", "cudnn-fp8", 950.0, 0.06, 128, 128),
            ours("slow-accurate", 800.0, 790.0, 0.05, 256), _row("cudnn-fp8", "cudnn-fp8", 1000.0, 0.06, 256, 256)]
    table = [ln for ln in plane_lines(rows) if ln.startswith("| hd")]
    assert len(table) == 2
    hd128 = [c.strip() for c in table[0].strip("|").split("|")]
    assert hd128[3:5] == ["950", "0.0600"]
    assert hd128[5] == "faster-accurate (1090, 0.0550, 1.15×); fast-accurate (990, 0.0500, 1.04×)"
    hd256 = [c.strip() for c in table[1].strip("|").split("|")]
    assert hd256[5] == "none; fastest more accurate: slow-accurate (790, 0.0500, 0.79×)"
    assert plane_lines([ours("x", 1.0, 1.0, 0.05)]) == []  # no cuDNN FP8 row: no table


def test_speed_accuracy_plane_against_fa3_through_flashinfer():
    """The same table against FlashInfer's FA3 FP8: its own rows are the reference, cuDNN FP8's are not used, and
    the bench's Markdown carries both tables."""
    from zyfa.bench.table import plane_lines

    ours = dict(_row("triton-fp8", "zyfa-hopper", 900.0, 0.055, 256, 256), tflops_incl_transpose=890.0)
    rows = [ours, _row("cudnn-fp8", "cudnn-fp8", 1000.0, 0.06, 256, 256),
            _row("flashinfer-fa3", "fa3:p_scale=fmax", 850.0, 0.058, 256, 256)]
    fa3 = plane_lines(rows, "flashinfer-fa3")
    assert fa3[0] == "## Against FA3 FP8 (FlashInfer) on the speed–accuracy plane (same inputs, same run)"
    cells = [c.strip() for c in [ln for ln in fa3 if ln.startswith("| hd")][0].strip("|").split("|")]
    assert cells[3:5] == ["850", "0.0580"] and cells[5] == "zyfa-hopper (890, 0.0550, 1.05×)"
    cud = [c.strip() for c in [ln for ln in plane_lines(rows) if ln.startswith("| hd")][0].strip("|").split("|")]
    assert cud[5] == "none; fastest more accurate: zyfa-hopper (890, 0.0550, 0.89×)"
    assert plane_lines(rows[:2], "flashinfer-fa3") == []  # no FA3 row: no table


def test_our_cute_kernel_counts_among_our_configurations():
    """The CuTe DSL kernel's rows are ours too: the fastest of our recipes may be one (named cute:<recipe>), and it
    takes its place on the speed–accuracy plane; the Triton recipe's columns and ratios stay the Triton kernel's."""
    from zyfa.bench.table import plane_lines

    triton = dict(_row("triton-fp8", "zyfa-hopper", 850.0, 0.056, 128, 128), tflops_incl_transpose=840.0)
    cute = dict(_row("cute-fp8", "zyfa-hopper:rowsum=rounded_mma", 945.0, 0.056, 128, 128),
                tflops_incl_transpose=940.0)
    rows = [triton, cute, _row("cudnn-fp8", "cudnn-fp8", 920.0, 0.06, 128, 128)]
    cells = _line(rows)
    assert cells[3] == "840" and cells[4] == "940 (cute:zyfa-hopper:rowsum=rounded_mma)"
    assert cells[12] == "0.91"  # the ratio is the Triton recipe's (840 / 920)
    plane = [c.strip() for c in [ln for ln in plane_lines(rows) if ln.startswith("| hd")][0].strip("|").split("|")]
    assert plane[5] == "cute:zyfa-hopper:rowsum=rounded_mma (940, 0.0560, 1.02×)"
