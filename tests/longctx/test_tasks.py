"""Needle and passkey prompts: exact lengths, the needle where asked, the answer last, one clear error."""

from __future__ import annotations

import pytest
from zyfa.accuracy.longctx.tasks import PromptError, build_prompt, min_length, tokenizer_prefix


@pytest.mark.parametrize("task", ["needle", "passkey"])
@pytest.mark.parametrize("length", [160, 333, 1024])
def test_exact_length_and_answer_last(smollm2, task, length):
    tok = smollm2.tokenizer
    p = build_prompt(tok, task, length, 0.5, 1)
    assert len(p.ids) == length
    # teacher forcing: the answer's tokens but the last close the prompt
    assert p.ids[len(p.ids) - len(p.answer) + 1:] == p.answer[:-1]
    assert tok.decode(p.answer) == p.answer_text
    assert p.answer_text.strip().isdigit() and p.answer_text.strip() == p.meta["value"]
    text = tok.decode(p.ids)
    assert text.count(p.meta["value"]) >= 1
    assert text.rstrip().endswith("is" + p.answer_text[:-1]) or text.endswith(tok.decode(p.answer[:-1]))


@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_needle_sits_at_its_depth(smollm2, depth):
    tok = smollm2.tokenizer
    p = build_prompt(tok, "needle", 1024, depth, 0)
    needle = tok.decode(p.ids[p.needle_start:p.needle_start + 12])
    assert "special magic number" in needle
    assert abs(p.depth_actual - depth) < 0.1  # moved back to a sentence end at most 64 tokens
    before = tok.decode(p.ids[:p.needle_start])
    assert "special magic number" not in before


def test_same_seed_same_fact_other_seed_other_fact(smollm2):
    tok = smollm2.tokenizer
    a, b = build_prompt(tok, "needle", 512, 0.5, 3), build_prompt(tok, "needle", 512, 0.5, 3)
    assert a.ids == b.ids and a.sha256 == b.sha256
    c = build_prompt(tok, "needle", 2048, 0.1, 3)
    assert c.meta["value"] == a.meta["value"] and c.meta["key"] == a.meta["key"]  # one fact per seed
    assert build_prompt(tok, "needle", 512, 0.5, 4).meta["value"] != a.meta["value"]
    assert build_prompt(tok, "needle", 512, 0.5, 3, text="shakespeare").ids != a.ids


def test_too_short_names_the_shortest_length(smollm2):
    tok = smollm2.tokenizer
    need = min_length(tok, "needle")
    assert len(build_prompt(tok, "needle", need, 0.5, 0).ids) == need  # no haystack at all still fits
    with pytest.raises(PromptError, match=f"at least {need} tokens"):
        build_prompt(tok, "needle", need - 1, 0.5, 0)
    with pytest.raises(PromptError, match="outside 0..1"):
        build_prompt(tok, "needle", 512, 1.5, 0)
    with pytest.raises(PromptError, match="unknown task"):
        build_prompt(tok, "haystack", 512, 0.5, 0)


def test_passkey_filler_and_prefix(smollm2):
    tok = smollm2.tokenizer
    p = build_prompt(tok, "passkey", 600, 0.25, 0)
    text = tok.decode(p.ids)
    assert text.startswith(tok.decode(tokenizer_prefix(tok)) + "The grass is green.")
    assert text.count(f"The pass key is {p.meta['value']}") == 1
    assert 0.15 < p.depth_actual < 0.35


# ---------------------------------------------------------------------------------------------- RULER-style tasks

@pytest.mark.parametrize("task", ["niah", "multikey", "multivalue", "vartrack"])
def test_ruler_tasks_exact_length_answer_last_and_facts(smollm2, task):
    from zyfa.accuracy.longctx.tasks import fact_id, score_generated

    tok = smollm2.tokenizer
    prompts = [build_prompt(tok, task, 600, d, s) for d in (0.0, 0.5, 1.0) for s in range(3)]
    for p in prompts:
        assert len(p.ids) == 600 and p.ids[len(p.ids) - len(p.answer) + 1:] == p.answer[:-1]
        assert p.meta["haystack"] == "paulgraham" and p.meta["fact_id"] == fact_id(task, p.meta["seed"])
        text = tok.decode(p.ids[:len(p.ids) - len(p.answer) + 1])
        assert all(part in text.split("Question:")[0] for part in p.meta["parts"])  # every part is in the haystack
        assert score_generated(p.answer_text + "\n", p)["gen_exact"]
        assert score_generated(p.answer_text, p)["gen_contains"]
    # one fact per seed, the same at every depth; another seed another fact (niah: another haystack window)
    by_seed = {p.meta["seed"]: p for p in prompts}
    same = [p for p in prompts if p.meta["seed"] == 1]
    assert len({tuple(p.meta["parts"]) if task != "multivalue" else tuple(sorted(p.meta["parts"]))
                for p in same}) == 1
    if task == "niah":
        assert len({p.meta["text_offset"] for p in by_seed.values()}) == 3
    else:
        assert len({tuple(sorted(p.meta["parts"])) for p in by_seed.values()}) == 3


def test_the_standard_needle_and_question(smollm2):
    from zyfa.accuracy.longctx.tasks import NIAH_NEEDLE, score_generated

    tok = smollm2.tokenizer
    p = build_prompt(tok, "niah", 800, 0.3, 0)
    text = tok.decode(p.ids)
    assert text.count(NIAH_NEEDLE) == 1 and "What is the best thing to do in San Francisco?" in text
    assert 0.2 < p.depth_actual < 0.35 and "San Francisco" in tok.decode(p.ids[p.needle_start:p.needle_start + 12])
    s = score_generated(" Eat a sandwich in Dolores Park.", p)
    assert s["gen_contains"] and not s["gen_exact"]
    assert score_generated(" go to the beach", p) == {"gen_exact": False, "gen_contains": False, "gen_recall": 0.0}


def test_vartrack_chain_reads_in_order_and_multivalue_answer_follows_the_text(smollm2):
    tok = smollm2.tokenizer
    for s in range(4):
        p = build_prompt(tok, "vartrack", 900, 0.2, s)
        text = tok.decode(p.ids)
        at = [text.index(f"VAR {n} =") for n in p.meta["names"]]
        assert at == sorted(at) and p.answer_text == " " + " ".join(p.meta["names"])
        m = build_prompt(tok, "multivalue", 900, 0.5, s)
        text = tok.decode(m.ids).split("Question:")[0]
        assert [text.index(v) for v in m.meta["values"]] == sorted(text.index(v) for v in m.meta["values"])
    mk = build_prompt(tok, "multikey", 900, 0.5, 0)
    text = tok.decode(mk.ids)
    assert all(f"magic number for {k} is" in text for k in mk.meta["distractors"])
    assert f"for {mk.meta['key']} mentioned" in text and len(mk.meta["distractors"]) == 3


def test_ruler_too_short_is_one_clear_error(smollm2):
    tok = smollm2.tokenizer
    need = min_length(tok, "multivalue")
    assert len(build_prompt(tok, "multivalue", need + 20, 0.5, 0).ids) == need + 20
    with pytest.raises(PromptError, match="too short for the needle to fit"):
        build_prompt(tok, "multivalue", need - 5, 0.5, 0)
