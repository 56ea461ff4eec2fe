r"""Process-level settings: CPU allocation that makes large-tensor workloads faster, and the
thread count and progress bars of the example scripts.

On Linux with glibc, every allocation larger than the *mmap threshold* (at
most 32 MiB by default) gets fresh pages from the kernel and gives them back
when freed. A training step that creates and frees the same large buffers
again and again (the packed levels of :func:`~hiergraph.ops.hmatrix_attention`,
attention blocks, activations) then pays a page fault for every 4 KiB it
touches, each step. On the 16K-token H-matrix forward+backward this was about
half of the CPU time (1.4 M minor faults per step).

:func:`reuse_freed_memory` raises the mmap and trim thresholds, so that freed
blocks stay in the process and are reused by the next step, the effect that
PyTorch's CPU tuning guide gets from ``LD_PRELOAD``-ing jemalloc or tcmalloc.
The trade-off: the resident set no longer shrinks when tensors are freed (it
stays at the step's peak), which is what a training loop wants and a
long-lived mixed-workload process may not.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import stat
import sys

import torch
from tqdm import tqdm

from hiergraph._checks import check_int

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def reuse_freed_memory(threshold_bytes: int = 2**31) -> bool:
    """Keep freed blocks below ``threshold_bytes`` in the process for reuse (glibc only).

    Sets glibc's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` through
    ``mallopt`` for the whole process (call it once, early). Blocks larger
    than ``threshold_bytes`` are still mmapped and returned on free.

    Args:
        threshold_bytes: allocation size up to which freed memory is kept,
            a positive int below 2**31 + 1 (glibc's ``int`` argument).

    Returns:
        ``True`` if the settings were applied; ``False`` where there is no
        glibc (macOS, Windows, musl), which leaves the process unchanged.
    """
    if isinstance(threshold_bytes, bool) or not isinstance(threshold_bytes, int):
        raise TypeError(f"threshold_bytes must be an int, got {type(threshold_bytes).__name__}")
    if not 0 < threshold_bytes <= 2**31:
        raise ValueError(f"threshold_bytes must be in (0, 2**31], got {threshold_bytes}")
    libc = _glibc()
    if libc is None:
        return False
    value = min(threshold_bytes, 2**31 - 1)  # mallopt takes a C int
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, value)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, value)
    )


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") else None  # glibc, not musl


def default_threads(limit: int = 2) -> int:
    """A thread count for a script that shares the machine: torch's default, at most
    ``limit`` and at most the cores the rest of the machine leaves idle (1-minute load
    average). More threads than free cores make every small op wait on a busy one."""
    check_int(limit, "limit")  # (0, -5 and 2.7 gave 1)
    cores = os.cpu_count() or limit  # (None where Python cannot tell)
    idle = cores - os.getloadavg()[0] if hasattr(os, "getloadavg") else limit
    return max(1, min(limit, torch.get_num_threads(), round(idle)))


def progress(iterable=None, **kwargs) -> tqdm:
    """A progress bar on stderr, redrawn at most once a second, and not drawn into a regular
    file (a log, where every redraw would be a line; terminals, pipes and notebooks show it).
    ``kwargs`` are ``tqdm``'s: the caller's ``mininterval``, ``dynamic_ncols`` and
    ``disable`` win."""
    log = _is_regular_file(kwargs.get("file") or sys.stderr)
    defaults = {"mininterval": 1.0, "dynamic_ncols": True, "disable": log}
    return tqdm(iterable, **{**defaults, **kwargs})


def _is_regular_file(stream) -> bool:
    """Whether ``stream`` writes to a regular file (not a terminal, a pipe or a notebook's
    stream, which has no file descriptor)."""
    try:
        return stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):  # (io.UnsupportedOperation is both)
        return False


def apply_budget(args, quick: dict, paper: dict) -> None:
    """Fill the options of an example script that were left at ``None`` with its quick
    defaults, or with the paper's protocol when ``args.paper`` is set; options given
    explicitly win."""
    for key, value in (paper if args.paper else quick).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
