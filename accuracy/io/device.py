"""The device a run uses, whether an input fits in its memory, and the progress bar, for every measuring command.

Exposed:
    resolve_device(device) -> torch.device           "auto" -> cuda when available else cpu
    memory_estimate_bytes(shape, device), check_memory(shape, device, what), available_bytes(device)
    sync_device(device)                              wait for the device's queued work (wall times measure it)
    progress_bar(total, *, enabled, unit, desc)      a tqdm bar on stderr, or a silent stand-in
    ORACLE_CHUNK                                     query rows per block of the FP64 oracle
"""

from __future__ import annotations

import os
import sys

import torch

__all__ = ["ORACLE_CHUNK", "available_bytes", "check_memory", "memory_estimate_bytes", "progress_bar",
           "resolve_device", "sync_device"]

# Query rows per block of the FP64 oracle (run_accuracy's chunk_size default).
ORACLE_CHUNK = 1024


def resolve_device(device: str | torch.device) -> torch.device:
    """"auto" -> cuda when available else cpu; "cuda" without a GPU -> ValueError."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but no CUDA device is available (use --device cpu or auto)")
    return dev


def memory_estimate_bytes(shape: dict, device: str | torch.device = "cpu", *, chunk_size: int = ORACLE_CHUNK,
                          block_n: int = 128) -> int:
    """Peak bytes one input of ``shape`` (``AttentionInput.shape``) needs in :func:`run_accuracy`, roughly.

    Terms (from the code paths, and checked against measured peaks on CPU): about 30 float32 copies of the
    largest of Q/K/V (inputs, dequantized copies, K/V expanded to the query heads, the accumulator), a few
    float64 score blocks of the FP64 oracle (one GQA group × ``chunk_size`` rows × all keys) and the
    emulator's score tiles (all heads × a query chunk × ``block_n`` keys, about 12 live copies).
    """
    b, h, h_kv = shape["batch"], shape["heads_q"], shape["heads_kv"]
    s_q, s_k = shape["seq_q"], shape["seq_k"]
    d = max(shape["head_dim"], shape["head_dim_v"])
    tensors = 30 * 4 * b * h * max(s_q, s_k) * d
    group = h // max(1, h_kv)
    oracle = 4 * 8 * group * min(chunk_size, s_q) * s_k
    q_chunk = 2048 if torch.device(device).type == "cpu" else max(2048, (1 << 24) // max(1, b * h * block_n))
    tiles = 12 * 4 * b * h * min(q_chunk, s_q) * block_n
    return int(tensors + oracle + tiles)


def available_bytes(dev: torch.device) -> int | None:
    """Free memory of ``dev`` in bytes (CUDA: free device memory; CPU: MemAvailable), None where unknown."""
    if dev.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(dev)[0])
        except (RuntimeError, AssertionError):
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(shape: dict, device: str | torch.device = "cpu", what: str = "input") -> int:
    """ValueError (one line) when ``shape`` needs more memory than ``device`` has free; returns the estimate."""
    dev = torch.device(device)
    need = memory_estimate_bytes(shape, dev)
    have = available_bytes(dev)
    if have is not None and need > have:
        dims = (f"batch {shape['batch']}, heads {shape['heads_q']}/{shape['heads_kv']}, "
                f"seq {shape['seq_q']}/{shape['seq_k']}, head dim {shape['head_dim']}/{shape['head_dim_v']}")
        raise ValueError(f"{what} ({dims}) needs about {need / 2**30:.1f} GiB, but {dev.type} has "
                         f"{have / 2**30:.1f} GiB free: use fewer heads, tokens or a smaller batch")
    return need


def sync_device(dev: torch.device) -> None:
    """Wait for the device's queued work (CUDA), so wall times measure it."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class _NoBar:
    def set_postfix_str(self, *a, **k):
        pass

    def update(self, n=1):
        pass

    def close(self):
        pass


def progress_bar(total: int, *, enabled: bool, unit: str = "run", desc: str = "accuracy"):
    """A tqdm bar on stderr (a silent stand-in when disabled or tqdm is missing)."""
    if not enabled:
        return _NoBar()
    try:
        # lazy: tqdm is optional (a silent stand-in without it)
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, file=sys.stderr, unit=unit, desc=desc, dynamic_ncols=True)
