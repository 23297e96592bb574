"""Result files without torch: reading and checking JSONL rows, and the resumable, row-by-row writer.

The report generator reads results and never runs kernels, so nothing here imports torch.

Exposed:
    read_jsonl(path) -> (rows, provenance)        rows checked: a foreign file fails with path:line; the
                                                  provenance is the file's last provenance record (its latest run)
    run_provenances(prov) -> [dict]               every run segment of a file, oldest first (below)
    set_earlier_runs(prov, earlier) -> prov       records the earlier segments in ``prov`` (the harness's writer)
    merge_run_provenances(provs) -> dict          one provenance for several logs of one run (a sharded run's files)
    check_row(row, where)                         the same check for one row (CSV readers use it): types, and
                                                  metrics in range (no negative or infinite error)
    loads_checked(text, where)                    json.loads with a depth limit, every error naming where
    row_key(row, across_runs=False) -> tuple      a row's identity (operator and model-impact rows): what a
                                                  resumed run skips and a report counts once
    jsonl_text(rows, provenance) -> str           a JSONL result file's text
    ResultsFile                                   ``--out`` of a run: refuse / force / resume, rows appended to
                                                  ``<out>.partial`` as they finish, the file written atomically
    write_results(rows, path, provenance=None)    .jsonl (provenance header record) or .csv (+ sidecar), atomic
    read_results(path) -> ResultRows              rows checked (a foreign file fails naming path and line)
    ResultRows                                    a list of flat dict rows with ``.provenance`` and ``.run_id``

Run segments: a run continued with ``--resume`` (maybe days later, on another machine, at another commit) is a
chain of segments, each with its own ``run_id``, which the rows it makes carry. A file's provenance record is its
latest segment's, listing the earlier segments' records (own run_id, commit, device, date...) under
``earlier_runs``, oldest first, never nested: :func:`run_provenances` reads that key, :func:`set_earlier_runs`
writes it (:meth:`ResultsFile.start`). A resumed segment's provenance line goes into the partial with its first row:
a resume that makes no row adds no segment.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from zyfa.outputs import AppendLog, OutputError, RunLock, atomic_write_text, check_writable, partial_path

__all__ = ["ACROSS_RUNS_IDENTITY", "IMPACT_IDENTITY", "IMPACT_KINDS", "MAX_JSON_DEPTH", "RUN_IDENTITY", "ResultRows",
           "ResultsFile", "check_row", "json_depth", "jsonl_text", "loads_checked", "merge_run_provenances",
           "read_jsonl", "read_log", "read_results", "row_key", "run_provenances", "set_earlier_runs",
           "write_results"]

# Row keys of numbers (or null) in an operator result row: error metrics are prefixed with these.
_METRIC_PREFIXES = ("deq_", "orig_")
# Bytes per result row (about 1.5 KB in practice) used to estimate the free space a run needs.
ROW_BYTES_ESTIMATE = 4096
# The provenance key listing a file's earlier run segments (read by run_provenances, written by set_earlier_runs).
_EARLIER = "earlier_runs"
# Deepest nesting of [ and { a result line may have (rows are flat: per-head lists are depth 2): deeper lines
# are refused before parsing, so no line can make the JSON reader recurse without bound.
MAX_JSON_DEPTH = 32


def json_depth(text: str) -> int:
    """The deepest nesting of JSON arrays and objects in ``text`` (brackets inside strings not counted)."""
    depth = deepest = 0
    in_str = esc = False
    for c in text:
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def loads_checked(text: str, where: str):
    """``json.loads`` with the errors of a hostile line named by ``where`` (``path:line``): not JSON, nested
    deeper than :data:`MAX_JSON_DEPTH`, or a number Python will not convert (an integer of more than 4300
    digits). ValueError, never RecursionError."""
    if (text.count("[") + text.count("{") > MAX_JSON_DEPTH) and json_depth(text) > MAX_JSON_DEPTH:
        raise ValueError(f"{where}: nested deeper than {MAX_JSON_DEPTH} levels; not a result row")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON ({e.msg})") from None
    except (ValueError, RecursionError) as e:
        msg = str(e).split(";")[0].strip() or type(e).__name__
        raise ValueError(f"{where}: not JSON ({msg})") from None


def _metric_problem(key: str, v) -> str | None:
    """Why the number ``v`` cannot be the metric ``key`` (``deq_``/``orig_`` + a metric), or None. NaN is allowed
    (an overflowed output's metrics are NaN, flagged by ``has_nan``); an error is finite and not negative;
    a cosine lies in [-1, 1]; an SQNR in dB may be any number but NaN aside it must not be -inf."""
    if isinstance(v, float) and math.isnan(v):
        return None
    name = key.split("_", 1)[1]
    if name.startswith("sqnr_db"):
        return "must be a number in dB above -Infinity" if v == -math.inf else None
    if name.startswith("cosine"):
        return None if -1.0 - 1e-6 <= v <= 1.0 + 1e-6 else "must lie in [-1, 1]"
    if not math.isfinite(v):
        return "must be a finite number (or NaN for an overflowed output)"
    if v < 0:
        return "is an error, which cannot be negative"
    return None


def check_row(row, where: str) -> dict:
    """ValueError naming ``where`` (``path:line``) unless ``row`` looks like a result row of ``zyfa accuracy``:
    a JSON object with a string ``recipe`` and ``input``, and numbers (or null) for every ``deq_*``/``orig_*``
    metric."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object (a result row), got a {type(row).__name__}")
    for key in ("recipe", "input"):
        if key not in row:
            raise ValueError(f"{where}: not a zyfa accuracy result row (no {key!r} key)")
        if key == "recipe" and row[key] is None and isinstance(row.get("implementation"), str):
            continue  # a real implementation paired with no recipe
        if not isinstance(row[key], str):
            raise ValueError(f"{where}: {key!r} must be a string, got {type(row[key]).__name__}")
    for k, v in row.items():
        if not isinstance(k, str):
            raise ValueError(f"{where}: more cells than columns")
        if isinstance(v, list) and k.endswith("_heads"):  # per-head values (zyfa study): numbers or null
            v = next((x for x in v if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float)))),
                     None)
        if k.startswith(_METRIC_PREFIXES) and v is not None and (isinstance(v, bool)
                                                                 or not isinstance(v, (int, float))):
            raise ValueError(f"{where}: metric {k!r} must be a number, got {v!r}")
        if k.startswith(_METRIC_PREFIXES):
            for x in (row[k] if isinstance(row[k], list) else [row[k]]):
                why = _metric_problem(k, x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None
                if why is not None:
                    raise ValueError(f"{where}: metric {k!r} {why}, got {x!r}")
    if "has_nan" in row and not isinstance(row["has_nan"], bool):
        raise ValueError(f"{where}: 'has_nan' must be true or false, got {row['has_nan']!r}")
    return row


def run_provenances(prov: dict | None) -> list[dict]:
    """Every run segment's provenance of a file whose provenance record is ``prov``: the earlier segments it lists
    (``earlier_runs``, oldest first), then ``prov`` itself; each without that key. [] for no provenance. The one
    reader of ``earlier_runs``: a reader that attributes rows (run ids, commits, devices) goes through it."""
    if not isinstance(prov, dict) or not prov:
        return []
    earlier = prov.get(_EARLIER)
    segments = [e for e in (earlier if isinstance(earlier, list) else []) if isinstance(e, dict)]
    return [{k: v for k, v in p.items() if k != _EARLIER} for p in (*segments, prov)]


def set_earlier_runs(provenance: dict, earlier: Sequence[dict]) -> dict:
    """Record ``earlier`` (the segments a resumed run continues, oldest first: :func:`run_provenances` of the
    provenance it resumed) in ``provenance``, in place (no key for a fresh run); returns it. Each is stored without
    its own list, so the chain never nests."""
    runs = [{k: v for k, v in p.items() if k != _EARLIER} for p in earlier if p]
    if runs:
        provenance[_EARLIER] = runs
    else:
        provenance.pop(_EARLIER, None)
    return provenance


def merge_run_provenances(provs: Iterable[dict]) -> dict:
    """One provenance for several logs of one run (the rank files of a sharded run, a single-process partial moved
    in, a finished file being continued): every segment they name, each once (by ``run_id``; a record without one
    by its content; the first seen wins, so rank 0's view of a shared segment), ordered by ``date_utc`` (the
    segment's start; stable); the latest with the others as its earlier runs. {} when none has a provenance."""
    by_key: dict = {}
    for seg in (seg for prov in provs for seg in run_provenances(prov)):
        by_key.setdefault(seg.get("run_id") or json.dumps(seg, sort_keys=True, default=str), seg)
    segments = sorted(by_key.values(), key=lambda seg: str(seg.get("date_utc") or ""))
    return set_earlier_runs(dict(segments[-1]), segments[:-1]) if segments else {}


def parse_lines(lines: Iterable[str], path, check: Callable[[object, str], dict] | None = None,
                on_provenance: Callable[[dict, str], object] | None = None) -> tuple[list[dict], dict]:
    """(rows, provenance) of JSONL lines: each ``{"record": "provenance"}`` line is passed to
    ``on_provenance(prov, "path:line")`` (e.g. a schema's check) where it stands, and the LAST one is the
    provenance returned (a resumed run's log holds one per segment, the latest listing the earlier ones:
    :func:`run_provenances`); each other line is a row checked by ``check(obj, "path:line")`` (default
    :func:`check_row`, a ``zyfa accuracy`` row)."""
    check = check or check_row
    rows, prov = [], {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        obj = loads_checked(line, f"{path}:{n}")
        if isinstance(obj, dict) and obj.get("record") == "provenance":
            prov = {k: v for k, v in obj.items() if k != "record"}
            if on_provenance is not None:
                on_provenance(prov, f"{path}:{n}")
        else:
            rows.append(check(obj, f"{path}:{n}"))
    return rows, prov


def read_log(path: str | Path, check: Callable[[object, str], dict] | None = None,
             on_provenance: Callable[[dict, str], object] | None = None) -> tuple[list[dict], dict]:
    """(rows, provenance) of a run's line log (``<out>.partial`` or a rank file): complete lines only (a last
    line cut short by a kill is left out), each checked as :func:`parse_lines` does; the provenance is the log's
    last provenance record (the segment that wrote last, listing the earlier ones). A damaged log (bytes that
    are not UTF-8, a line that is not JSON, nested too deep, or not a row) raises ValueError ``path:line: what``."""
    data = Path(path).read_bytes()
    lines = data[:data.rfind(b"\n") + 1].split(b"\n")[:-1]
    text = []
    for n, raw in enumerate(lines, 1):
        try:
            text.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}:{n}: not UTF-8 text (byte {e.start + 1} of the line); not a result row") from None
    return parse_lines(text, path, check, on_provenance)


def read_jsonl(path: str | Path, check: Callable[[object, str], dict] | None = None,
               on_provenance: Callable[[dict, str], object] | None = None) -> tuple[list[dict], dict]:
    """(rows, provenance) of a JSONL result file: its last ``{"record": "provenance"}`` line is the provenance (a
    finished file has one, its latest segment's, listing the earlier ones: :func:`run_provenances`).

    Raises ValueError ``path:line: ...`` for a line that is not JSON or not a result row (``check`` and
    ``on_provenance`` as for :func:`parse_lines`)."""
    try:
        with open(path, encoding="utf-8") as f:
            return parse_lines(f, path, check, on_provenance)
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file (not UTF-8)") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory, not a result file") from None


# A result row's identity, the one definition: two rows equal on it are one measurement made twice (a resumed run
# skips it, a report keeps the later one).
# Operator rows (zyfa accuracy, study, cliffs, longctx): inside one run the input (name and content hash), the recipe
# and the implementation (None for a recipe's emulation) decide a row: what a resumed or sharded run plans and skips.
# Across runs (files from different machines, which a report merges) the platform emulated and the emulation a real
# kernel was paired with separate it too; inside one run they follow from the other four.
RUN_IDENTITY = ("input", "input_content_hash", "recipe", "implementation")
ACROSS_RUNS_IDENTITY = (*RUN_IDENTITY, "platform", "paired_spec")
# Model-impact rows (``kind`` one of IMPACT_KINDS, accuracy.impact): the model, recipe, window, swapped layer (None:
# all layers), token count and text.
IMPACT_KINDS = ("impact_window", "impact_layer")
IMPACT_IDENTITY = ("kind", "model", "recipe", "window", "layer", "n_tokens", "text")


def row_key(row: dict, *, across_runs: bool = False) -> tuple:
    """The identity of a result row (see :data:`RUN_IDENTITY` and the comments above it): its values of
    :data:`IMPACT_IDENTITY` for a model-impact row, else of :data:`RUN_IDENTITY`, or of
    :data:`ACROSS_RUNS_IDENTITY` with ``across_runs`` (merging files of different runs)."""
    if row.get("kind") in IMPACT_KINDS:
        fields = IMPACT_IDENTITY
    else:
        fields = ACROSS_RUNS_IDENTITY if across_runs else RUN_IDENTITY
    return tuple(row.get(f) for f in fields)


class ResultsFile:
    """The ``--out`` file of a run: checked before the run, rows kept as they finish, finished atomically.

    Rows go, one fsync'd line each, into ``<out>.partial`` (first line: the provenance record); :meth:`finish`
    writes ``<out>`` (JSONL, or CSV through ``write``) by a temporary file and a rename, then removes the partial.
    A killed run leaves its rows in ``<out>.partial`` and the previous ``<out>``, if any, untouched.

    A resumed run is a new segment (the module's "Run segments"): its own ``run_id`` (minted by the caller), its
    provenance listing the earlier segments (set by :meth:`start` and :meth:`finish`), its provenance line written
    before its first row. :attr:`provenance` is what it resumed (the partial's last record, or the finished
    file's); :attr:`earlier` its segments, oldest first.

    One live run per output: :meth:`open` takes a :class:`zyfa.outputs.RunLock` (``fcntl.flock`` on
    ``<out>.partial.lock``) before it looks at the files and holds it until :meth:`finish` or :meth:`close` (or
    the process's end). While another process holds it, the run is refused, ``--force`` or not, naming its PID
    and start time; so a ``<out>.partial`` is an interrupted run only when no live process is writing it.

    Policy, decided by :meth:`open` before any work:
        - ``<out>`` or ``<out>.partial`` exists, neither ``force`` nor ``resume``: refused (OutputError);
        - ``force``: start over (the old ``<out>`` is replaced only when the new run finishes);
        - ``resume``: rows of ``<out>.partial`` (else ``<out>``) are kept; the run skips their keys (:attr:`done`).
    """

    def __init__(self, path: Path, *, kept: list[dict], provenance: dict, resumed_from: Path | None,
                 reader: Callable[[Path], tuple[list[dict], dict]], lock: RunLock | None = None,
                 key: Callable[[dict], tuple] = row_key, dumps: Callable[[dict], str] = json.dumps):
        self.lock = lock
        self.key, self.dumps = key, dumps
        self.path = path
        self.partial = partial_path(path)
        self.kept = kept
        self.provenance = provenance
        self.resumed_from = resumed_from
        self.earlier = run_provenances(provenance) if resumed_from is not None else []
        self.done = {key(r) for r in kept}
        self._new: list[dict] = []
        self._log: AppendLog | None = None
        self._segment: dict | None = None  # this segment's provenance, from start()
        self._reader = reader

    @classmethod
    def open(cls, path: str | Path, *, force: bool = False, resume: bool = False, n_rows: int = 0,
             reader: Callable[[Path], tuple[list[dict], dict]] | None = None, flag: str = "--out",
             lock: bool = True, key: Callable[[dict], tuple] = row_key,
             check: Callable[[object, str], dict] | None = None,
             dumps: Callable[[dict], str] = json.dumps) -> ResultsFile:
        """Check ``path`` (writable, room for ``n_rows``, no live run on it, the refuse/force/resume policy) and
        load the rows a resumed run keeps. ``reader`` reads a finished ``path`` (default :func:`read_jsonl`);
        ``lock=False``: the caller holds a lock covering ``path`` (a study's folder). Rows that are not ``zyfa
        accuracy`` rows (``zyfa impact``) come with their ``key``, ``check`` and ``dumps``, as for ShardedResults."""
        path = Path(path)
        if force and resume:
            raise OutputError("--force and --resume exclude each other")
        reader = reader or read_jsonl
        partial = partial_path(path)
        check_writable(path, need_bytes=n_rows * ROW_BYTES_ESTIMATE)
        if partial.is_dir():
            raise OutputError(f"{partial} is a directory; remove it or choose another {flag}")
        run_lock = RunLock.acquire(partial, what=str(path)) if lock else None
        try:
            return cls._open_locked(path, partial, force=force, resume=resume, reader=reader, flag=flag,
                                    run_lock=run_lock, key=key, check=check, dumps=dumps)
        except BaseException:
            if run_lock is not None:
                run_lock.release()
            raise

    @classmethod
    def _open_locked(cls, path: Path, partial: Path, *, force: bool, resume: bool, reader, flag: str,
                     run_lock: RunLock | None, key, check, dumps) -> ResultsFile:
        exists = [p for p in (path, partial) if p.is_file()]
        if exists and not (force or resume):
            if partial.is_file():
                dead = run_lock.stale if run_lock is not None else None
                gone = (f" (its run, PID {dead['pid']}, started {dead.get('started')}, is no longer running)"
                        if dead and "pid" in dead else " (no running process holds it)")
                what = f"an interrupted run's rows are in {partial}{gone}"
            else:
                what = f"{path} exists"
            raise OutputError(f"{what}: add --resume to continue it, --force to start over, "
                              f"or choose another {flag}")
        kept, prov, source = [], {}, None
        if resume and exists:
            source = partial if partial.is_file() else path
            try:
                kept, prov = read_log(partial, check) if source == partial else reader(path)
            except ValueError as e:  # a damaged file: one line naming file and line, nothing written
                raise OutputError(f"cannot resume: {e}; repair or remove it, or use --force") from None
            if not prov:
                raise OutputError(f"{source} has no provenance record, so it is not a run to resume; "
                                  f"use --force to replace it or choose another {flag}")
        return cls(path, kept=list(kept), provenance=dict(prov), resumed_from=source, reader=reader, lock=run_lock,
                   key=key, dumps=dumps)

    @property
    def made(self) -> list[dict]:
        """The rows this run added, in the order it made them."""
        return list(self._new)

    @property
    def skip(self) -> set:
        """The planned rows this run does not make: those done before (a rank's view skips other ranks' too)."""
        return self.done

    @property
    def run_id(self) -> str | None:
        """None: each segment has its own id, made by its runner (:attr:`earlier` names the earlier ones)."""
        return None

    def check_plan(self, keys: Sequence[tuple]) -> None:
        """Refuse to resume a file that holds rows the planned run would not make (another run's rows)."""
        planned = set(keys)
        foreign = [k for k in (self.key(r) for r in self.kept) if k not in planned]
        if foreign:
            name, _, recipe, *_ = foreign[0]
            raise OutputError(f"{self.resumed_from} holds rows this run would not make ({len(foreign)}, e.g. "
                              f"input {name!r} recipe {recipe!r}): resume it with the same arguments, or use "
                              "--force or another --out")

    def start(self, provenance: dict) -> None:
        """Begin this segment: its ``provenance`` line opens ``<out>.partial`` (a fresh run's, at once) or is
        appended with a resumed segment's first row (:meth:`add`; after a finished file's rows when that is what
        is resumed), so a resume that makes no row leaves no trace. A resumed run's ``provenance`` gets
        ``earlier_runs`` in place (:func:`set_earlier_runs`): pass the same dict to :meth:`finish`."""
        if self.earlier:
            set_earlier_runs(provenance, self.earlier)
        self._segment = provenance
        if self.resumed_from is None:
            self._open_log()

    def _open_log(self) -> AppendLog:
        if self._log is None:
            if self._segment is None:
                raise RuntimeError("ResultsFile.start() first")
            continued = self.resumed_from == self.partial
            self._log = AppendLog(self.partial, fresh=not continued)
            self._log.write_line(self.dumps({"record": "provenance", **self._segment}))
            if not continued:
                for row in self.kept:  # resuming a finished file: its rows first
                    self._log.write_line(self.dumps(row))
        return self._log

    def add(self, row: dict) -> None:
        """Append one finished row (fsync'd before returning)."""
        self._open_log().write_line(self.dumps(row))
        self._new.append(row)

    def unplanned(self, keys: Sequence[tuple]) -> list[dict]:
        """The kept rows a run planning ``keys`` does not make (a resume asking for less than the file holds)."""
        planned = set(keys)
        return [r for r in self.kept if self.key(r) not in planned]

    def rows_in_order(self, keys: Sequence[tuple]) -> list[dict]:
        """Kept and new rows in the planned order (``keys``: row keys in the order an uninterrupted run makes
        them), so a resumed file equals an uninterrupted one; then the kept rows this run did not plan, in their
        file's order (a resume that asks for less never deletes rows; :meth:`check_plan` refuses it instead for a
        command that wants one run per file)."""
        by = {self.key(r): r for r in self.kept}
        by.update({self.key(r): r for r in self._new})
        missing = [k for k in keys if k not in by]
        if missing:
            raise RuntimeError(f"{len(missing)} planned rows were not made, e.g. {missing[0]}")
        return [by[k] for k in keys] + self.unplanned(keys)

    def finish(self, rows: Sequence[dict], provenance: dict,
               write: Callable[[Sequence[dict], Path, dict], object]) -> Path:
        """Write the finished file atomically (``write(rows, path, provenance)``), then drop the partial. A resumed
        run's ``provenance`` lists the earlier segments (set in place, as :meth:`start` does); a finished file
        resumed with nothing left to make is left as it is."""
        self._close_log()
        if self.resumed_from == self.path and not self._new and list(rows) == self.kept:
            self.release()
            return self.path
        if self.earlier:
            set_earlier_runs(provenance, self.earlier)
        write(rows, self.path, provenance)
        with contextlib.suppress(FileNotFoundError):
            self.partial.unlink()
        self.release()
        return self.path

    def close(self) -> None:
        """Stop writing (a run that ends without finishing): the partial file stays, the lock is dropped."""
        self._close_log()
        self.release()

    def release(self) -> None:
        """Drop the run's lock on the output (idempotent)."""
        if self.lock is not None:
            self.lock.release()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def jsonl_text(rows: Sequence[dict], provenance: dict) -> str:
    """A JSONL result file's text: the provenance record, then one row per line."""
    lines = [json.dumps({"record": "provenance", **provenance})] + [json.dumps(r) for r in rows]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- result files

class ResultRows(list):
    """Result rows (flat dicts) plus the run's provenance record."""

    def __init__(self, rows: Iterable[dict] = (), provenance: dict | None = None):
        super().__init__(rows)
        self.provenance: dict = dict(provenance or {})

    @property
    def run_id(self) -> str | None:
        return self.provenance.get("run_id")


def _sidecar(path: Path) -> Path:
    return path.with_suffix(".provenance.json")


def write_results(rows: Sequence[dict], path: str | Path, provenance: dict | None = None) -> Path:
    """Write rows as JSONL (first line: ``{"record": "provenance", ...}``) or CSV (+ ``.provenance.json``).

    Each file is written atomically (a temporary file, then a rename): an interrupted write leaves the previous
    file. Floats are written as numbers (JSON: non-finite ones as ``NaN``/``Infinity``, which Python's json and
    pandas read; CSV: ``nan``/``inf``). The CSV sidecar also records each column's type so that
    :func:`read_results` restores them exactly.
    """
    path = Path(path)
    prov = provenance if provenance is not None else getattr(rows, "provenance", {})
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".csv"):
        raise ValueError(f"result file must end in .jsonl or .csv, got {path.name!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".jsonl":
        atomic_write_text(path, jsonl_text(rows, prov))
        return path
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    types = {c: _column_type([row.get(c) for row in rows]) for c in columns}
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(columns)
    for row in rows:
        w.writerow([_cell(row.get(c)) for c in columns])
    atomic_write_text(_sidecar(path), json.dumps({"provenance": prov, "columns": types}, indent=1) + "\n")
    atomic_write_text(path, buf.getvalue())
    return path


def _column_type(values: list) -> str:
    kinds = {type(v) for v in values if v is not None}
    if not kinds:
        return "str"
    if kinds == {bool}:
        return "bool"
    if kinds == {int}:
        return "int"
    if kinds <= {int, float}:
        return "float"
    if kinds == {str}:
        return "str"
    return "json"


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)  # shortest round-trip form; nan, inf, -inf
    if isinstance(v, (int, str)):
        return str(v)
    return json.dumps(v)


def _parse(cell: str, kind: str | None):
    if kind == "str":
        return cell if cell != "" else None
    if cell == "":
        return None
    if kind == "bool":
        return cell.lower() == "true"
    if kind == "int":
        return int(cell)
    if kind == "float":
        return float(cell)
    if kind == "json":
        try:
            return loads_checked(cell, "cell")
        except ValueError:
            return cell
    # no sidecar: best guess
    if cell.lower() in ("true", "false"):
        return cell.lower() == "true"
    for conv in (int, float):
        try:
            return conv(cell)
        except ValueError:
            pass
    return cell


def read_results(path: str | Path) -> ResultRows:
    """Rows and provenance from a file written by :func:`write_results`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"result file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return ResultRows(*read_jsonl(path))
    if suffix == ".csv":
        side = _sidecar(path)
        try:
            meta = loads_checked(side.read_text(), str(side)) if side.is_file() else {}
        except (ValueError, UnicodeDecodeError):
            raise ValueError(f"{side}: not JSON (the sidecar of {path.name})") from None
        if not isinstance(meta, dict):
            raise ValueError(f"{side}: not a provenance sidecar (expected a JSON object)")
        types = meta.get("columns", {})
        try:
            with open(path, newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                rows = []
                for n, r in enumerate(reader, 2):
                    if None in r or None in r.values():
                        raise ValueError(f"{path}:{n}: {'more' if None in r else 'fewer'} cells than columns")
                    try:
                        parsed = {k: _parse(v, types.get(k)) for k, v in r.items()}
                    except (ValueError, RecursionError) as e:
                        raise ValueError(f"{path}:{n}: a cell that is not what its column holds "
                                         f"({str(e).split(';')[0][:200]})") from None
                    rows.append(check_row(parsed, f"{path}:{n}"))
        except (UnicodeDecodeError, csv.Error) as e:
            raise ValueError(f"{path}: not a result CSV ({e})") from None
        return ResultRows(rows, meta.get("provenance", {}))
    raise ValueError(f"result file must end in .jsonl or .csv, got {path.name!r}")
