"""Needle and passkey prompts: exact lengths, the needle where asked, the answer last, one clear error."""

from __future__ import annotations

import pytest

from accuracy.longctx.tasks import PromptError, build_prompt, min_length, tokenizer_prefix


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
