"""zyfa bench's 'where we land' table: a peer whose output is wrong is shown as wrong, never as a speed."""

from zyfa.bench import WRONG_OUTPUT_REL_L2, summary_lines


def _row(impl, recipe, tflops, err, d_qk=192, d_v=128):
    return {"input": "gaussian", "s": 4096, "d_qk": d_qk, "d_v": d_v, "causal": False, "impl": impl,
            "recipe": recipe, "tflops": tflops, "rel_l2_vs_sdpa_bf16": err}


def _line(rows):
    lines = [ln for ln in summary_lines(rows) if ln.startswith("| MLA") or ln.startswith("| hd")]
    assert len(lines) == 1
    return [c.strip() for c in lines[0].strip("|").split("|")]


def test_a_peer_with_wrong_output_is_no_speed():
    rows = [_row("triton-fp8", "zyfa-hopper", 800.0, 0.056), _row("sdpa-cudnn", "bf16", 600.0, 0.0),
            _row("cudnn-fp8", "cudnn-fp8", 700.0, 0.06), _row("flash-attn-triton-amd", "triton-amd", 65.0, 0.51)]
    cells = _line(rows)
    assert cells[8] == "wrong output (rel-L2 0.51)"
    assert cells[12] == "-"  # no ratio against a wrong output
    assert cells[9] == "1.33" and cells[11] == "1.14"  # the plausible peers keep theirs


def test_the_threshold_separates_fp8_error_from_a_wrong_output():
    ok = [_row("triton-fp8", "zyfa-hopper", 800.0, 0.056, 128, 128),
          _row("flash-attn-triton-amd", "triton-amd", 200.0, WRONG_OUTPUT_REL_L2, 128, 128)]
    cells = _line(ok)
    assert cells[8] == "200" and cells[12] == "4.00"
    bad = [ok[0], _row("flash-attn-triton-amd", "triton-amd", 200.0, WRONG_OUTPUT_REL_L2 * 1.01, 128, 128)]
    assert _line(bad)[8].startswith("wrong output")
