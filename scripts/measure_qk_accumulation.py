"""What modelling the H200's FP8 Q·K accumulation does to the emulated error, and what FA3's 224-key tiles do
(docs/PLATFORMS.md; issue 13). CPU, a few minutes. Run from the repository root:

    python3 scripts/measure_qk_accumulation.py

For each input and h200 recipe: rel-L2 against FP64 on the dequantized inputs with Q·K summed in fp32 (the
h200 platform with ``fp8_qk="fp32"``, the emulator before issue 13) and with Q·K modelled (the h200 platform);
then fa3 with 128x128 tiles against its tile_size.h tiles on Gaussian head-dim-128 inputs. The recipes are those
the GPU tests compare with our Triton kernel on the H200: the h200 ones that keep Q·K in the tensor-core
accumulator (``zyfa-hopper``, ``fa3``), ``cudnn-fp8``, and MI355X recipes run on the h200 with a true fp32
sum, i.e. each k = 32 step flushed into fp32 (``zyfa@h200``, ``ck@h200``, ``aiter@h200``).
"""

from __future__ import annotations

import dataclasses

from zyfa.accuracy.inputs.attention_input import GaussianSpec, capture_inputs, make_gaussian
from zyfa.reference.attention import attention_fp64

from zyfa.emulator import emulate
from zyfa.norms import rel_l2
from zyfa.platforms import get_platform
from zyfa.recipe_spec import get_recipe


def emulation_error(recipe, x, platform=None) -> float:
    kw = dict(causal=x.causal, window=x.window, sm_scale=x.sm_scale)
    em = emulate(x.q, x.k, x.v, recipe, platform=platform, **kw)
    ref = attention_fp64(em.q_deq, em.k_deq, em.v_deq, **kw)[0]
    return rel_l2(em.out, ref)


def main() -> None:
    pv_only = dataclasses.replace(get_platform("h200"), name="h200-pv-only", fp8_qk="fp32")
    inputs = capture_inputs("datasets/qwen25coder-pydoc-2048.h5", layers=[0], max_tokens=1024)
    inputs += [make_gaussian(GaussianSpec(heads_q=2, heads_kv=2, seq=1024, head_dim=128, outlier_frac=0.001, seed=0))]
    for x in inputs:
        for name in ("zyfa-hopper", "fa3", "cudnn-fp8", "zyfa@h200", "ck@h200", "aiter@h200"):
            a, b = emulation_error(name, x, pv_only), emulation_error(name, x, "h200")
            print(f"{x.name} {name}: Q.K fp32 {a:.5e}  Q.K modelled {b:.5e}  ratio {b / a:.4f}", flush=True)
    for frac in (0.0, 0.001):
        x = make_gaussian(GaussianSpec(heads_q=2, heads_kv=2, seq=2048, head_dim=128, outlier_frac=frac, seed=0))
        a = emulation_error(get_recipe("fa3").replace(name="fa3-128x128", head_dim_tiles=()), x)
        b = emulation_error("fa3", x)
        print(f"fa3 tiles, {x.name}: 128x128 {a:.5e}  128x224 {b:.5e}  ratio {b / a:.4f}", flush=True)


if __name__ == "__main__":
    main()
