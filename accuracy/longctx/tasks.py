"""Long-context retrieval prompts: needle in a haystack and passkey retrieval, built in token space.

Every prompt is exactly ``length`` tokens long, the length the attention kernel sees: the tokenizer's own prefix
(e.g. Gemma's ``<bos>``), a haystack with one fact hidden at a chosen depth, a question, and the answer's tokens
but the last (teacher forcing: the forward pass scores each answer token from the tokens before it, so the logits
at the last ``len(answer)`` positions say both how likely the answer is and whether greedy decoding returns it).

- **needle**: the haystack is real text from a shipped source (``capture.text``: the Lee news corpus, Shakespeare,
  the Python reference), a window chosen by the seed; the needle is ``The special magic number for <key> is
  <value>.`` with a seeded two-word key and a seeded 7-digit value, inserted at a sentence boundary near the depth;
  the question asks for the key's number.
- **passkey**: the haystack is the repeated filler of the passkey test (``The grass is green. The sky is blue. ...``),
  the needle ``The pass key is <value>. Remember it. <value> is the pass key.`` with a seeded 5-digit value.

The depth is the fraction of the haystack before the needle: 0 puts it first, 1 last (just before the question).
Everything is a pure function of (tokenizer, task, length, depth, seed, text), so a resumed run rebuilds the same
prompts, and the row records the sha256 of the token ids.

Exposed: ``TASKS``, ``Prompt``, ``build_prompt``, ``PromptError``, ``min_length``.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

__all__ = ["FILLER", "TASKS", "Prompt", "PromptError", "build_prompt", "min_length", "tokenizer_prefix"]

TASKS = ("needle", "passkey")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
_ADJECTIVES = ("amber", "bright", "silent", "copper", "hollow", "velvet", "crimson", "distant", "frozen", "golden",
               "hidden", "lucky", "misty", "northern", "quiet", "rapid", "scarlet", "tidal", "wooden", "young")
_NOUNS = ("harbor", "lantern", "meadow", "falcon", "orchard", "compass", "glacier", "violin", "canyon", "beacon",
          "cathedral", "river", "pepper", "saddle", "tunnel", "willow", "anchor", "cobalt", "ember", "thistle")
# how far back from the depth's position the needle may move to land after the end of a sentence
_SENTENCE_SEARCH = 64


class PromptError(ValueError):
    """A prompt cannot be built as asked (too short for the needle and question, a bad depth or task)."""


@dataclass(frozen=True)
class Prompt:
    """One retrieval prompt.

    Attributes:
        ids: the ``length`` token ids of the forward pass (prefix, haystack with needle, question, answer[:-1]).
        answer: the answer's token ids (the last ``len(answer)`` positions of the pass predict them).
        answer_text: the answer as text (the digits, with the leading space the tokenizer gives them).
        needle_start: the needle's first token index in ``ids``.
        depth_actual: needle_start's fraction of the haystack (the asked depth moved to a sentence end).
        meta: task, depth, seed, value, key, text source and its window offset.
    """

    ids: list[int]
    answer: list[int]
    answer_text: str
    needle_start: int
    depth_actual: float
    meta: dict = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(",".join(str(int(i)) for i in self.ids).encode()).hexdigest()


def tokenizer_prefix(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts in front by itself (BOS), detected rather than assumed."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    return list(full[: len(full) - len(plain)]) if full[-len(plain):] == plain else []


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _rng(task: str, seed: int) -> random.Random:
    # the fact depends on the seed only, so one seed asks the same question at every length and depth
    return random.Random(f"zyfa-longctx/{task}/{int(seed)}")


def _parts(task: str, rng: random.Random) -> tuple[str, str, str, dict]:
    """(needle text, question text, answer text, meta) for a task."""
    if task == "needle":
        key = f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"
        value = str(rng.randrange(1_000_000, 10_000_000))
        needle = f" The special magic number for {key} is {value}. "
        question = (f"\n\nQuestion: What is the special magic number for {key} mentioned in the text above?\n"
                    f"Answer: The special magic number for {key} is")
        return needle, question, f" {value}", {"key": key, "value": value}
    if task == "passkey":
        value = str(rng.randrange(10_000, 100_000))
        needle = f" The pass key is {value}. Remember it. {value} is the pass key. "
        question = "\n\nWhat is the pass key? The pass key is"
        return needle, question, f" {value}", {"value": value}
    raise PromptError(f"unknown task {task!r}; tasks: {', '.join(TASKS)}")


def min_length(tokenizer, task: str) -> int:
    """The fewest tokens a prompt of ``task`` can have (prefix, needle, question, answer; no haystack)."""
    needle, question, answer, _ = _parts(task, _rng(task, 0))
    return (len(tokenizer_prefix(tokenizer)) + len(_encode(tokenizer, needle)) + len(_encode(tokenizer, question))
            + len(_encode(tokenizer, answer)) - 1)


def _haystack(tokenizer, task: str, n: int, seed: int, text: str) -> tuple[list[int], dict]:
    """``n`` haystack tokens: a seeded window of a text source (needle) or the repeated filler (passkey)."""
    if n <= 0:
        return [], {}
    if task == "passkey":
        unit = _encode(tokenizer, FILLER)
        reps = n // len(unit) + 1
        return (unit * reps)[:n], {"haystack": "passkey filler"}
    from capture.text import load_text

    src = load_text(text)
    stream = _text_stream(tokenizer, src)
    if len(stream) < n:
        raise PromptError(f"text {text!r} has {len(stream)} tokens, fewer than the {n} a haystack needs; "
                          "use a shorter length or another --text")
    # a seeded start, then whole text: the same seed gives nested haystacks at every length
    start = random.Random(f"zyfa-longctx/haystack/{text}/{int(seed)}").randrange(0, len(stream) - n + 1) \
        if len(stream) > n else 0
    return stream[start:start + n], {"haystack": text, "text_sha256": src.sha256, "text_offset": start}


_STREAMS: dict[tuple[int, str], tuple[object, list[int]]] = {}


def _text_stream(tokenizer, src) -> list[int]:
    key = (id(tokenizer), src.sha256)
    hit = _STREAMS.get(key)
    if hit is None or hit[0] is not tokenizer:
        hit = (tokenizer, _encode(tokenizer, src.text))  # holding the tokenizer keeps its id unique
        _STREAMS[key] = hit
    return hit[1]


def _sentence_end_before(tokenizer, hay: list[int], pos: int) -> int:
    """The position at or before ``pos`` (at most _SENTENCE_SEARCH back) right after a token ending a sentence."""
    for p in range(pos, max(0, pos - _SENTENCE_SEARCH) - 1, -1):
        if p == 0 or p == len(hay):
            return p
        if tokenizer.decode([hay[p - 1]]).rstrip(" ").endswith((".", "!", "?", "\n")):
            return p
    return pos


def build_prompt(tokenizer, task: str, length: int, depth: float, seed: int, *, text: str = "lee") -> Prompt:
    """The prompt of ``task`` with exactly ``length`` tokens and its needle at ``depth`` (0..1) of the haystack.

    Raises:
        PromptError: an unknown task, a depth outside [0, 1], or a length too short for prefix, needle, question
            and answer (the message gives the shortest length that fits).
    """
    if task not in TASKS:
        raise PromptError(f"unknown task {task!r}; tasks: {', '.join(TASKS)}")
    if not 0.0 <= float(depth) <= 1.0:
        raise PromptError(f"depth {depth} is outside 0..1")
    rng = _rng(task, seed)
    needle_text, question_text, answer_text, meta = _parts(task, rng)
    prefix = tokenizer_prefix(tokenizer)
    needle, question, answer = (_encode(tokenizer, t) for t in (needle_text, question_text, answer_text))
    fixed = len(prefix) + len(needle) + len(question) + len(answer) - 1
    n_hay = int(length) - fixed
    if n_hay < 0:
        raise PromptError(f"a {task} prompt needs at least {fixed} tokens with this tokenizer (needle, question and "
                          f"answer); {length} is too short for the needle to fit")
    hay, hay_meta = _haystack(tokenizer, task, n_hay, seed, text)
    pos = _sentence_end_before(tokenizer, hay, round(float(depth) * n_hay)) if task == "needle" else \
        round(float(depth) * n_hay / max(1, len(_encode(tokenizer, FILLER)))) * len(_encode(tokenizer, FILLER))
    pos = min(max(pos, 0), n_hay)
    ids = prefix + hay[:pos] + needle + hay[pos:] + question + answer[:-1]
    assert len(ids) == length, (len(ids), length)
    meta = {"task": task, "depth": float(depth), "seed": int(seed), **meta, **hay_meta}
    return Prompt(ids=ids, answer=answer, answer_text=answer_text, needle_start=len(prefix) + pos,
                  depth_actual=pos / n_hay if n_hay else 0.0, meta=meta)
