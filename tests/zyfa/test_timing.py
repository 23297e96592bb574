"""zyfa.timing: the interleaved schedule, failures mid-run, and ratios taken within a repeat, on real CPU callables."""

from __future__ import annotations

import time

import pytest

from zyfa.timing import Sample, cpu_timer, ratio_summary, rotating_orders, summarize, time_interleaved


def test_rotating_orders_put_every_name_at_every_position():
    orders = rotating_orders(["a", "b", "c"], 6)
    assert orders[0] == ["a", "b", "c"] and orders[1] == ["b", "c", "a"] and orders[2] == ["c", "a", "b"]
    for name in "abc":
        positions = [o.index(name) for o in orders]
        assert sorted(positions) == [0, 0, 1, 1, 2, 2]


def test_a_longer_call_times_slower_and_the_ratio_says_so():
    # sleeps, not arithmetic, 10x apart: the ratio stays above 2 on a 2-core machine loaded by other test processes
    # (2 ms against 8 ms did not: scheduler delays of a few ms, 6 December)
    fns = {"small": lambda: time.sleep(0.005), "big": lambda: time.sleep(0.05)}
    samples = time_interleaved(fns, repeats=3, timer=cpu_timer(3))
    assert [s.name for s in samples[:2]] == ["small", "big"] and [s.name for s in samples[2:4]] == ["big", "small"]
    r = ratio_summary(samples, "small", "big")  # how many times faster small is than big
    assert r["n"] == 3 and r["min"] <= r["median"] <= r["max"] and r["median"] > 2
    st = summarize(samples)
    assert st["big"]["repeats"] == 3 and st["big"]["ms_min"] <= st["big"]["ms_median"] <= st["big"]["ms_max"]
    assert st["big"]["clock_mhz_median"] is None  # no clock read on the CPU


def test_a_callable_that_fails_is_dropped_and_the_others_go_on():
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] > 2:
            raise RuntimeError("device lost")

    failures: dict[str, str] = {}
    samples = time_interleaved({"ok": lambda: None, "flaky": flaky}, repeats=4, timer=cpu_timer(1),
                               failures=failures)
    assert failures == {"flaky": "RuntimeError: device lost"}
    assert sum(s.name == "ok" for s in samples) == 4


def test_ratios_are_taken_within_a_repeat_and_matched_at_clock():
    # repeat 0: the card is slow (1600 MHz) for both; repeat 1: fast (2000 MHz) for both
    s = [Sample("a", 0, 0, 1.25, 1600.0), Sample("b", 0, 1, 2.5, 1600.0),
         Sample("a", 1, 1, 1.0, 2000.0), Sample("b", 1, 0, 2.0, 2000.0)]
    r = ratio_summary(s, "a", "b")
    assert r["median"] == pytest.approx(2.0) and r["min"] == pytest.approx(2.0) and r["max"] == pytest.approx(2.0)
    # across repeats (a's fast sample against b's slow one) the ratio would read 2.5: within-repeat pairing avoids it
    s2 = [Sample("a", 0, 0, 1.0, 2000.0), Sample("b", 0, 1, 2.0, 1600.0)]
    r2 = ratio_summary(s2, "a", "b")
    assert r2["median"] == pytest.approx(2.0) and r2["matched_clock_median"] == pytest.approx(1.6)
    assert ratio_summary(s, "a", "nobody") is None


def test_repeats_must_be_positive():
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        time_interleaved({"a": lambda: None}, repeats=0, timer=cpu_timer(1))
