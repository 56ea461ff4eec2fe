"""Resident-memory readings of the benchmark scripts (Linux ``/proc/self``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def status_kib(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status``: ``VmRSS`` (resident set now), ``VmHWM`` (its
    high-water mark)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> None:
    """Reset the high-water mark ``VmHWM`` to the current resident set."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mib(fn: Callable[[], Any]) -> float:
    """Peak resident memory above the current level while running ``fn``, in MiB."""
    reset_peak()
    before = status_kib("VmRSS")
    fn()
    return (status_kib("VmHWM") - before) / 1024
