"""A batch that runs out of GPU memory is scored again in halves, never left as failed rows (which --resume would
count as done)."""

from zyfa.accuracy.longctx.run import OUT_OF_MEMORY, score_in_halves


def _scorer(capacity: int, calls: list):
    """Scores prompts one row each; a forward of more than ``capacity`` prompts runs out of memory (as
    _score_batch reports it: every row of the batch failed with the out-of-memory error)."""

    def score(part, op_layers):
        calls.append((list(part), list(op_layers)))
        if len(part) > capacity:
            return [{"prompt": p, "status": "failed", "error": OUT_OF_MEMORY + "tried to allocate"} for p in part]
        return [{"prompt": p, "status": "ok", "error": None, "batch": len(part)} for p in part]

    return score


def test_an_oversized_batch_is_split_until_it_fits():
    calls = []
    rows = score_in_halves(_scorer(2, calls), list(range(8)), [0, 5])
    assert [r["prompt"] for r in rows] == list(range(8))
    assert all(r["status"] == "ok" and r["batch"] == 2 for r in rows)
    # 8 -> 4 -> 2: one try of 8, two of 4, four of 2; the operator layers go with the first prompt only
    assert [len(p) for p, _ in calls] == [8, 4, 2, 2, 4, 2, 2]
    assert [ops for p, ops in calls if 0 in p] == [[0, 5], [0, 5], [0, 5]]
    assert all(ops == [] for p, ops in calls if 0 not in p)


def test_a_batch_that_fits_runs_once_and_odd_sizes_split_unevenly():
    calls = []
    assert len(score_in_halves(_scorer(8, calls), list(range(8)), [])) == 8 and len(calls) == 1
    calls.clear()
    rows = score_in_halves(_scorer(1, calls), list(range(3)), [])
    assert [r["prompt"] for r in rows] == [0, 1, 2] and all(r["status"] == "ok" for r in rows)


def test_a_single_prompt_out_of_memory_keeps_its_failed_row():
    calls = []
    rows = score_in_halves(_scorer(0, calls), [7], [])
    assert rows == [{"prompt": 7, "status": "failed", "error": OUT_OF_MEMORY + "tried to allocate"}]
    assert len(calls) == 1


def test_other_failures_are_not_retried():
    calls = []

    def score(part, op_layers):
        calls.append(part)
        return [{"prompt": p, "status": "failed", "error": "kernel refused the shape"} for p in part]

    rows = score_in_halves(score, [1, 2, 3, 4], [])
    assert len(rows) == 4 and len(calls) == 1
