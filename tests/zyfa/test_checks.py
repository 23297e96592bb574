"""zyfa.checks: a check is answered at once outside a deferred scope and at the end of the outermost scope inside
one, with one read back for all of them; the first failed check raises what it would have raised at once (through
the wraps open where it was asked), a false alarm raises nothing, and an exception raised after a failed check is
replaced by that check's error."""

from __future__ import annotations

import pytest
import torch

from zyfa import checks

FINE, BAD = torch.tensor(True), torch.tensor(False)


def _count_reads(monkeypatch):
    reads = []
    for name in ("__bool__", "tolist", "item"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda t, *a, _r=real, _n=name: reads.append(_n) or _r(t, *a))
    return reads


def test_outside_a_scope_a_check_is_answered_at_once():
    checks.check(FINE, lambda: ValueError("never"))
    with pytest.raises(ValueError, match="^bad q$"):
        checks.check(BAD, lambda: ValueError("bad q"))
    checks.check(BAD, lambda: None)  # a closer look found nothing: no error
    assert not checks.active()


def test_inside_a_scope_the_checks_wait_for_one_read_back(monkeypatch):
    with pytest.raises(ValueError, match="^second$"), checks.deferred():
        reads = _count_reads(monkeypatch)
        assert checks.active()
        checks.check(FINE, lambda: ValueError("first"))
        checks.check(BAD, lambda: None)  # a false alarm
        checks.check(BAD, lambda: ValueError("second"))
        checks.check(BAD, lambda: ValueError("third"))
        with checks.deferred():  # an inner scope leaves its checks to the outer one
            checks.check(BAD, lambda: ValueError("inner"))
        assert reads == [], "nothing read back before the scope ends"
    assert reads == ["tolist"], "one read back for every check of the scope (one device)"
    monkeypatch.undo()
    assert not checks.active()
    with checks.deferred():
        checks.check(FINE, lambda: ValueError("never"))


def test_wraps_apply_to_checks_asked_inside_them():
    def named(e):
        return RuntimeError(f"kernel 'x' raised {type(e).__name__}: {e}")

    with pytest.raises(RuntimeError, match=r"^kernel 'x' raised ValueError: bad descale$"), checks.deferred():
        with checks.wrapped(named):
            checks.check(BAD, lambda: ValueError("bad descale"))
        checks.check(BAD, lambda: ValueError("outside the wrap"))
    with pytest.raises(ValueError, match="^outside the wrap$"), checks.deferred():
        with checks.wrapped(named):
            checks.check(FINE, lambda: ValueError("never"))
        checks.check(BAD, lambda: ValueError("outside the wrap"))


def test_an_exception_after_a_failed_check_gives_way_to_it():
    with pytest.raises(ValueError, match="^q contains NaN") as caught, checks.deferred():
        checks.check(BAD, lambda: ValueError("q contains NaN or Inf"))
        raise IndexError("what the NaN did later")
    assert isinstance(caught.value.__cause__, IndexError)
    with pytest.raises(IndexError), checks.deferred():  # nothing failed before it: the exception itself
        checks.check(FINE, lambda: ValueError("never"))
        raise IndexError("its own")


def test_an_interrupt_closes_the_scope():
    with pytest.raises(KeyboardInterrupt), checks.deferred():
        checks.check(BAD, lambda: ValueError("left unanswered"))
        raise KeyboardInterrupt
    assert not checks.active(), "later checks are answered at once again"
    with pytest.raises(ValueError, match="^at once$"):
        checks.check(BAD, lambda: ValueError("at once"))


@pytest.mark.gpu
def test_flags_on_the_gpu_and_the_cpu_are_answered_per_device(monkeypatch):
    """Flags on CUDA and on the CPU in one scope: one read back per device, the first failure (in the order asked)
    raised; the NaN screen of a bf16 CUDA tensor among them."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (gpu tests run on the H200)")
    from zyfa.quant import finite_screen

    x = torch.randn(2, 4, 64, 128, device="cuda", dtype=torch.bfloat16)
    y = x.clone()
    y[1, 2, 3, 4] = float("nan")
    with pytest.raises(ValueError, match="^y holds NaN$"), checks.deferred():
        reads = _count_reads(monkeypatch)
        checks.check(finite_screen([x]), lambda: ValueError("never"))
        checks.check(FINE, lambda: ValueError("never"))
        checks.check(finite_screen([y]), lambda: ValueError("y holds NaN"))
        checks.check(BAD, lambda: ValueError("later, on the CPU"))
    assert sorted(reads) == ["tolist", "tolist"], "one read back per device"
