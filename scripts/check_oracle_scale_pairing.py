"""Why cudnn-fp8:oracle-scale had less error than its emulation in the committed H200 study (docs/real_kernels.md).

For each of the study's Gaussian inputs with FA3-style outliers, the cudnn-fp8 recipe is emulated (on its own
platform, h200) with its FP8 output scaled two ways: by 448 / its own output amax (the emulator's rule, and the
first-pass choice of the cudnn-fp8 implementation) and by 448 / the FP64 oracle's output amax (the choice of
cudnn-fp8:oracle-scale). It prints both errors against FP64 on the recipe's dequantized inputs, their ratio, and
the committed real rows of reports/study/results.jsonl beside them. CPU only; about 6 minutes on 2 cores.

    python3 scripts/check_oracle_scale_pairing.py
"""
import json
from pathlib import Path

from zyfa.accuracy.implementations.base import Pairing
from zyfa.accuracy.implementations.real_rows import _paired_output
from zyfa.accuracy.inputs.attention_input import make_gaussian
from zyfa.accuracy.study.run import gaussian_specs
from zyfa.reference.attention import attention_fp64

from zyfa.emulator import emulate
from zyfa.norms import rel_l2
from zyfa.recipe_spec import get_recipe

RESULTS = Path(__file__).resolve().parents[1] / "reports" / "study" / "results.jsonl"


def main():
    committed = {}
    if RESULTS.is_file():
        for line in RESULTS.read_text().splitlines()[1:]:
            r = json.loads(line)
            if str(r.get("implementation", "")).startswith("cudnn-fp8") and r.get("status") == "ok":
                committed[(r["implementation"], r["input"])] = (r["deq_rel_l2"], r["real_emu_ratio"])
    r = get_recipe("cudnn-fp8")
    for s in gaussian_specs("default"):
        if "-out" not in s.name:
            continue
        x = make_gaussian(s)
        kw = {"causal": x.causal, "window": x.window}
        ref_orig = attention_fp64(x.q, x.k, x.v, **kw)
        cache = {}

        def paired(rec, x=x, kw=kw, cache=cache):
            if rec not in cache:
                em = emulate(x.q, x.k, x.v, rec, **kw)
                cache[rec] = (em.out, em.lse, attention_fp64(em.q_deq, em.k_deq, em.v_deq, **kw))
            return cache[rec]

        own, ref = _paired_output(Pairing(r), paired, 0.0)
        oracle, _ = _paired_output(Pairing(r, "oracle"), paired, float(ref_orig[0].abs().max()))
        e_own, e_oracle = rel_l2(own, ref[0]), rel_l2(oracle, ref[0])
        real = committed.get(("cudnn-fp8:oracle-scale", x.name))
        print(f"{x.name}: emulation error, scale_o from its own amax {e_own:.4e}, from the oracle's amax "
              f"{e_oracle:.4e} (ratio {e_oracle / e_own:.3f}); committed cudnn-fp8:oracle-scale real error "
              + (f"{real[0]:.4e} (ratio to the first: {real[1]:.3f}; to the oracle-scaled emulation: "
                 f"{real[0] / e_oracle:.3f})" if real else "-"))


if __name__ == "__main__":
    main()
