"""scripts/explain_sdpa_flash.py on a CPU: FA2's split count against what the H200 recording showed, the model's
one-hot probe arithmetic by hand, and ``fit`` end to end on a recording whose "FA2" is the split-KV model itself."""

from __future__ import annotations

import math

import pytest
import torch

from tests.load_file import load_script

esf = load_script("explain_sdpa_flash")


@pytest.mark.parametrize("s,d,splits", [
    # the split counts that reproduced FA2 on the H200 (132 SMs), one head: docs/real_kernels.md
    (1024, 128, 8), (2048, 128, 8), (4096, 128, 4), (1024, 64, 4), (1024, 256, 16),
    (512, 64, 2), (512, 128, 4), (512, 256, 8),
])
def test_split_count_is_the_one_the_h200_recording_needs(s, d, splits):
    assert esf.fa2_num_splits(1, s, s, d) == splits


def test_no_split_once_the_query_blocks_fill_the_gpu():
    # 0.8 of 2 x 132 CTA slots = 211.2 query blocks of 64 rows
    assert esf.fa2_num_splits(211, 64, 4096, 128) > 1
    assert esf.fa2_num_splits(212, 64, 4096, 128) == 1
    assert esf.fa2_num_splits(4 * 16, 4096, 4096, 128) == 1


def test_tile_sizes_by_head_dim():
    assert [esf.fa2_split_block_n(d) for d in (32, 64, 96, 128, 192, 256)] == [256, 256, 128, 128, 64, 64]


def test_one_hot_probe_of_one_tile_is_p_rounded_twice():
    """One tile, no split: out[i, j] = bf16(bf16(exp(s_ij - m_i)) / l_i), computed here in float64 by hand."""
    g = torch.Generator().manual_seed(3)
    q = (torch.randn(16, 64, generator=g) * 1.4).to(torch.bfloat16).float()
    k = (torch.randn(64, 64, generator=g) * 1.4).to(torch.bfloat16).float()
    v = esf.one_hot_values(64, 64, 0)[0, 0].float()
    got = esf.fa2_model(q, k, v, sm_scale=0.125, causal=False, block_n=256, reverse=True, rcp=False)
    s = (q.double() @ k.double().T) * 0.125
    p = torch.exp(s - s.amax(1, keepdim=True))
    want = (p.float().to(torch.bfloat16).double() / p.sum(1, keepdim=True)).to(torch.bfloat16)
    assert (got == want).double().mean() > 0.995  # fp32 exp2 vs float64 exp: a rare rounding-boundary flip


def test_splits_round_each_split_against_its_own_max():
    """Two splits of one key each: both keys' P are exactly 1 before the combine, so with one-hot V the output is
    bf16 of the exact softmax weights; one softmax rounds the smaller P once more."""
    q = torch.tensor([[1.0, 0.0]])
    k = torch.tensor([[0.3, 0.0], [0.0, 0.0]])
    v = torch.eye(2)
    split = esf.fa2_model(q, k, v, sm_scale=1.0, causal=False, block_n=1, reverse=True, rcp=True, splits=2)
    w = torch.softmax(torch.tensor([0.3, 0.0], dtype=torch.float64), 0)
    assert torch.equal(split[0].double(), w.to(torch.bfloat16).double())
    one = esf.fa2_model(q, k, v, sm_scale=1.0, causal=False, block_n=2, reverse=True, rcp=True)
    p_small = torch.tensor(math.exp(-0.3)).to(torch.bfloat16).double()
    assert one[0, 1].double() == (p_small / (1 + math.exp(-0.3))).to(torch.bfloat16).double()


def test_fit_finds_the_model_that_made_the_recording(tmp_path, capsys):
    from zyfa.accuracy.inputs.attention_input import GaussianSpec, make_gaussian

    cand = {"block_n": 256, "reverse": True, "rcp": True, "splits": 2}
    q, k = esf._probe_inputs(64, False, 0)
    outs = [esf.fa2_model(q[0, 0].float(), k[0, 0].float(), esf.one_hot_values(esf.PROBE_SEQ, 64, c)[0, 0].float(),
                          sm_scale=64 ** -0.5, causal=False, **cand)[None, None]
            for c in range(esf.PROBE_SEQ // 64)]
    spec = GaussianSpec(heads_q=1, heads_kv=1, seq=512, head_dim=64)
    x = make_gaussian(spec)
    xq, xk, xv = (t[0, 0].to(torch.bfloat16).float() for t in (x.q, x.k, x.v))
    out = esf.fa2_model(xq, xk, xv, sm_scale=64 ** -0.5, causal=False, **cand)[None, None]
    rec = {"device": "model", "torch": torch.__version__,
           "probes": [{"d": 64, "causal": False, "seed": 0, "q": q, "k": k, "outs": outs}],
           "inputs": [{"name": x.name, "spec": spec, "out": out}]}
    path = tmp_path / "rec.pt"
    torch.save(rec, path)
    esf.main(["fit", str(path)])
    text = capsys.readouterr().out
    probe = next(line for line in text.splitlines() if line.startswith("| d64 |"))
    assert "FA2 split-KV: 2 splits of 256-key tiles: 1.0000" in probe
    assert "(the bf16 recipe): 1.0000" not in probe
    row = next(line for line in text.splitlines() if line.startswith(f"| {x.name} |"))
    assert "FA2 split-KV: 2 splits of 256-key tiles: " in row and ", 0.0e+00" in row


def test_fit_refuses_a_missing_recording(tmp_path):
    with pytest.raises(SystemExit, match="no recording at"):
        esf.main(["fit", str(tmp_path / "none.pt")])


def test_fa2_forward_maps_each_query_head_to_its_kv_head():
    """GQA 4:2 at a split count of 2: each query head equals fa2_model on its own KV head."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, n, 300, 64, generator=g) for n in (4, 2, 2))
    out, splits = esf.fa2_forward(q, k, v, sm_scale=0.125, causal=True)
    assert splits == esf.fa2_num_splits(4, 300, 300, 64) > 1
    for hi in range(4):
        one = esf.fa2_model(*(t[0, j].to(torch.bfloat16).float() for t, j in ((q, hi), (k, hi // 2), (v, hi // 2))),
                            sm_scale=0.125, causal=True, block_n=256, reverse=True, rcp=True, splits=splits)
        assert torch.equal(out[0, hi], one)
    assert not torch.equal(out[0, 0], out[0, 2])
