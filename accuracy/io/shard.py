"""Sharded sweeps under ``torchrun``: which rank runs which cell, per-rank row files, the merge by rank 0.

A sweep is a list of independent cells, each with an estimated cost. Under ``torchrun --nproc-per-node N``
every rank makes the same list, :func:`plan` gives each rank its share, each rank writes its rows to its own
``<out>.partial/rank-K.jsonl`` (one fsync'd line per row, :class:`zyfa.outputs.AppendLog`), and after a barrier
rank 0 merges every rank file into ``<out>``: the rows a single process writes, in the same planned order.

Plan rule (deterministic): cells sorted by cost, largest first (ties: planned order), each given to the rank
with the least cost so far (ties: the lowest rank): LPT, within 4/3 of the best makespan. Cost models live with
the commands (``accuracy``: batch x query heads x s_q x s_k x (d + d_v) per row); the commands turn each cell's cost
units into the seconds ``--dry-run`` prints by :func:`zyfa.accuracy.io.cost_model.estimate_s` (a rate, and on a GPU
a fixed cost per accuracy row), and the plan balances the units.

Files and locks: rank 0 alone holds the output's :class:`zyfa.outputs.RunLock` (``<out>.partial.lock``, the lock
a single-process run takes), decides refuse / ``--force`` / ``--resume`` and broadcasts the done set (the rows
of every rank file in ``<out>.partial/``, of a single-process ``<out>.partial`` file, moved in as
``single.jsonl``, and of a finished ``<out>``); the other ranks take no lock. So ``--resume`` works across any
change of N, including N = 1 (a plain run finding ``<out>.partial/`` continues it here). A rank killed by
SIGKILL loses only its row in flight (a torn last line is cut off when its file is continued).

Run segments (as :class:`zyfa.accuracy.io.results_io.ResultsFile`): a resumed sharded run is a new segment with its
own ``run_id`` (shared by its ranks). Rank 0 gathers every segment the files name
(:func:`zyfa.accuracy.io.results_io.merge_run_provenances`) and broadcasts them; each rank's
:meth:`ShardedResults.start` lists them in its provenance (``earlier_runs``, in place) and writes that provenance line
to its rank file, first line or appended; the merged ``<out>``'s provenance is the latest segment's, listing the
earlier ones.

Exposed:
    Dist / launch(backend=None)            the process group of a torchrun launch (a 1-rank stand-in otherwise)
    plan(costs, world) -> [[cell index]]   LPT assignment, cells of a rank in planned order
    format_plan(labels, shares, seconds) -> str
    ShardedResults                         the rank files, the done set, rank 0's merge
    RankRows                               a rank's share with the ResultsFile interface run_study takes

The scaffold every sharded command (``zyfa accuracy``, ``impact``, ``longctx``, ``study``) builds on, around its
own cells and cost model:
    wants_sharding(args, out)              torchrun, --dry-run, --backend, or an interrupted sharded run at --out
    print_dry_run(n, labels, costs, seconds)  --dry-run N: the plan, printed by rank 0
    rank_device(device, dist)              this rank's GPU under torchrun with CUDA
    announce(prefix, dist, shares, what)   rank 0's line of cells per rank
    give_up(dist, error)                   after an error is reported: meet the other ranks if they share it, close
    sharding_summary(dist, rows, wall_s)   the provenance of a sharded run (ranks, backend, rows, devices, wall time)
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from zyfa.accuracy.io.results_io import (
    merge_run_provenances,
    read_log,
    row_key,
    run_provenances,
    set_earlier_runs,
    write_results,
)

from zyfa.outputs import AppendLog, OutputError, RunLock, check_writable, partial_path

__all__ = ["Dist", "RankRows", "SharedOutputError", "ShardedResults",
           "add_shard_arguments", "announce", "cells_digest", "describe_key", "dry_run_world", "format_plan",
           "give_up", "launch", "plan", "print_dry_run", "rank_device", "say", "sharded_launch", "sharding_summary",
           "wants_sharding"]

# Timeout of the process group's collectives: ranks that finish early wait at the barrier for the slowest, so it
# is long (a grid's share can take hours); a dead peer still ends the wait (torchrun also stops the others).
# ZYFA_SHARD_TIMEOUT_S overrides it.
DEFAULT_TIMEOUT_S = 24 * 3600


class SharedOutputError(OutputError):
    """An ``--out`` refusal every rank raises alike (rank 0 decided it and broadcast it): the ranks can meet at a
    barrier after reporting it (:meth:`Dist.settle`), so each rank's line is printed before torchrun stops any."""


def add_shard_arguments(parser, command: str, cells: str) -> None:
    """``--dry-run [N]`` and ``--backend`` on ``zyfa <command>``'s parser; ``cells`` names its cells."""
    g = parser.add_argument_group(f"sharding (torchrun --nproc-per-node N -m zyfa {command} ...; docs/SHARDING.md)")
    g.add_argument("--dry-run", nargs="?", type=int, const=0, default=None, metavar="N",
                   help=f"print the plan ({cells} per rank, estimated seconds) for N ranks (default: torchrun's "
                        "WORLD_SIZE, else 1) and run nothing")
    g.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                   help="process-group backend under torchrun (default: nccl with CUDA, else gloo)")


def dry_run_world(n: int) -> int:
    """The number of ranks ``--dry-run N`` plans for: N, or torchrun's WORLD_SIZE (else 1) for 0."""
    if n < 0:
        raise OutputError("--dry-run takes a number of ranks of at least 1")
    return n or int(os.environ.get("WORLD_SIZE", 1) or 1)


def say(line: str) -> None:
    """``line`` on stderr in one write, so that the lines of ranks sharing one pipe never run into each other
    (``print`` writes the text and its newline separately)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def sharded_launch() -> bool:
    """Whether this process was started by torchrun (``WORLD_SIZE`` and ``RANK`` in the environment)."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


class Dist:
    """A torchrun launch's rank, world size and collectives; world 1 without a process group otherwise."""

    def __init__(self, rank: int = 0, world: int = 1, local_rank: int = 0, backend: str | None = None):
        self.rank, self.world, self.local_rank, self.backend = rank, world, local_rank, backend

    @property
    def grouped(self) -> bool:
        return self.backend is not None

    def barrier(self) -> None:
        if self.grouped:
            # lazy: imports torch, numpy; the command's flags are checked before it
            import torch.distributed as td

            td.barrier()

    def broadcast(self, obj):
        """Rank 0's ``obj`` on every rank."""
        if not self.grouped:
            return obj
        # lazy: imports torch, numpy; the command's flags are checked before it
        import torch.distributed as td

        box = [obj if self.rank == 0 else None]
        td.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj) -> list:
        """Every rank's ``obj``, by rank, on every rank."""
        if not self.grouped:
            return [obj]
        # lazy: imports torch, numpy; the command's flags are checked before it
        import torch.distributed as td

        box: list = [None] * self.world
        td.all_gather_object(box, obj)
        return box

    def settle(self) -> None:
        """A barrier that never raises: after a :class:`SharedOutputError`, before exiting."""
        with contextlib.suppress(Exception):
            self.barrier()

    def close(self) -> None:
        if self.grouped:
            # lazy: imports torch, numpy; the command's flags are checked before it
            import torch.distributed as td

            with contextlib.suppress(Exception):
                td.destroy_process_group()
            self.backend = None


def launch(backend: str | None = None, timeout_s: float | None = None) -> Dist:
    """Join the process group of a torchrun launch: gloo on CPU, nccl (one process per GPU, ``LOCAL_RANK``'s
    device made current) when CUDA is there; ``backend`` overrides. Outside torchrun: a 1-rank :class:`Dist`."""
    if not sharded_launch():
        return Dist()
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
    except ValueError:
        raise OutputError("RANK, WORLD_SIZE and LOCAL_RANK must be integers (set by torchrun)") from None
    if timeout_s is None:
        try:
            timeout_s = float(os.environ.get("ZYFA_SHARD_TIMEOUT_S") or DEFAULT_TIMEOUT_S)
        except ValueError:
            raise OutputError("ZYFA_SHARD_TIMEOUT_S must be a number of seconds") from None
    # lazy: imports torch, numpy; the command's flags are checked before it
    import torch
    import torch.distributed as td

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and td.is_nccl_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise OutputError(f"--backend must be gloo or nccl, got {backend!r}")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise OutputError("--backend nccl needs CUDA, and this machine has none (use gloo)")
        torch.cuda.set_device(local % torch.cuda.device_count())
    td.init_process_group(backend=backend, timeout=_dt.timedelta(seconds=timeout_s))
    return Dist(rank, world, local, backend)


def wants_sharding(args, out: Path | None) -> bool:
    """Whether a command runs its sharded path: torchrun launched this process, ``--dry-run`` or ``--backend`` was
    given, or ``--out`` has an interrupted sharded run's ``<out>.partial/`` (a plain run continues it)."""
    return (sharded_launch() or args.dry_run is not None or args.backend is not None
            or (out is not None and partial_path(out).is_dir()))


def print_dry_run(n: int, labels: Sequence[str], costs: Sequence[float], seconds: Sequence[float]) -> None:
    """``--dry-run N``: the plan of the cells (``labels``, ``costs``; ``seconds``: each cell's estimate) over N ranks
    (:func:`dry_run_world`), printed once, by rank 0 of a torchrun launch (no process group is joined). OutputError
    for a bad N."""
    world = dry_run_world(n)
    if int(os.environ.get("RANK", 0) or 0) == 0:
        print(format_plan(labels, plan(costs, world), seconds))


def rank_device(device, dist: Dist):
    """``device`` (a torch.device), or under torchrun with CUDA this rank's GPU (``LOCAL_RANK``'s, made current by
    :func:`launch`)."""
    if device.type == "cuda" and dist.grouped:
        # lazy: imports torch, numpy; the command's flags are checked before it
        import torch

        return torch.device("cuda", torch.cuda.current_device())
    return device


def announce(prefix: str, dist: Dist, shares: Sequence[Sequence], what: str) -> None:
    """Rank 0's one line on stderr: ranks, backend, and how many ``what`` each rank runs."""
    if dist.rank == 0:
        say(f"{prefix}{dist.world} rank(s) ({dist.backend or 'one process'}): "
            + ", ".join(f"rank {k} {len(s)} {what}" for k, s in enumerate(shares)))


def give_up(dist: Dist, error: BaseException | None = None) -> None:
    """End this rank's part after its error was reported: with a :class:`SharedOutputError` (every rank has it),
    meet the others first so each rank's line is out before torchrun stops any; then leave the process group."""
    if isinstance(error, SharedOutputError):
        dist.settle()
    dist.close()


def sharding_summary(dist: Dist, rows: Sequence[dict], wall_s: float) -> dict:
    """The provenance of a sharded run: world size, backend, wall time, and per rank its rows and devices."""
    return {"world_size": dist.world, "backend": dist.backend, "wall_time_s": wall_s,
            "ranks": [{"rank": k, "rows": sum(r.get("rank") == k for r in rows),
                       "devices": sorted({str(r.get("device")) for r in rows if r.get("rank") == k})}
                      for k in range(dist.world)]}


def plan(costs: Sequence[float], world: int) -> list[list[int]]:
    """Each rank's cells (indices into ``costs``, in planned order): longest first to the least-loaded rank."""
    if world < 1:
        raise ValueError("world size must be at least 1")
    loads = [0.0] * world
    shares: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(costs)), key=lambda i: (-float(costs[i]), i)):
        k = min(range(world), key=lambda r: (loads[r], r))
        shares[k].append(i)
        loads[k] += float(costs[i])
    return [sorted(s) for s in shares]


def format_plan(labels: Sequence[str], shares: Sequence[Sequence[int]], seconds: Sequence[float],
                done: set[int] = frozenset()) -> str:
    """The plan as text: per rank, its cell count and estimated seconds (``seconds``: each cell's), then its
    cells."""
    total = sum(seconds[i] for s in shares for i in s)
    lines = [f"plan: {sum(len(s) for s in shares)} cells to run on {len(shares)} rank(s)"
             + (f" ({len(done)} done already)" if done else "")
             + f", estimated {total:.1f} s of work"]
    for k, share in enumerate(shares):
        est = sum(seconds[i] for i in share)
        lines.append(f"rank {k}: {len(share)} cells, estimated {est:.1f} s")
        lines += [f"  {labels[i]}  ({seconds[i]:.2f} s)" for i in share]
    return "\n".join(lines)


def cells_digest(cells: Sequence) -> tuple[int, str]:
    """(count, digest) of what a rank would run: its cells (any JSON-able items, others by repr), in order."""
    text = json.dumps(list(cells), default=repr, separators=(",", ":"))
    return len(cells), hashlib.sha256(text.encode()).hexdigest()[:16]


def _cells_disagree(seen: Sequence[tuple[int, str]]) -> str | None:
    """The error line when the ranks' :func:`cells_digest` differ, else None."""
    if len(set(map(tuple, seen))) <= 1:
        return None
    counts = ", ".join(f"rank {k}: {n}" for k, (n, _) in enumerate(seen))
    return (f"the ranks would run different cells ({counts} cells; their lists differ): every rank must see the "
            "same inputs, implementations and arguments")


def _read_rows(path: Path, check=None) -> tuple[list[dict], dict]:
    return read_log(path, check)


def describe_key(key: tuple) -> str:
    """A row key in an error message: an accuracy key as input and recipe, any other as its fields."""
    if len(key) == 4:
        return f"input {key[0]!r} recipe {key[2]!r}"
    return "(" + ", ".join(repr(k) for k in key if k is not None) + ")"


def _rank_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.iterdir() if p.suffix == ".jsonl" and p.is_file()), key=lambda p: p.name)


class ShardedResults:
    """``--out`` of a sharded run: this rank's ``<out>.partial/rank-K.jsonl``, the done set, rank 0's merge.

    Every rank calls :meth:`open` (collective). Rank 0 takes the run lock, applies the refuse / force / resume
    policy and broadcasts (error, or the done keys and the provenance of what is resumed: its latest segment,
    listing the earlier ones); a refused run raises the same OutputError on every rank. :attr:`earlier`: the
    segments a resumed run continues, oldest first ([] for a fresh run).
    """

    def __init__(self, path: Path, dist: Dist, *, done: set, provenance: dict, resumed: bool,
                 reader: Callable[[Path], tuple[list[dict], dict]], lock: RunLock | None,
                 key: Callable[[dict], tuple] = row_key, check: Callable[[object, str], dict] | None = None,
                 dumps: Callable[[dict], str] = json.dumps):
        self.path, self.dist = path, dist
        self.folder = partial_path(path)
        self.partial = self.folder
        self.done = done
        self.provenance = provenance
        self.resumed_from = self.folder if resumed else None
        self.earlier = run_provenances(provenance) if resumed else []
        self._reader = reader
        self.lock = lock
        self.key, self.check, self.dumps = key, check, dumps
        self._log: AppendLog | None = None
        self._pending: dict | None = None  # this segment's provenance, written with the rank's first row

    @property
    def rank_file(self) -> Path:
        return self.folder / f"rank-{self.dist.rank}.jsonl"

    @classmethod
    def open(cls, path: str | Path, dist: Dist, *, force: bool = False, resume: bool = False,
             planned: Sequence[tuple] | None = None, reader: Callable[[Path], tuple[list[dict], dict]],
             need_bytes: int = 0, flag: str = "--out", key: Callable[[dict], tuple] = row_key,
             check: Callable[[object, str], dict] | None = None,
             dumps: Callable[[dict], str] = json.dumps, cells: Sequence | None = None) -> ShardedResults:
        """``key``: a row's identity (default :func:`zyfa.accuracy.io.results_io.row_key`); ``check``: the row check of
        the rank files (default a ``zyfa accuracy`` row, :func:`zyfa.accuracy.io.results_io.check_row`); ``dumps``: a
        row as one JSON line (rank files). A command whose rows differ (``zyfa impact``) passes its own.
        ``cells``: what this rank would run (cells and costs, inputs, implementations available here), compared
        across the ranks first (:func:`cells_digest`): ranks that differ (another file, an implementation available
        on one GPU only) all raise :class:`SharedOutputError` before anything is written."""
        path = Path(path)
        if cells is not None and dist.grouped:
            differ = _cells_disagree(dist.gather(cells_digest(cells)))
            if differ:
                raise SharedOutputError(differ)
        lock, answer = None, None
        if dist.rank == 0:
            try:
                lock, answer = cls._prepare(path, force=force, resume=resume, planned=planned, reader=reader,
                                            need_bytes=need_bytes, flag=flag, key=key, check=check,
                                            dumps=dumps)
            except (OutputError, ValueError) as e:
                answer = {"error": str(e)}
        answer = dist.broadcast(answer)
        if "error" in answer:
            if lock is not None:
                lock.release()
            raise SharedOutputError(answer["error"])
        done = {tuple(k) for k in answer["done"]}
        return cls(path, dist, done=done, provenance=answer["provenance"], resumed=answer["resumed"],
                   reader=reader, lock=lock, key=key, check=check, dumps=dumps)

    @classmethod
    def _prepare(cls, path: Path, *, force, resume, planned, reader, need_bytes, flag, key, check, dumps):
        if force and resume:
            raise OutputError("--force and --resume exclude each other")
        check_writable(path, need_bytes=need_bytes)
        folder = partial_path(path)
        lock = RunLock.acquire(folder, what=str(path))
        try:
            exists = [p for p in (path, folder) if p.exists()]
            if exists and not (force or resume):
                what = (f"an interrupted run's rows are in {folder}" if folder.exists() else f"{path} exists")
                raise OutputError(f"{what}: add --resume to continue it, --force to start over, "
                                  f"or choose another {flag}")
            # every check before the first change on disk: a refused run leaves no folder behind
            kept, provs = [], []
            if not force:
                for f in ([folder] if folder.is_file() else _rank_files(folder)):
                    rows, p = _read_rows(f, check)
                    kept += rows
                    provs.append(p)
            if resume and path.is_file():
                rows, p = reader(path)
                kept += rows
                provs.append(p)
            prov = merge_run_provenances(provs)  # rank-0.jsonl before rank-K: a shared segment's record is rank 0's
            if kept and not prov:
                raise OutputError(f"{folder} has no provenance record, so it is not a run to resume; use --force "
                                  f"or choose another {flag}")
            planned_set = set(planned) if planned is not None else None
            foreign = [k for k in (key(r) for r in kept) if planned_set is not None and k not in planned_set]
            if foreign:
                raise OutputError(f"{folder} holds rows this run would not make ({len(foreign)}, e.g. "
                                  f"{describe_key(foreign[0])}): resume it with the same arguments, "
                                  f"or use --force or another {flag}")
            try:
                if force and folder.exists():
                    shutil.rmtree(folder) if folder.is_dir() else folder.unlink()
                if folder.is_file():  # a single-process run's partial file: continued as one more rank file
                    moved = folder.with_name(folder.name + ".single")
                    os.replace(folder, moved)
                    folder.mkdir()
                    os.replace(moved, folder / "single.jsonl")
                folder.mkdir(exist_ok=True)
            except OSError as e:
                raise OutputError(f"cannot prepare {folder}: {e.strerror or e}") from None
            if resume and path.is_file():  # keep a finished file's rows as a rank file of their own
                fin = folder / "finished.jsonl"
                if not fin.exists():
                    rows, p = reader(path)
                    with AppendLog(fin, fresh=True) as log:
                        log.write_line(dumps({"record": "provenance", **p}))
                        for r in rows:
                            log.write_line(dumps(r))
        except BaseException:
            lock.release()
            raise
        return lock, {"done": sorted((list(key(r)) for r in kept), key=repr), "provenance": prov,
                      "resumed": bool(kept)}

    def start(self, provenance: dict) -> None:
        """Start this segment: its ``provenance`` line goes to this rank's file (continued after its last complete
        line if it exists), at once for a fresh run (an interrupted one is then resumed, never overwritten) and with
        the rank's first row for a resumed one, so a resume with nothing left for a rank adds no empty segment. A
        resumed run's ``provenance`` gets ``earlier_runs`` in place (the segments rank 0 found): pass the same dict
        to :meth:`finish`'s ``provenance``."""
        if self.earlier:
            set_earlier_runs(provenance, self.earlier)
        self._pending = provenance
        if self.resumed_from is None:
            self._open_log()

    def _open_log(self) -> None:
        if self._pending is None:
            raise RuntimeError("ShardedResults.start() first")
        f = self.rank_file
        self._log = AppendLog(f, fresh=not f.is_file())
        self._log.write_line(self.dumps({"record": "provenance", **self._pending}))
        self._pending = None

    def add(self, row: dict) -> None:
        """Append one finished row, stamped with this rank under torchrun (fsync'd before returning)."""
        if self._log is None:
            self._open_log()
        if self.dist.grouped:
            row["rank"] = self.dist.rank
        self._log.write_line(self.dumps(row))

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def merge(self, keys: Sequence[tuple], order: Callable[[dict], tuple] | None = None) -> list[dict]:
        """Every row of the rank files (the first of each :func:`row_key`): in the planned order ``keys``, or,
        with ``order``, all of them sorted by ``order(row)``. RuntimeError naming a key of ``keys`` not made."""
        by: dict[tuple, dict] = {}
        for f in _rank_files(self.folder):
            for r in _read_rows(f, self.check)[0]:
                by.setdefault(self.key(r), r)
        missing = [k for k in keys if k not in by]
        if missing:
            raise RuntimeError(f"{len(missing)} planned rows were not made, e.g. {missing[0]}; the rows made are in "
                               f"{self.folder} (rerun with --resume)")
        if order is not None:
            return sorted(by.values(), key=order)
        return [by[k] for k in keys]

    def finish(self, keys: Sequence[tuple], provenance: Callable[[list[dict]], dict],
               write: Callable[[Sequence[dict], Path, dict], object],
               order: Callable[[dict], tuple] | None = None) -> list[dict] | None:
        """Collective: close this rank's file, barrier; rank 0 merges (:meth:`merge`), writes ``<out>``
        atomically (``provenance(rows)``, listing a resumed run's earlier segments), removes ``<out>.partial/``
        and drops the lock. Returns the merged rows on rank 0, None elsewhere."""
        self._close_log()
        self.dist.barrier()
        if self.dist.rank != 0:
            return None
        rows = self.merge(keys, order)
        prov = provenance(rows)
        if self.earlier:
            set_earlier_runs(prov, self.earlier)
        write(rows, self.path, prov)
        shutil.rmtree(self.folder, ignore_errors=True)
        self.release()
        return rows

    def close(self) -> None:
        """Stop writing without finishing: the rank files stay, rank 0's lock is dropped; a folder no rank wrote
        into (a run refused after :meth:`open`) is removed, so it does not pass for an interrupted run."""
        self._close_log()
        if self.dist.rank == 0 and self.lock is not None:
            with contextlib.suppress(OSError):
                self.folder.rmdir()  # only when empty
        self.release()

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


class RankRows:
    """A rank's share of a runner's rows, with the interface of :class:`zyfa.accuracy.io.results_io.ResultsFile` that
    :func:`zyfa.accuracy.study.run.run_study` uses (``check_plan``, ``done``, ``skip``, ``run_id``, ``start``, ``add``,
    ``rows_in_order``, ``close``), over a :class:`ShardedResults` (open it first: a collective).

    :meth:`check_plan` plans the rows not done over the ranks (:func:`plan`, ``cost(key)``); ``skip`` is then every
    planned row this rank does not make. :meth:`rows_in_order` is collective: rank 0 gets the merged rows (written to
    the ShardedResults' path), the other ranks None. ``device`` is stamped on rows that lack one; ``on_plan(shares)``
    hears each rank's row keys once planned. ``run_id``: this segment's (a new one when resuming, shared by the
    ranks); :attr:`provenance` is what was resumed (its latest segment, listing the earlier ones).
    """

    def __init__(self, results: ShardedResults, cost: Callable[[tuple], float], device: str, run_id: str,
                 on_plan: Callable[[list[list[tuple]]], None] | None = None):
        self.results, self.cost, self.device, self.run_id = results, cost, device, run_id
        self.on_plan = on_plan
        self.dist = results.dist
        self.done = set(results.done)
        self.skip: set = set(self.done)
        self.shares: list[list[tuple]] = []
        self.resumed_from = results.resumed_from
        self.provenance = results.provenance
        self._start: dict = {}
        self._t0 = None

    def check_plan(self, keys: Sequence[tuple]) -> None:
        planned = set(keys)
        foreign = [k for k in self.done if k not in planned]
        if foreign:
            raise OutputError(f"{self.results.folder} holds rows this run would not make ({len(foreign)}, e.g. "
                              f"{describe_key(sorted(foreign, key=repr)[0])}): resume it with the same arguments, "
                              "or use --force or another --out")
        todo = [k for k in keys if k not in self.done]
        self.shares = [[todo[i] for i in share] for share in plan([self.cost(k) for k in todo], self.dist.world)]
        self.skip = planned - set(self.shares[self.dist.rank])
        if self.on_plan is not None:
            self.on_plan(self.shares)

    def start(self, provenance: dict) -> None:
        """Start this rank's segment: ``provenance`` gets this run's ``run_id`` and, resumed, the earlier segments
        (in place; :meth:`ShardedResults.start`)."""
        provenance["run_id"] = self.run_id
        self._start = provenance
        self._t0 = time.perf_counter()
        self.results.start(provenance)

    def add(self, row: dict) -> None:
        row.setdefault("device", self.device)
        self.results.add(row)

    def sharding(self, rows: Sequence[dict]) -> dict:
        """The provenance of a sharded run (ranks, backend, rows and devices per rank, wall time); {} for one
        process without torchrun."""
        if not self.dist.grouped:
            return {}
        return sharding_summary(self.dist, rows, time.perf_counter() - self._t0 if self._t0 is not None else 0.0)

    def rows_in_order(self, keys: Sequence[tuple]) -> list[dict] | None:
        return self.results.finish(keys, lambda rows: {**self._start, **self.sharding(rows)}, write_results)

    def close(self) -> None:
        self.results.close()
