"""``zyfa study``: the one-command study: captures + Gaussian inputs -> accuracy -> report.

    zyfa study                      # the shipped sample captures (datasets/*.h5) + Gaussian inputs
    zyfa study --quick              # a smaller version (about a minute on 2 CPU cores)
    zyfa study --long --captures smollm2-8k.h5,gemma3-8k.h5,qwen-8k.h5 --out reports/study-long

Default (the embedded study): every shipped sample capture (``datasets/*.h5``, all their layers and heads)
and Gaussian inputs: head dim 128 at 1K, 2K and 4K tokens; head dims 64, 128, 256 and MLA 192/128 at 1K
tokens, plain, causal and with FA3-style outliers in Q/K; one head each (22 inputs with the three samples).
Every named FP8 recipe runs (ZYFA, its five ablations, the AMD and NVIDIA peers, ZYFA with the five other
quantizations of Q/K/V that the report's quantization section compares) plus bf16 (462 runs). Measured before the
five quantization schemes joined, on 2 idle CPU cores (AMD EPYC, 2026-11-30): 66 s wall, 122 s of CPU
time; on the H200 17 s. Its CPU and
GPU results agree within 0.2% (rel-L2 of every input and recipe). ``--device auto`` picks CUDA when present.
A recipe that refuses an input is left out on that input, with a note in the report: the rotating schemes
(``zyfa+hadamard``, ``zyfa+block+hadamard``) need a power-of-two head dim, so they skip the MLA 192/128 inputs.
``--long`` on a CPU leaves out the recipes that emulate Hopper's FP8 accumulator product by product (fa3, sage2,
cudnn-fp8, zyfa-hopper: hours at 32K tokens) unless named with ``--recipes``.

``--long``: the committed configuration: the captures given by ``--captures`` (the three models at 8K tokens
or more, made locally with ``zyfa capture``) and Gaussian inputs up to 32K tokens: head dim 128 causal at
4K, 8K, 16K and 32K; head dims 64, 256 and MLA 192/128 causal at 32K; head dim 128 at 32K non-causal and
causal with outliers. On a GPU it takes minutes. On 2 CPU cores a 32K causal input costs about 2-4 minutes
per recipe (a non-causal one twice that): the whole configuration takes hours, so ``--recipes``,
``--max-seq`` and ``--gaussian-filter REGEX`` (on the input names) narrow it; reports/study-long/ was made
that way (its command is at the top of its report).

The report gets the model-impact section of ``zyfa impact`` from ``reports/impact/results*.jsonl`` when present
(``--impact FILES`` names others, ``--impact none`` leaves it out; ``--long`` leaves it out unless named); their
paths and sha256 go into the provenance (``study_impact``) and the regenerating command.

Writes ``<out>/results.jsonl`` (the runner's rows plus per-input features and per-head errors, with a
provenance header) and the report (``report.md``, ``fig_*.png``, ``report.html``, and with Chromium installed
``report_screenshot.png`` of its first screen, checked for console errors). Progress goes to stderr.

The report opens on its front page (:mod:`zyfa.accuracy.report.front`): each implementation's error with its interval
and status, the speed table "where we land" with the GPU named, and speed against accuracy with the Pareto
frontier. The speed comes from the repository's ``reports/bench/bench.json`` (else its newest
``reports/bench/bench*.json``), found from the package's location, not the current directory; ``--bench`` names
other files.
Modules: :mod:`zyfa.accuracy.study.run` (the inputs and the run), :mod:`zyfa.accuracy.study.compose` (the report from
results, benchmark and impact files), :mod:`zyfa.accuracy.study.cli` (``zyfa study``) and
:mod:`zyfa.accuracy.study.report_cli` (``zyfa report``).
"""
