"""Rewrite committed result files into the current row schema, once, so that no reader repairs old rows as it reads.

Each migration turns one older form (:data:`zyfa.accuracy.io.schemas.OLD_FORMS`, whose readers refuse it) into the
current one and says so in the row: a ``"migrated"`` field lists what was changed (``; ``-joined when several), so
the history stays visible in the file.

    accumulator-name     ``accumulator=hopper_fp8`` in a recipe spec (``recipe``, ``paired_spec``,
                         ``implementation``, ``recipe_short``, any other string of the row) and a long-context
                         ``accumulation`` label starting ``hopper_fp8`` are renamed ``matrix_unit``, the name the
                         grammar writes today (the old one meant "sums stay in the matrix unit" on every platform).
                         Provenance and command lines are history and keep what was typed.
    p_flushed-per-head   ``zyfa impact`` rows without ``p_flushed_checked``: until commit 2f53d66 the emulator counted
                         the unmasked probabilities once per (batch, head) too few, so a row written by a process
                         started before it holds ``p_flushed_mean`` inflated by batch x query heads (batch 1 here).
                         Such a row is divided by its provenance's ``num_q_heads`` (``p_flushed_mean_raw`` keeps the
                         value read, ``p_flushed_mean_note`` says why; without a head count, or still above 1, the
                         value becomes NaN); every other such row is marked ``p_flushed_checked``. A process is
                         the rows of one file with one ``run_started_utc`` (else one command line); its start is that
                         field, else bounded from above by its earliest row (date less the row's seconds).
    bench-peer-names     a bench file's rows naming SDPA's backends ``sdpa-cudnn``/``sdpa-flash`` get today's names
                         (``sdpa-bf16:cudnn``/``sdpa-bf16:flash``, zyfa.peers.names.OLD_NAMES).

Files: every ``*.jsonl`` (also ``.partial`` and ``.dropped``) and every bench ``*.json`` (``{"meta", "rows"}``) under
the given folders (default ``reports`` and ``tests``). Each changed file is written atomically (a temporary file
renamed over it); a second run changes nothing. Per file it prints the rows changed by each migration.

Usage: python scripts/migrate_rows.py [FOLDER_OR_FILE ...] [--check]   (--check: report, write nothing; exit 1 if
any file would change)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from zyfa.accuracy.impact.rows import process_key, process_starts, row_date  # noqa: E402
from zyfa.accuracy.io.results_io import IMPACT_KINDS  # noqa: E402
from zyfa.accuracy.io.schemas import HISTORY_KEYS  # noqa: E402

from zyfa.outputs import atomic_write_text  # noqa: E402
from zyfa.peers.names import OLD_NAMES  # noqa: E402
from zyfa.recipes import ACCUMULATOR_ALIASES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# The emulator fix that made p_flushed_frac a fraction (commit 2f53d66, "Emulator: p_flushed_frac counts the mask once
# per batch-head"), and the date after which no inflated row was committed (the last such rows are in 6df17ed): a
# later process with the same command line is never divided. A process keeps the code it started with, so what
# counts is when the writing process started, not the commit in a row. Checked against re-measurements after the
# fix: old value / heads equals the new one (window 0 of SmolLM2 and Qwen: ck, aiter and zyfa-exp2 agree to 6
# digits, e.g. SmolLM2 aiter 0.797723).
P_FLUSHED_FIX = ("2f53d66", "2026-11-29T23:54:38Z")
P_FLUSHED_LAST_INFLATED_UTC = "2026-11-30T00:10:00Z"


def add_note(row: dict, what: str) -> None:
    """Record in ``row["migrated"]`` that ``what`` was changed (once)."""
    notes = [n for n in str(row.get("migrated") or "").split("; ") if n]
    if what not in notes:
        row["migrated"] = "; ".join([*notes, what])


def _renamed(value, key=None):
    """``value`` with old accumulator names replaced (strings in dicts and lists; history keys kept)."""
    if key in HISTORY_KEYS:
        return value
    if isinstance(value, str):
        for old, new in ACCUMULATOR_ALIASES.items():
            value = value.replace(f"accumulator={old}", f"accumulator={new}")
            if key == "accumulation" and value.startswith(old):
                value = new + value[len(old):]
        return value
    if isinstance(value, dict):
        return {k: _renamed(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed(v, key) for v in value]
    return value


def rename_accumulator(row: dict) -> bool:
    """accumulator-name, in place; True if the row changed."""
    new = _renamed(row)
    if json.dumps(new) == json.dumps(row):  # (not ==: NaN is not equal to itself)
        return False
    row.clear()
    row.update(new)
    add_note(row, "accumulator hopper_fp8 renamed matrix_unit")
    return True


def fix_p_flushed(rows: list[dict]) -> int:
    """p_flushed-per-head over the rows of one file, in place; returns how many rows changed."""
    impact = [r for r in rows if isinstance(r, dict) and r.get("kind") in IMPACT_KINDS]
    starts = process_starts(impact)
    n = 0
    for r in impact:
        v = r.get("p_flushed_mean")
        if (not isinstance(v, (int, float)) or isinstance(v, bool) or r.get("p_flushed_checked")
                or "p_flushed_mean_raw" in r):
            continue
        pre = starts.get(process_key(r), "9") < P_FLUSHED_FIX[1] and row_date(r) < P_FLUSHED_LAST_INFLATED_UTC
        if pre and v > 0:
            heads = (r.get("provenance") or {}).get("num_q_heads")
            r["p_flushed_mean_raw"] = v
            if isinstance(heads, int) and heads > 0 and v / heads <= 1:
                r["p_flushed_mean"] = v / heads
                r["p_flushed_mean_note"] = (f"divided by batch x query heads = 1 x {heads}: written by a process "
                                            f"started before commit {P_FLUSHED_FIX[0]}")
            else:
                r["p_flushed_mean"] = math.nan
                r["p_flushed_mean_note"] = ("written by a process started before commit "
                                            f"{P_FLUSHED_FIX[0]}, and no head count makes it a fraction: NaN")
            add_note(r, f"p_flushed_mean per head (pre-{P_FLUSHED_FIX[0]})")
        elif pre:  # 0 counted either way is 0
            r["p_flushed_checked"] = True
            add_note(r, f"p_flushed_checked: 0, a fraction however counted (pre-{P_FLUSHED_FIX[0]})")
        elif v > 1:
            r["p_flushed_mean_raw"] = v
            r["p_flushed_mean"] = math.nan
            r["p_flushed_mean_note"] = "not a fraction (> 1): NaN"
            add_note(r, "p_flushed_mean not a fraction: NaN")
        else:
            r["p_flushed_checked"] = True
            add_note(r, f"p_flushed_checked: written by a process started after {P_FLUSHED_FIX[0]}")
        n += 1
    return n


def rename_bench_peers(row: dict) -> bool:
    """bench-peer-names, in place; True if the row changed."""
    if row.get("impl") in OLD_NAMES:
        row["impl"] = OLD_NAMES[row["impl"]]
        add_note(row, "peer renamed (" + ", ".join(f"{a} -> {b}" for a, b in OLD_NAMES.items()) + ")")
        return True
    return False


def migrate_rows(rows: list, *, bench: bool = False) -> Counter:
    """Every migration over one file's rows (dicts; provenance records and other lines untouched), in place;
    returns rows changed per migration."""
    changed: Counter = Counter()
    data = [r for r in rows if isinstance(r, dict) and r.get("record") != "provenance"]
    for r in data:
        if rename_accumulator(r):
            changed["accumulator-name"] += 1
        if bench and rename_bench_peers(r):
            changed["bench-peer-names"] += 1
    n = fix_p_flushed(data)
    if n:
        changed["p_flushed-per-head"] = n
    return changed


def _dump(obj) -> str:
    return json.dumps(obj)


def migrate_jsonl(path: Path, write: bool) -> Counter:
    """One JSONL file: lines that are not JSON objects (a killed run's partial last line) are kept as they are."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    parsed = []
    for line in lines:
        try:
            obj = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            obj = None
        parsed.append(obj if isinstance(obj, dict) else None)
    before = [json.dumps(o, sort_keys=True) if o is not None else None for o in parsed]
    changed = migrate_rows([o for o in parsed if o is not None])
    if changed and write:
        out = []
        for line, obj, old in zip(lines, parsed, before, strict=True):
            if obj is None or json.dumps(obj, sort_keys=True) == old:
                out.append(line)  # unchanged rows keep their bytes
            else:
                out.append(_dump(obj) + ("\n" if line.endswith("\n") else ""))
        atomic_write_text(path, "".join(out))
    return changed


def migrate_bench(path: Path, write: bool) -> Counter:
    """A bench JSON file (``{"meta": ..., "rows": [...]}``); other JSON files are left alone."""
    try:
        text = path.read_text(encoding="utf-8")
        doc = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return Counter()
    if not (isinstance(doc, dict) and isinstance(doc.get("rows"), list) and isinstance(doc.get("meta"), dict)):
        return Counter()
    changed = migrate_rows(doc["rows"], bench=True)
    if changed and write:
        atomic_write_text(path, json.dumps(doc, indent=1) + ("\n" if text.endswith("\n") else ""))
    return changed


def result_files(targets: list[Path]) -> list[Path]:
    out = []
    for t in targets:
        if t.is_file():
            out.append(t)
            continue
        for p in sorted(t.rglob("*")):
            if p.is_file() and ".mutation" not in p.parts and (
                    p.suffix in (".jsonl", ".json") or p.name.endswith((".jsonl.partial", ".jsonl.dropped"))):
                out.append(p)
    return out


def _shown(path: Path) -> str:
    """A path as given, relative to the working folder where it is inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*", help="folders or files (default: reports and tests)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file would change")
    a = ap.parse_args(argv)
    targets = [Path(t) for t in a.targets] or [ROOT / "reports", ROOT / "tests"]
    missing = [t for t in targets if not t.exists()]
    if missing:
        ap.exit(2, f"migrate_rows: {missing[0]}: no such file or folder\n")
    total: dict[str, int] = defaultdict(int)
    files = 0
    for path in result_files(targets):
        changed = (migrate_bench if path.suffix == ".json" else migrate_jsonl)(path, write=not a.check)
        if changed:
            files += 1
            for k, v in changed.items():
                total[k] += v
            print(f"{_shown(path)}: " + ", ".join(f"{k} {v} rows" for k, v in sorted(changed.items())))
    verb = "would change" if a.check else "changed"
    print(f"{files} files {verb}" + (": " + ", ".join(f"{k} {v} rows" for k, v in sorted(total.items()))
                                     if files else " (every row is in the current form)"))
    return 1 if a.check and files else 0


if __name__ == "__main__":
    sys.exit(main())
