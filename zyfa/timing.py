"""Interleaved timing: ratios between kernels that hold when the clock moves.

The H200 boosts its SM clock between about 1620 and 1980 MHz under load, and a kernel timed first in a run can meet
a cooler card than one timed last. So every implementation of one case is timed in a rotating order (repeat r
starts at the r-th implementation), the case is repeated, and a speed ratio is taken *within* a repeat, from
samples taken minutes apart at most, before it is summarised (median and range over the repeats). The SM clock
is read during every sample; :func:`ratio_summary` also gives the ratio at matched clock (time times clock: the
ratio of cycles), which is what the kernels would show at one fixed clock if their time scales with it.

The same code times CPU callables (``perf_counter`` medians), so the schedule and the statistics are tested
without a GPU.

Exposed: ``Sample``, ``rotating_orders``, ``time_interleaved``, ``cpu_timer``, ``cuda_timer``, ``NvmlClock``,
``summarize``, ``ratio_summary``.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    """One timing of one implementation: its repeat, its position in that repeat's order, the median time of
    the timer's inner runs (ms) and the mean SM clock while it ran (MHz; None where no clock was read)."""

    name: str
    repeat: int
    position: int
    ms: float
    clock_mhz: float | None


def rotating_orders(names: Sequence[str], repeats: int) -> list[list[str]]:
    """Repeat r times the names starting from the (r mod n)-th: each name is timed at every position equally
    often when ``repeats`` is a multiple of the count."""
    n = len(names)
    return [[names[(r + i) % n] for i in range(n)] for r in range(repeats)]


def time_interleaved(fns: Mapping[str, Callable[[], object]], *, repeats: int,
                     timer: Callable[[Callable[[], object]], float], clock=None,
                     progress: Callable[[str], None] | None = None,
                     failures: dict[str, str] | None = None) -> list[Sample]:
    """Every callable of ``fns`` timed ``repeats`` times in :func:`rotating_orders`. ``timer(fn)`` returns one
    sample's time in ms; ``clock``: a context manager factory whose object has ``.mean()`` (the SM clock during the
    sample), or None. A callable that raises is timed no more: its error goes into ``failures`` (name -> error),
    and the others go on."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    failures = {} if failures is None else failures
    samples = []
    orders = rotating_orders(list(fns), repeats)
    for r, order in enumerate(orders):
        for pos, name in enumerate(order):
            if name in failures:
                continue
            try:
                if clock is None:
                    ms, mhz = timer(fns[name]), None
                else:
                    with clock() as c:
                        ms = timer(fns[name])
                    mhz = c.mean()
            except Exception as e:  # noqa: BLE001 - a user's kernel failing mid-run must not end it
                failures[name] = f"{type(e).__name__}: {str(e)[:300]}"
                continue
            samples.append(Sample(name, r, pos, float(ms), mhz))
            if progress:
                progress(f"repeat {r + 1}/{repeats} {name}: {ms:.4g} ms")
    return samples


def cpu_timer(inner: int = 5) -> Callable[[Callable[[], object]], float]:
    """Median wall time (ms) of ``inner`` calls, after one warm-up call."""

    def timer(fn):
        fn()
        ts = []
        for _ in range(inner):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)

    return timer


def cuda_timer(warmup_ms: float = 25, rep_ms: float = 100) -> Callable[[Callable[[], object]], float]:
    """``triton.testing.do_bench`` median (ms) with CUDA events and an L2 flush between runs."""
    import triton

    def timer(fn):
        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))

    return timer


class NvmlClock:
    """Context manager: the SM clock read by NVML every ``period`` s in a background thread while active;
    ``mean()`` after it closes. ``NvmlClock.available()`` says whether NVML answers (nvidia-ml-py)."""

    _nvml = None
    _handle = None

    @classmethod
    def available(cls, device_index: int = 0) -> bool:
        if cls._nvml is None:
            try:
                import pynvml

                pynvml.nvmlInit()
                cls._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
                cls._nvml = pynvml
            except Exception:  # noqa: BLE001 - no NVML: no clock column, said in the report
                cls._nvml = False
        return bool(cls._nvml)

    def __init__(self, period: float = 0.005):
        self.period = period
        self.values: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> None:
        nv = self._nvml
        self.values.append(float(nv.nvmlDeviceGetClockInfo(self._handle, nv.NVML_CLOCK_SM)))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._read()
            time.sleep(self.period)

    def __enter__(self):
        if self.available():
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._read()

    def mean(self) -> float | None:
        return sum(self.values) / len(self.values) if self.values else None


def _spread(xs: Sequence[float]) -> dict:
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1], "q1": q[0], "q3": q[2], "n": len(xs)}


def summarize(samples: Sequence[Sample]) -> dict[str, dict]:
    """Per implementation: its times' median, min, max, quartiles and count (ms), and its clocks' median."""
    out = {}
    for name in dict.fromkeys(s.name for s in samples):
        mine = [s for s in samples if s.name == name]
        d = {f"ms_{k}" if k != "n" else "repeats": v for k, v in _spread([s.ms for s in mine]).items()}
        clocks = [s.clock_mhz for s in mine if s.clock_mhz is not None]
        d["clock_mhz_median"] = statistics.median(clocks) if clocks else None
        d["clock_mhz_min"] = min(clocks) if clocks else None
        d["clock_mhz_max"] = max(clocks) if clocks else None
        out[name] = d
    return out


def ratio_summary(samples: Sequence[Sample], a: str, b: str) -> dict | None:
    """How many times faster ``a`` is than ``b`` (time of b / time of a), taken within each repeat in which both
    ran and then summarised: median, min, max and count; ``matched_clock_*``: the ratio of cycles (time times the
    sample's SM clock) where both samples have a clock. None when no repeat has both."""
    per: dict[int, dict[str, Sample]] = {}
    for s in samples:
        if s.name in (a, b):
            per.setdefault(s.repeat, {})[s.name] = s
    pairs = [(d[a], d[b]) for d in per.values() if a in d and b in d]
    if not pairs:
        return None
    plain = _spread([sb.ms / sa.ms for sa, sb in pairs])
    out = {"median": plain["median"], "min": plain["min"], "max": plain["max"], "n": plain["n"]}
    cyc = [(sb.ms * sb.clock_mhz) / (sa.ms * sa.clock_mhz) for sa, sb in pairs
           if sa.clock_mhz and sb.clock_mhz]
    if cyc:
        m = _spread(cyc)
        out.update(matched_clock_median=m["median"], matched_clock_min=m["min"], matched_clock_max=m["max"])
    return out
