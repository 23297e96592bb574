"""Long-context retrieval prompts: needle in a haystack and passkey retrieval, built in token space.

Every prompt is exactly ``length`` tokens long, the length the attention kernel sees: the tokenizer's own prefix
(e.g. Gemma's ``<bos>``), a haystack with one fact hidden at a chosen depth, a question, and the answer's tokens
but the last (teacher forcing: the forward pass scores each answer token from the tokens before it, so the logits
at the last ``len(answer)`` positions say both how likely the answer is and whether greedy decoding returns it).

- **needle**: the haystack is real text from a shipped source (``zyfa.capture.text``: the Lee news corpus, Shakespeare,
  the Python reference), a window chosen by the seed; the needle is ``The special magic number for <key> is
  <value>.`` with a seeded two-word key and a seeded 7-digit value, inserted at a sentence boundary near the depth;
  the question asks for the key's number.
- **passkey**: the haystack is the repeated filler of the passkey test (``The grass is green. The sky is blue. ...``),
  the needle ``The pass key is <value>. Remember it. <value> is the pass key.`` with a seeded 5-digit value.

Tasks with room to fail (issue 41), all on the Paul Graham essays of the standard test (``zyfa.capture.text``'s
``paulgraham``, whatever ``text`` says), in the spirit of RULER (arXiv 2404.06654):

- **niah**: the standard needle test (G. Kamradt): the needle "The best thing to do in San Francisco is eat a
  sandwich and sit in Dolores Park on a sunny day.", the question "What is the best thing to do in San
  Francisco?". The needle is the same in every prompt, so the independent unit (``fact_id``) is the seed's
  haystack window;
- **multikey**: ``MULTIKEY_KEYS`` needles ``The special magic number for <key> is <value>.`` with distinct keys;
  one is asked for (at the depth), the others are distractors at seeded places;
- **multivalue**: ``MULTIVALUE_VALUES`` needles ``One of the special magic numbers for <key> is: <value>.`` for
  one key (the first at the depth, the others at seeded places); the answer lists every value in the order of
  the text;
- **vartrack**: variable tracking: ``VAR <A> = <value>.``, then ``VAR <B> = VAR <A>.`` ... a chain of
  ``VARTRACK_HOPS`` + 1 names, in order, from the depth to the end; the answer names every variable of the chain.

Each seed is one fact (a fresh key, values, names; for niah a fresh haystack window): run 50 or more seeds per
cell for at least 50 independent units; rows carry ``fact_id`` (``<task>/s<seed>``). ``meta["parts"]`` are the
strings a generated answer must contain (:func:`score_generated`).

The depth is the fraction of the haystack before the needle: 0 puts it first, 1 last (just before the question).
Everything is a pure function of (tokenizer, task, length, depth, seed, text), so a resumed run rebuilds the same
prompts, and the row records the sha256 of the token ids.

Exposed: ``TASKS``, ``DEFAULT_TASKS``, ``RULER_TASKS``, ``Prompt``, ``build_prompt``, ``PromptError``,
``min_length``, ``fact_id``, ``score_generated``.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

from zyfa.capture.text import load_text

__all__ = ["DEFAULT_TASKS", "FILLER", "NIAH_NEEDLE", "RULER_TASKS", "TASKS", "Prompt", "PromptError", "build_prompt",
           "fact_id", "min_length", "score_generated", "tokenizer_prefix"]

DEFAULT_TASKS = ("needle", "passkey")
RULER_TASKS = ("niah", "multikey", "multivalue", "vartrack")
TASKS = DEFAULT_TASKS + RULER_TASKS
NIAH_NEEDLE = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."
NIAH_QUESTION = "What is the best thing to do in San Francisco?"
MULTIKEY_KEYS = 4  # the asked key and 3 distractors
MULTIVALUE_VALUES = 4
VARTRACK_HOPS = 4  # 5 variable names in the chain
RULER_TEXT = "paulgraham"
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


def _key(rng: random.Random) -> str:
    return f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"


def _ruler_parts(task: str, rng: random.Random) -> tuple[list[str], str, str, dict]:
    """(needles in the order they must appear, question, answer, meta with ``parts``) of a RULER-style task."""
    if task == "niah":
        q = f"\n\nQuestion: {NIAH_QUESTION}\nAnswer: The best thing to do in San Francisco is"
        return ([f" {NIAH_NEEDLE} "], q, " eat a sandwich and sit in Dolores Park on a sunny day.",
                {"parts": ["sandwich", "Dolores Park"]})
    if task == "multikey":
        keys: list[str] = []
        while len(keys) < MULTIKEY_KEYS:
            k = _key(rng)
            if k not in keys:
                keys.append(k)
        values = [str(rng.randrange(1_000_000, 10_000_000)) for _ in keys]
        needles = [f" The special magic number for {k} is {v}. " for k, v in zip(keys, values, strict=True)]
        q = (f"\n\nQuestion: What is the special magic number for {keys[0]} mentioned in the text above?\n"
             f"Answer: The special magic number for {keys[0]} is")
        return needles, q, f" {values[0]}", {"key": keys[0], "value": values[0], "distractors": keys[1:],
                                              "parts": [values[0]]}
    if task == "multivalue":
        key = _key(rng)
        values = [str(rng.randrange(1_000_000, 10_000_000)) for _ in range(MULTIVALUE_VALUES)]
        needles = [f" One of the special magic numbers for {key} is: {v}. " for v in values]
        q = (f"\n\nQuestion: What are all the special magic numbers for {key} mentioned in the text above?\n"
             f"Answer: The special magic numbers for {key} mentioned in the text are")
        return needles, q, " " + ", ".join(values), {"key": key, "values": values, "parts": values}
    if task == "vartrack":
        names: list[str] = []
        while len(names) < VARTRACK_HOPS + 1:
            n = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
            if n not in names:
                names.append(n)
        value = str(rng.randrange(10_000, 100_000))
        needles = [f" VAR {names[0]} = {value}. "]
        needles += [f" VAR {b} = VAR {a}. " for a, b in zip(names[:-1], names[1:], strict=True)]
        q = (f"\n\nQuestion: Find all variables that are assigned the value {value} in the text above.\n"
             f"Answer: According to the chain of variable assignments in the text above, {len(names)} variables "
             f"are assigned the value {value}, they are:")
        return needles, q, " " + " ".join(names), {"value": value, "names": names, "parts": names}
    raise PromptError(f"unknown task {task!r}; tasks: {', '.join(TASKS)}")


def fact_id(task: str, seed: int) -> str:
    """The independent unit of a prompt: one seed's fact (for niah, whose needle never changes, its haystack)."""
    return f"{task}/s{int(seed)}"


def min_length(tokenizer, task: str) -> int:
    """The fewest tokens a prompt of ``task`` can have (prefix, needle, question, answer; no haystack)."""
    if task in RULER_TASKS:
        needles, question, answer, _ = _ruler_parts(task, _rng(task, 0))
        body = sum(len(_encode(tokenizer, n)) for n in needles)
        return len(tokenizer_prefix(tokenizer)) + body + len(_encode(tokenizer, question)) + \
            len(_encode(tokenizer, answer)) - 1
    needle, question, answer, _ = _parts(task, _rng(task, 0))
    return (len(tokenizer_prefix(tokenizer)) + len(_encode(tokenizer, needle)) + len(_encode(tokenizer, question))
            + len(_encode(tokenizer, answer)) - 1)


def score_generated(text: str, prompt: Prompt) -> dict:
    """A generated answer against the prompt's: ``gen_exact`` (the text, stripped, starts with the answer),
    ``gen_contains`` (every part of the answer occurs in the text; case-insensitive for niah) and ``gen_recall``
    (the fraction of parts that occur)."""
    parts = prompt.meta.get("parts") or [prompt.answer_text.strip()]
    fold = prompt.meta.get("task") == "niah"
    hay = text.lower() if fold else text
    found = [p for p in parts if (p.lower() if fold else p) in hay]
    return {"gen_exact": text.strip().startswith(prompt.answer_text.strip()),
            "gen_contains": len(found) == len(parts), "gen_recall": len(found) / len(parts)}


def _haystack(tokenizer, task: str, n: int, seed: int, text: str) -> tuple[list[int], dict]:
    """``n`` haystack tokens: a seeded window of a text source (needle) or the repeated filler (passkey)."""
    if n <= 0:
        return [], {}
    if task == "passkey":
        unit = _encode(tokenizer, FILLER)
        reps = n // len(unit) + 1
        return (unit * reps)[:n], {"haystack": "passkey filler"}

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
    if task in RULER_TASKS:
        return _build_ruler(tokenizer, task, int(length), float(depth), int(seed))
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


def _build_ruler(tokenizer, task: str, length: int, depth: float, seed: int) -> Prompt:
    """A RULER-style prompt: the first needle at ``depth`` of the haystack (sentence-aligned), the others at seeded
    sentence ends (after the first for vartrack, whose chain must read in order)."""
    rng = _rng(task, seed)
    needle_texts, question_text, answer_text, meta = _ruler_parts(task, rng)
    prefix = tokenizer_prefix(tokenizer)
    needles = [_encode(tokenizer, t) for t in needle_texts]
    question = _encode(tokenizer, question_text)

    def n_hay_for(answer_text: str) -> int:
        return length - (len(prefix) + sum(len(n) for n in needles) + len(question)
                         + len(_encode(tokenizer, answer_text)) - 1)

    n_hay = n_hay_for(answer_text)
    if n_hay < 0:
        raise PromptError(f"a {task} prompt needs at least {length - n_hay} tokens with this tokenizer (needles, "
                          f"question and answer); {length} is too short for the needle to fit")
    slack = 16  # a reordered multivalue answer may tokenize a little longer or shorter
    hay, hay_meta = _haystack(tokenizer, "needle", n_hay + slack, seed, RULER_TEXT)
    first = min(max(_sentence_end_before(tokenizer, hay, round(depth * n_hay)), 0), n_hay)
    lo = first if task == "vartrack" else 0
    others = [min(max(_sentence_end_before(tokenizer, hay, rng.randint(lo, n_hay)), lo), n_hay)
              for _ in needles[1:]]
    if task == "vartrack":
        others.sort()
    places = [first, *others]
    order = sorted(range(len(needles)), key=lambda i: (places[i], i))  # stable: the chain keeps its order
    if task == "multivalue":  # the answer lists the values in the order the text gives them
        values = [meta["values"][i] for i in order]
        answer_text = " " + ", ".join(values)
        meta = {**meta, "values": values, "parts": values}
        n_hay = n_hay_for(answer_text)
        if n_hay < 0:
            raise PromptError(f"a {task} prompt needs at least {length - n_hay} tokens with this tokenizer; "
                              f"{length} is too short for the needle to fit")
        places = [min(p, n_hay) for p in places]
    hay = hay[:n_hay]
    answer = _encode(tokenizer, answer_text)
    ids, start, prev = list(prefix), 0, 0
    for i in order:
        ids += hay[prev:places[i]]
        if i == 0:
            start = len(ids)
        ids += needles[i]
        prev = max(prev, places[i])
    ids += hay[prev:] + question + answer[:-1]
    assert len(ids) == length, (len(ids), length)
    meta = {"task": task, "depth": depth, "seed": seed, "fact_id": fact_id(task, seed), **meta, **hay_meta}
    return Prompt(ids=ids, answer=answer, answer_text=answer_text, needle_start=start,
                  depth_actual=first / n_hay if n_hay else 0.0, meta=meta)
