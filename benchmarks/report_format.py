"""Numbers, durations, accuracies and Markdown tables as the report writes them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable


def num(x: float | None, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits, no exponent for ordinary magnitudes."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if x == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(x)))
    if magnitude < -3 or magnitude >= 7:
        return f"{x:.{digits - 1}e}"
    decimals = max(digits - 1 - magnitude, 0)
    return f"{x:,.{decimals}f}"


def secs(s: float | None) -> str:
    """A duration in seconds, in ms below one second."""
    if s is None:
        return "–"
    return f"{num(s * 1e3)} ms" if abs(s) < 1 else f"{num(s)} s"


def ratio(x: float | None) -> str:
    return "–" if x is None else f"{num(x)}×"


def threads(n) -> str:
    return f"{n} thread" if n == 1 else f"{n} threads"


def acc(x: float | None) -> str:
    return "–" if x is None else f"{x:.4f}"


def spread(samples: list[float], unit: Callable[[float], str] = secs) -> str:
    """``median [min–max] ×n`` of ``samples`` (one sample: the value and ``×1``)."""
    samples = [s for s in samples if s is not None]
    if not samples:
        return "–"
    median = unit(statistics.median(samples))
    if len(samples) == 1:
        return f"{median} ×1"
    return f"{median} [{unit(min(samples))}–{unit(max(samples))}] ×{len(samples)}"


def mean_std(values: list[float], digits: int = 4) -> str:
    """``mean ± std [min–max]`` over seeds (sample std)."""
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    std = statistics.stdev(values)
    return f"{mean:.{digits}f} ± {std:.{digits}f} [{min(values):.3f}–{max(values):.3f}]"


def table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines + [""]


def code(text: str) -> str:
    return "`" + text.replace("`", "'") + "`"


def allocator(meta: dict) -> str:
    """How the run's CPU allocator was set (runs that predate the option used glibc's)."""
    if meta.get("allocator") == "reuse":
        return "freed memory reused (`hiergraph.runtime.reuse_freed_memory`)"
    return "glibc's default allocator"


def median_int(values: list | None) -> str:
    return f"{statistics.median(values):g}" if values else "–"
