"""H-matrix attention vs flat softmax attention (SDPA) vs the PyPI package `h-transformer-1d`.

Per sequence length L and mode (bidirectional, causal), batch 1, 8 heads, d = 64,
block size Nr = 16, float32, 2 threads:

- forward+backward wall time: the methods run interleaved (one call of each per
  round, so all see the same machine load) and the medians are compared; flat
  SDPA at 16K gets fewer rounds (it is slow) and beyond 16K it is not run (its
  time is projected as L^2 from 16K); at 64K every method gets fewer rounds;
- the allocator: by default every method runs after
  ``hiergraph.runtime.reuse_freed_memory()`` (freed buffers are reused, not
  page-faulted in again each step; ``--allocator default`` keeps glibc's
  settings and writes ``hmatrix_default_allocator.json``);
- peak resident memory of one forward+backward above the level before it
  (VmHWM, Linux; measured after all timings, with exact RSS accounting),
  next to the projected L^2 attention matrix of flat
  attention (8 heads x L^2 x 4 bytes; torch's CPU SDPA is a flash-style kernel
  that never stores it, so its measured peak is small);
- errors on a fixed sample of query rows (all heads), in float64 references:
  ours against the implied dense H-matrix (the same hierarchy, built densely
  from the closed form of the level map, independently of the fast path),
  every method against exact softmax attention, the deviation from 1 when
  V = 1 (a row-normalised attention returns exactly 1), and, at L = 1K, the
  fraction of the allowed keys (all, or j <= i) that reach a row at all
  (nonzero gradient of the row's output with respect to the values).

    python benchmarks/hmatrix.py            # L = 1K, 4K, 16K, 64K
    python benchmarks/hmatrix.py --quick    # L = 1K, 4K

Writes ``hmatrix.json`` and ``hmatrix.png`` into ``--out`` (a folder; default
``benchmarks/results``). A ``--quick`` run writes into ``benchmarks/results`` only when
``--out`` names it, else into a fresh temporary folder, printed.
The package is optional (`pip install --no-deps h-transformer-1d einops
rotary-embedding-torch`); its column is skipped when it is not importable. Its
core attention is timed with its input/output projections replaced by identities.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import timing
import torch
import torch.nn.functional as F
from memory import peak_rss_mib
from torch import nn

from hiergraph.ops.hmatrix import hmatrix_attention, hmatrix_attention_dense

HEADS, DIM, BLOCK, THREADS = 8, 64, 16, 2
SDPA_MAX_LENGTH = 16384  # flat attention beyond this is projected (O(L^2) time)
SDPA_SLOW_LENGTH = 16384  # flat SDPA from here on: --sdpa-rounds rounds
LONG_LENGTH = 65536  # every method from here on: --long-rounds rounds
SAMPLED_ROWS = 64  # query rows of the error references
RECEPTIVE_LENGTH = 1024  # where the fraction of keys seen is measured


def _exact_rss() -> None:
    """Make resident memory track live tensors (glibc): large blocks are always mmapped
    (no adaptive threshold), so a freed tensor leaves RSS at once."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
    libc.malloc_trim(0)


def _peak_mib(fn) -> float:
    """Peak resident memory above the current level while running ``fn`` (Linux)."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return peak_rss_mib(fn)


def _package():
    try:
        from h_transformer_1d.h_transformer_1d import CausalHAttention1D, HAttention1D
    except ImportError:
        return None
    return HAttention1D, CausalHAttention1D


def _package_core(length: int, causal: bool, classes) -> nn.Module:
    bidirectional, causal_class = classes
    kwargs = {"heads": HEADS, "dim_head": DIM, "block_size": BLOCK}
    if causal:
        module = causal_class(HEADS * DIM, max_seq_len=length, **kwargs)
    else:
        module = bidirectional(HEADS * DIM, **kwargs)
    module.to_qkv, module.to_out = nn.Identity(), nn.Identity()
    return module


def _methods(length: int, causal: bool, package) -> dict:
    """name -> function of (q, k, v) ``[1, H, L, d]`` returning ``[1, H, L, d]``."""
    methods = {"hmatrix": lambda q, k, v: hmatrix_attention(q, k, v, BLOCK, causal)}
    if length <= SDPA_MAX_LENGTH:
        methods["sdpa"] = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if package is not None:
        core = _package_core(length, causal, package)

        def run_package(q, k, v):
            merged = torch.cat([x.transpose(1, 2).flatten(2) for x in (q, k, v)], dim=-1)
            return core(merged).unflatten(-1, (HEADS, DIM)).transpose(1, 2)

        methods["h-transformer-1d"] = run_package
    return methods


def _step(fn, inputs) -> None:
    """One forward+backward of ``fn`` on fresh gradients."""
    for x in inputs:
        x.grad = None
    fn(*inputs).sum().backward()


def _time_all(methods: dict, inputs, repeats: dict) -> dict:
    """Interleaved rounds; ``repeats[name]`` rounds per method. Returns the times."""
    times = {name: [] for name in methods}
    for round_ in range(max(repeats.values())):
        for name, fn in methods.items():
            if round_ < repeats[name]:
                start = time.perf_counter()
                _step(fn, inputs)
                times[name].append(time.perf_counter() - start)
    return times


def _inputs(length: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(length)
    return [torch.randn(1, HEADS, length, DIM, generator=gen).requires_grad_() for _ in range(3)]


def _sample_rows(length: int) -> torch.Tensor:
    """Fixed query rows: both ends and evenly spread ones in between."""
    return torch.linspace(0, length - 1, SAMPLED_ROWS).round().long().unique()


@torch.no_grad()
def _errors(methods: dict, q, k, v, causal: bool) -> dict:
    """Per method, on the sampled rows (all heads): errors against float64 references."""
    length = q.shape[2]
    rows = _sample_rows(length)
    q64, k64, v64 = (x.double() for x in (q, k, v))
    logits = q64[:, :, rows] @ k64.transpose(-1, -2) / DIM**0.5
    if causal:
        logits = logits.masked_fill(torch.arange(length) > rows[:, None], -float("inf"))
    softmax = torch.softmax(logits, -1) @ v64
    implied = hmatrix_attention_dense(q64, k64, v64, BLOCK, causal, rows=rows)
    errors = {}
    for name, fn in methods.items():
        out = fn(q, k, v)[:, :, rows].double()
        errors[name] = {
            "max_err_vs_softmax": (out - softmax).abs().max().item(),
            "max_err_ones": (fn(q, k, torch.ones_like(v)) - 1).abs().max().item(),
        }
        if name == "hmatrix":
            errors[name]["max_err_vs_implied"] = (out - implied).abs().max().item()
    errors["sampled_rows"] = len(rows)
    return errors


def _keys_seen(methods: dict, q, k, v, causal: bool) -> dict:
    """Mean fraction of the allowed keys whose value reaches a row's output (sampled rows)."""
    seen = {}
    v = v.detach().requires_grad_()
    for name, fn in methods.items():
        out = fn(q.detach(), k.detach(), v)
        fractions = []
        for row in _sample_rows(q.shape[2])[:: SAMPLED_ROWS // 4].tolist():
            (grad,) = torch.autograd.grad(out[0, 0, row].sum(), v, retain_graph=True)
            reached = grad[0, 0].abs().sum(-1) > 0
            allowed = row + 1 if causal else q.shape[2]
            fractions.append(reached[:allowed].sum().item() / allowed)
        seen[name] = {"keys_seen_fraction": statistics.mean(fractions)}
    return seen


def run(
    lengths: list[int], repeats: int, sdpa_rounds: int, long_rounds: int, allocator: str
) -> dict:
    torch.set_num_threads(THREADS)
    timing.apply_allocator(allocator)
    package = _package()
    rows = []
    for length in lengths:
        inputs = _inputs(length)
        for causal in (False, True):
            methods = _methods(length, causal, package)
            counts = {name: repeats if length < LONG_LENGTH else long_rounds for name in methods}
            if "sdpa" in counts and length >= SDPA_SLOW_LENGTH:
                counts["sdpa"] = min(repeats, sdpa_rounds)
            times = _time_all(methods, inputs, counts)
            errors = _errors(methods, *inputs, causal)
            if length == RECEPTIVE_LENGTH:
                for name, values in _keys_seen(methods, *inputs, causal).items():
                    errors[name] |= values
            for name in methods:
                rows.append(
                    {
                        "length": length,
                        "causal": causal,
                        "method": name,
                        "median_s": statistics.median(times[name]),
                        "min_s": min(times[name]),
                        "times_s": times[name],
                        "sampled_rows": errors["sampled_rows"],
                        **errors.get(name, {}),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
            # flat attention's O(L^2) attention matrix, for the memory comparison
            rows.append(
                {
                    "length": length,
                    "causal": causal,
                    "method": "sdpa (projected L^2 matrix)",
                    "peak_mib": HEADS * length**2 * 4 / 2**20,
                    **({} if length <= SDPA_MAX_LENGTH else {"median_s": _project(rows, length)}),
                }
            )
    # Memory last, in its own pass: exact RSS accounting changes the allocator for good.
    _exact_rss()
    for length in lengths:
        inputs = _inputs(length)
        for causal in (False, True):
            for name, fn in _methods(length, causal, package).items():
                row = next(
                    r for r in rows
                    if (r["length"], r["causal"], r["method"]) == (length, causal, name)
                )  # fmt: skip
                row["peak_mib"] = _peak_mib(lambda fn=fn, x=inputs: _step(fn, x))
    return {
        "config": {
            "batch": 1,
            "heads": HEADS,
            "dim": DIM,
            "block_size": BLOCK,
            "dtype": "float32",
            "threads": THREADS,
            "repeats": repeats,
            "sdpa_rounds_from_16k": sdpa_rounds,
            "rounds_at_64k": long_rounds,
            "allocator": allocator,
        },
        "machine": {"platform": platform.platform(), "torch": torch.__version__},
        "package_version": _package_version(),
        "rows": rows,
        "ratios": _ratios(rows),
    }


def _package_version() -> str | None:
    try:
        return importlib.metadata.version("h-transformer-1d")
    except importlib.metadata.PackageNotFoundError:
        return None


def _project(rows: list[dict], length: int) -> float:
    """Flat attention time at ``length`` from the largest measured one, scaled as L^2."""
    measured = [r for r in rows if r["method"] == "sdpa" and r["causal"] == rows[-1]["causal"]]
    last = max(measured, key=lambda r: r["length"])
    return last["median_s"] * (length / last["length"]) ** 2


def _ratios(rows: list[dict]) -> dict:
    """Speed-ups of ours (other method's median / ours) and memory vs the L^2 matrix."""
    ratios = {}
    for row in rows:
        if row["method"] != "hmatrix":
            continue
        key = f"L={row['length']},causal={row['causal']}"
        for other in rows:
            same = other["length"] == row["length"] and other["causal"] == row["causal"]
            if same and other is not row and "median_s" in other:
                ratios.setdefault(key, {})[other["method"]] = other["median_s"] / row["median_s"]
        ratios.setdefault(key, {})["memory_fraction_of_L^2_matrix"] = row["peak_mib"] / (
            HEADS * row["length"] ** 2 * 4 / 2**20
        )
    return ratios


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(11, 4.2))
    methods = sorted({r["method"] for r in result["rows"]})
    for method in methods:
        for causal, style in ((False, "-"), (True, "--")):
            rows = [r for r in result["rows"] if r["method"] == method and r["causal"] == causal]
            label = f"{method} ({'causal' if causal else 'bidir.'})"
            timed = [r for r in rows if "median_s" in r]
            if timed:
                ax_time.plot([r["length"] for r in timed], [r["median_s"] for r in timed],
                             style, marker="o", label=label)  # fmt: skip
            ax_mem.plot([r["length"] for r in rows], [r["peak_mib"] for r in rows],
                        style, marker="o", label=label)  # fmt: skip
    for ax, title in ((ax_time, "forward+backward time [s]"), (ax_mem, "peak memory [MiB]")):
        ax.set(xscale="log", yscale="log", xlabel="sequence length L", title=title)
        ax.grid(True, which="both", alpha=0.3)
    ax_time.legend(fontsize=7)
    config = result["config"]
    fig.suptitle(
        f"B=1, H={HEADS}, d={DIM}, Nr={BLOCK}, float32, {config['threads']} threads "
        "(SDPA beyond 16K: projected as L^2)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="L = 1K and 4K only, 3 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5)")
    parser.add_argument("--sdpa-rounds", type=int, default=2, help="rounds of flat SDPA at 16K")
    parser.add_argument("--long-rounds", type=int, default=3, help="rounds of every method at 64K")
    timing.add_allocator_option(parser)
    timing.add_out_option(parser, "", "output folder")
    args = parser.parse_args()
    args.out = timing.output_path(args.out, "", args.quick)
    lengths = [1024, 4096] if args.quick else [1024, 4096, 16384, 65536]
    repeats = args.repeats or (3 if args.quick else 5)
    result = run(lengths, repeats, args.sdpa_rounds, args.long_rounds, args.allocator)
    result["command"] = timing.command_line("hmatrix.py", sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    name = "hmatrix" if args.allocator == "reuse" else "hmatrix_default_allocator"
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2))
    plot(result, args.out / f"{name}.png")
    print(json.dumps(result["ratios"], indent=2))


if __name__ == "__main__":
    main()
