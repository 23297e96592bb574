"""Typed schemas of the rows a renderer reads, checked on load (torch-free; plain Python, no dependency).

Every renderer (``zyfa report``, ``zyfa longctx --render``, ``zyfa cliffs --render``) reads result files through
:func:`read_rows`, so a field of the wrong type or an impossible value is one error naming the file, the line and
the field (``r.jsonl:7: length: must be an integer >= 1, got 'abc'``) before anything is rendered, never a
traceback in the middle of a table.

Row kinds and their schemas (a field not listed is not checked; one that is listed and present must fit):
    provenance       the ``{"record": "provenance"}`` line of every result file (:data:`PROVENANCE`; a resumed
                     run's earlier segments, ``earlier_runs``, each fit :data:`SEGMENT`)
    result           an operator row of ``zyfa accuracy``/``study`` (:func:`zyfa.accuracy.io.results_io.check_row`:
                     types, metrics in range), and the typed fields of :data:`RESULT`
    longctx          a long-context row, ``"kind": "longctx"`` (:data:`LONGCTX`); RULER-style task rows are such
                     rows too
    cliffs           a row of a file whose provenance is a cliff sweep's (``record_kind: cliffs``, :data:`CLIFFS`)
    humaneval        a ``zyfa tasks humaneval`` row (:data:`HUMANEVAL`)
    impact           a ``zyfa impact`` row, ``"kind": "impact_window"`` or ``"impact_layer"`` (:data:`IMPACT`)

Rows written before a schema change are rewritten once by ``scripts/migrate_rows.py``, never repaired as they are
read: :func:`check_migrated` (run on every row :func:`read_rows` returns, and on ``zyfa impact``'s rows) refuses a
row in an older form in one line naming the script (:data:`OLD_FORMS` lists the forms).

And the provenance of what is combined: :func:`mixed_code_notice` says where rows of several git commits, or of a
modified (dirty) tree, are rendered together.

Exposed: ``SchemaError``, ``PROVENANCE``, ``SEGMENT``, ``RESULT``, ``LONGCTX``, ``CLIFFS``, ``HUMANEVAL``, ``IMPACT``,
``check_provenance(prov, where)``, ``check_fields(obj, schema, where)``, ``check_any_row(row, where, cliffs=False)``,
``read_rows(path, partial=None) -> (rows, provenance)``, ``mixed_code_notice(provs) -> str | None``,
``check_migrated(row, where)``, ``unmigrated_form(row) -> str | None``, ``OLD_FORMS``, ``MIGRATE_COMMAND``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path

from zyfa.accuracy.io.results_io import IMPACT_KINDS, check_row, read_jsonl, read_log, run_provenances

from zyfa.recipe_spec import names_old_accumulator
from zyfa.recipes import ACCUMULATOR_ALIASES

__all__ = ["CLIFFS", "HUMANEVAL", "IMPACT", "LONGCTX", "MIGRATE_COMMAND", "OLD_FORMS", "PROVENANCE", "RESULT",
           "SEGMENT", "SchemaError", "check_any_row", "check_fields", "check_migrated", "check_provenance",
           "mixed_code_notice", "read_rows", "unmigrated_form"]


class SchemaError(ValueError):
    """A row or provenance record that does not fit its schema: ``file:line: field: problem``."""


# A field's check: the problem with a present value, or None. Built by the helpers below; each says what it wants.
Check = Callable[[object], "str | None"]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _show(v) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def string(*, null: bool = True) -> Check:
    def check(v):
        if v is None and null:
            return None
        return None if isinstance(v, str) else "must be a string" + (" or null" if null else "")
    return check


def integer(lo: int | None = None, *, null: bool = False) -> Check:
    want = "an integer" + (f" >= {lo}" if lo is not None else "") + (" or null" if null else "")

    def check(v):
        if v is None and null:
            return None
        return None if _is_int(v) and (lo is None or v >= lo) else f"must be {want}"
    return check


def number(lo: float | None = None, hi: float | None = None, *, null: bool = True, nan: bool = False) -> Check:
    """A finite number in [lo, hi] (NaN only with ``nan``: an overflowed output's error)."""
    rng = (f" in [{lo}, {hi}]" if lo is not None and hi is not None else f" >= {lo}" if lo is not None
           else f" <= {hi}" if hi is not None else "")
    want = f"a finite number{rng}" + (" or NaN" if nan else "") + (" or null" if null else "")

    def check(v):
        if v is None and null:
            return None
        if not _is_num(v):
            return f"must be {want}"
        if math.isnan(v):
            return None if nan else f"must be {want}"
        ok = math.isfinite(v) and (lo is None or v >= lo) and (hi is None or v <= hi)
        return None if ok else f"must be {want}"
    return check


def boolean(*, null: bool = True) -> Check:
    def check(v):
        if v is None and null:
            return None
        return None if isinstance(v, bool) else "must be true or false" + (" (or null)" if null else "")
    return check


def strings(*, null: bool = True) -> Check:
    """A list of strings."""
    def check(v):
        if v is None and null:
            return None
        ok = isinstance(v, list) and all(isinstance(x, str) for x in v)
        return None if ok else "must be a list of strings"
    return check


def one_of(*types: type, null: bool = True) -> Check:
    names = " or ".join({"str": "a string", "list": "a list", "dict": "an object", "int": "an integer"}
                        .get(t.__name__, t.__name__) for t in types)

    def check(v):
        if v is None and null:
            return None
        ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
        return None if ok else f"must be {names}"
    return check


def numbers_by_key(lo: float | None = None) -> Check:
    """An object whose values are finite numbers >= lo (or null): per-layer errors."""
    each = number(lo)

    def check(v):
        if v is None:
            return None
        if not isinstance(v, dict):
            return "must be an object of numbers"
        bad = next((x for x in v.values() if each(x) is not None), "ok")
        return None if bad == "ok" else f"must hold finite numbers >= {lo} (got {_show(bad)})"
    return check


# (check, required) per field
Schema = dict[str, tuple[Check, bool]]

def run_records() -> Check:
    """A list of provenance records (a resumed run's earlier segments), each an object fitting :data:`PROVENANCE`
    without a list of its own."""
    def check(v):
        if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
            return "must be a list of provenance records (objects)"
        for i, x in enumerate(v):
            try:
                check_fields(x, SEGMENT, f"[{i}]", "provenance record")
            except SchemaError as e:
                return f"earlier run {e}"
        return None
    return check


# The provenance record of one run segment (accuracy.io.provenance.provenance and what each command adds).
SEGMENT: Schema = {
    "zyfa_version": (string(), False), "git_commit": (string(), False), "git_dirty": (boolean(), False),
    "python": (string(), False), "torch": (string(), False), "numpy": (string(), False),
    "platform": (string(), False), "cpu": (string(), False), "cpu_count": (integer(1, null=True), False),
    "cuda_device": (string(), False), "device": (string(), False), "device_name": (string(), False),
    "date_utc": (string(), False), "argv": (strings(), False), "command": (string(), False),
    "run_id": (string(), False), "record_kind": (string(), False), "recipes": (strings(), False),
    "models": (strings(), False), "tasks": (strings(), False), "text": (string(), False),
    "implementations": (one_of(list, dict), False), "subjects": (one_of(list), False),
    "seeds": (one_of(list), False), "depths": (one_of(list), False), "partial": (boolean(), False),
}
# The provenance record of any result file: its latest segment's, listing the earlier ones of a resumed run
# (accuracy.io.results_io.run_provenances).
PROVENANCE: Schema = {**SEGMENT, "earlier_runs": (run_records(), False)}

# An operator result row's typed fields besides what check_row checks (recipe, input, metrics, has_nan).
RESULT: Schema = {
    "kind": (string(), False), "implementation": (string(), False), "platform": (string(), False),
    "run_id": (string(), False),
    "input_content_hash": (string(), False), "status": (string(), False), "paired_spec": (string(), False),
    "batch": (integer(1, null=True), False), "heads_q": (integer(1, null=True), False),
    "heads_kv": (integer(1, null=True), False), "seq_q": (integer(0, null=True), False),
    "seq_k": (integer(0, null=True), False), "head_dim": (integer(1, null=True), False),
    "head_dim_v": (integer(1, null=True), False), "causal": (boolean(), False),
    "window": (integer(1, null=True), False), "sm_scale": (number(0.0), False), "real": (boolean(), False),
    "n_rows": (integer(0, null=True), False), "seconds": (number(0.0), False),
    "real_emu_ratio": (number(0.0, nan=True), False),
}

# A long-context row (accuracy.longctx.run): a log-probability is never above 0 (1e-6 of rounding allowed); a
# depth is a fraction of the context.
LOGPROB = number(hi=1e-6)
LONGCTX: Schema = {
    "kind": (string(null=False), True), "task": (string(null=False), True), "length": (integer(1), True),
    "implementation": (string(null=False), True), "input": (string(null=False), True),
    "model": (string(null=False), True), "depth": (number(0.0, 1.0, null=False), True),
    "seed": (integer(0), True), "status": (string(null=False), True),
    "recipe": (string(), False), "platform": (string(), False), "accumulation": (string(), False),
    "input_content_hash": (string(), False), "depth_actual": (number(0.0, 1.0), False),
    "answer_text": (string(), False), "answer_tokens": (integer(0, null=True), False), "error": (string(), False),
    "seconds": (number(0.0), False), "batch": (integer(1, null=True), False), "exact": (boolean(), False),
    "answer_logprob": (LOGPROB, False), "answer_logprob_mean": (LOGPROB, False),
    "first_token_rank": (integer(0, null=True), False), "greedy_answer": (string(), False),
    "op_rel_l2": (numbers_by_key(0.0), False), "op_rel_l2_mean": (number(0.0), False),
    "run_id": (string(), False), "text_offset": (integer(0, null=True), False),
}

# A cliff sweep's row (accuracy.cliffs.sweep): lengths and shapes are positive counts; errors NaN-free numbers >= 0.
CLIFFS: Schema = {
    "input": (string(null=False), True), "implementation": (string(null=False), True),
    "length": (integer(1), True), "status": (string(null=False), True),
    "recipe": (string(), False), "platform": (string(), False), "seq_q": (integer(1, null=True), False),
    "seq_k": (integer(1, null=True), False), "shape": (string(), False), "mask": (string(), False),
    "causal": (boolean(), False), "window": (integer(1, null=True), False), "chunk": (integer(1, null=True), False),
    "heads_q": (integer(1, null=True), False), "heads_kv": (integer(1, null=True), False),
    "head_dim": (integer(1, null=True), False), "head_dim_v": (integer(1, null=True), False),
    "reason": (string(), False), "orig_rel_l2": (number(0.0, nan=True), False),
    "deq_rel_l2": (number(0.0, nan=True), False), "orig_lse_max_abs_err": (number(0.0, nan=True), False),
    "deq_lse_max_abs_err": (number(0.0, nan=True), False), "nonfinite_rows": (integer(0, null=True), False),
    "n_rows": (integer(0, null=True), False), "seconds": (number(0.0), False),
    "oracle_seconds": (number(0.0), False),
}

# A zyfa tasks humaneval row (accuracy.tasks.humaneval).
HUMANEVAL: Schema = {
    "kind": (string(null=False), True), "implementation": (string(null=False), True),
    "model": (string(null=False), True), "task_id": (string(), False), "status": (string(), False),
    "passed": (boolean(), False), "baseline": (string(), False), "seconds": (number(0.0), False),
    "max_new_tokens": (integer(1, null=True), False),
}

# A zyfa impact row (accuracy.impact.run): one window with every layer's attention swapped (layer null) or one layer.
IMPACT: Schema = {
    "kind": (string(null=False), True), "model": (string(null=False), True), "recipe": (string(null=False), True),
    "window": (integer(0), True), "layer": (integer(0, null=True), False), "n_tokens": (integer(1), True),
    "text": (string(null=False), True), "kl_mean": (number(0.0), False), "kl_p99": (number(0.0), False),
    "kl_max": (number(0.0), False), "ppl_ratio": (number(0.0), False), "top1_agree": (number(0.0, 1.0), False),
    "p_flushed_mean": (number(0.0, 1.0), False), "implementation": (string(), False),
    "seconds": (number(0.0), False),
}


def check_fields(obj, schema: Schema, where: str, what: str = "row") -> dict:
    """``obj`` if it is a JSON object fitting ``schema``, else SchemaError ``where: field: problem``."""
    if not isinstance(obj, dict):
        raise SchemaError(f"{where}: expected a JSON object (a {what}), got a {type(obj).__name__}")
    for name, (check, required) in schema.items():
        if name not in obj:
            if required:
                raise SchemaError(f"{where}: {name}: missing (every {what} has it)")
            continue
        problem = check(obj[name])
        if problem is not None:
            raise SchemaError(f"{where}: {name}: {problem}, got {_show(obj[name])}")
    return obj


def check_provenance(prov, where: str) -> dict:
    """A provenance record checked against :data:`PROVENANCE`."""
    return check_fields(prov, PROVENANCE, where, "provenance record")


def check_any_row(row, where: str, *, cliffs: bool = False) -> dict:
    """A row checked by its kind: a cliff sweep's (``cliffs``), a long-context or HumanEval row (its ``kind``), else
    an operator result row. A row in an older form is refused first (:func:`check_migrated`)."""
    check_migrated(row, where)
    if cliffs:
        return check_fields(row, CLIFFS, where, "cliff sweep row")
    kind = row.get("kind") if isinstance(row, dict) else None
    if kind == "longctx":
        return check_fields(row, LONGCTX, where, "long-context row")
    if kind == "humaneval":
        return check_fields(check_row(row, where), HUMANEVAL, where, "HumanEval row")
    if kind in IMPACT_KINDS:
        return check_fields(row, IMPACT, where, "zyfa impact row")
    return check_fields(check_row(row, where), RESULT, where, "result row")


# The forms of rows written before a schema change, each rewritten by scripts/migrate_rows.py (which notes what it
# changed in the row's "migrated" field): name -> what the migration does.
MIGRATE_COMMAND = "python scripts/migrate_rows.py"
OLD_FORMS = {
    "accumulator-name": "the accumulator's old name hopper_fp8 in a recipe spec or an accumulation label",
    "p_flushed-per-head": "a zyfa impact row's p_flushed_mean without p_flushed_checked",
}
# Keys whose values are history, never migrated: the command lines a run was started with, its provenance and the
# migrations' own notes.
HISTORY_KEYS = ("provenance", "argv", "command", "migrated")


def _old_accumulator(value, key: str | None = None) -> bool:
    """Whether an old accumulator name is in ``value`` (strings inside dicts and lists; history keys skipped)."""
    if key in HISTORY_KEYS:
        return False
    if isinstance(value, str):
        return names_old_accumulator(value) or (key == "accumulation" and value.startswith(
            tuple(ACCUMULATOR_ALIASES)))
    if isinstance(value, dict):
        return any(_old_accumulator(v, k) for k, v in value.items())
    if isinstance(value, list):
        return any(_old_accumulator(v, key) for v in value)
    return False


def unmigrated_form(row) -> str | None:
    """The name (a key of :data:`OLD_FORMS`) of the older form ``row`` is in, or None for a current row."""
    if not isinstance(row, dict):
        return None
    if _old_accumulator(row):
        return "accumulator-name"
    if (row.get("kind") in IMPACT_KINDS and _is_num(row.get("p_flushed_mean")) and not row.get("p_flushed_checked")
            and "p_flushed_mean_raw" not in row):
        return "p_flushed-per-head"
    return None


def check_migrated(row, where: str) -> dict:
    """``row`` if it is in the current form, else SchemaError in one line naming the form and the migration."""
    form = unmigrated_form(row)
    if form is not None:
        raise SchemaError(f"{where}: a row written before a schema change ({form}: {OLD_FORMS[form]}); migrate the "
                          f"file once with `{MIGRATE_COMMAND}`")
    return row


def read_rows(path: str | Path, partial: bool | None = None) -> tuple[list[dict], dict]:
    """(rows, provenance) of a result file (``partial``: a run's line log, by default a name ending ``.partial``),
    every line checked by its schema: SchemaError or ValueError ``path:line: field: problem``. The schema of a
    line follows the file's provenance (a cliff sweep's) and the row's ``kind``."""
    path = Path(path)
    partial = path.name.endswith(".partial") if partial is None else partial
    state = {"cliffs": False}

    def on_provenance(prov, where):
        check_provenance(prov, where)
        state["cliffs"] = prov.get("record_kind") == "cliffs"

    def check(row, where):
        return check_any_row(row, where, cliffs=state["cliffs"])

    if partial:
        return read_log(path, check, on_provenance=on_provenance)
    return read_jsonl(path, check, on_provenance=on_provenance)


def mixed_code_notice(provs: Iterable[dict]) -> str | None:
    """A sentence when the rows of several runs rendered together come from several git commits, or one of them
    from a modified tree (a ``git_dirty`` run, or a commit ending ``+dirty``), else None. Every segment of a
    resumed run counts as a run (:func:`zyfa.accuracy.io.results_io.run_provenances`): a file resumed at another
    commit is mixed code. One run alone needs no notice: its provenance table says what it ran."""
    provs = [seg for p in provs if p for seg in run_provenances(p)]
    commits = list(dict.fromkeys(str(p["git_commit"]).removesuffix("+dirty") for p in provs
                                 if p.get("git_commit")))
    dirty = sum(1 for p in provs if p.get("git_dirty") is True or str(p.get("git_commit") or "").endswith("+dirty"))
    parts = []
    if len(commits) > 1:
        parts.append(f"rows of {len(commits)} git commits ({', '.join(commits)}) are combined")
    if dirty and len(provs) > 1:
        parts.append(f"{dirty} of the {len(provs)} runs combined had uncommitted changes (a dirty tree), so their "
                     "code is not exactly any commit's")
    if not parts:
        return None
    return "Notice: " + "; ".join(parts) + ". Differences between rows may come from the code, not the kernels."
