"""H-matrix attention vs flat softmax attention (SDPA) vs the PyPI package `h-transformer-1d`.

Forward+backward wall time (median over interleaved repetitions, so all methods
see the same machine load), peak resident memory of one forward+backward, and
errors: against the implied dense H-matrix (ours), against exact softmax
attention (all methods, head 0), and the output for V = 1 (a row-normalised
attention returns exactly 1). Batch 1, 8 heads, d = 64, block size Nr = 16, float32.

    python benchmarks/hmatrix.py            # L = 1K, 4K, 16K, 64K (a few minutes)
    python benchmarks/hmatrix.py --quick    # L = 1K, 4K

Writes benchmarks/results/hmatrix.json and benchmarks/results/hmatrix.png.
The package is optional (`pip install h-transformer-1d --no-deps einops
rotary-embedding-torch`); its column is skipped when it is not importable. Its
core attention is timed with its input/output projections replaced by identities.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from hiergraph.ops.hmatrix import hmatrix_attention, hmatrix_attention_dense

HEADS, DIM, BLOCK = 8, 64, 16
SDPA_MAX_LENGTH = 16384  # flat attention beyond this is projected (O(L^2) time)
DENSE_MAX_LENGTH = 4096  # implied dense matrix reference (O(L^2) memory)
ERROR_MAX_LENGTH = 16384  # exact-softmax references
RESULTS = Path(__file__).resolve().parent / "results"


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _peak_mib(fn) -> float:
    """Peak resident memory above the current level while running ``fn`` (Linux)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # reset VmHWM
    before = _rss_kib("VmRSS")
    fn()
    return (_rss_kib("VmHWM") - before) / 1024


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


def _methods(q, k, v, causal: bool, package) -> dict:
    """name -> function of (q, k, v) returning ``[1, H, L, d]``."""
    length = q.shape[2]
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


def _time_all(methods: dict, inputs, repeats: int, warmup: bool) -> tuple[dict, dict]:
    def step(fn):
        for x in inputs:
            x.grad = None
        return _peak_mib(lambda: fn(*inputs).sum().backward())

    peaks = {name: step(fn) for name, fn in methods.items() if warmup}
    times = {name: [] for name in methods}
    for _ in range(repeats):  # interleaved: every method sees the same load
        for name, fn in methods.items():
            start = time.perf_counter()
            peak = step(fn)
            times[name].append(time.perf_counter() - start)
            peaks[name] = max(peaks.get(name, 0.0), peak)
    return times, peaks


@torch.no_grad()
def _errors(methods: dict, q, k, v, causal: bool) -> dict:
    """Per method: max error vs exact softmax (head 0) and |out - 1| for V = 1."""
    length = q.shape[2]
    q64, k64, v64 = (x[:, :1].double() for x in (q, k, v))
    softmax = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal)
    errors = {}
    for name, fn in methods.items():
        if name == "sdpa":
            continue
        out = fn(q, k, v)
        errors[name] = {
            "max_err_vs_softmax": (out[:, :1].double() - softmax).abs().max().item(),
            "max_err_ones": (fn(q, k, torch.ones_like(v)) - 1).abs().max().item(),
        }
    if length <= DENSE_MAX_LENGTH:
        reference, kind = hmatrix_attention_dense(q64, k64, v64, BLOCK, causal), "dense float64"
    else:
        reference, kind = hmatrix_attention(q64, k64, v64, BLOCK, causal), "fast float64"
    ours = methods["hmatrix"](q, k, v)[:, :1].double()
    errors["hmatrix"]["max_err_vs_implied"] = (ours - reference).abs().max().item()
    errors["hmatrix"]["implied_reference"] = kind
    return errors


def run(lengths: list[int], repeats: int) -> dict:
    package = _package()
    rows = []
    for length in lengths:
        gen = torch.Generator().manual_seed(length)
        inputs = [torch.randn(1, HEADS, length, DIM, generator=gen) for _ in range(3)]
        for x in inputs:
            x.requires_grad_()
        for causal in (False, True):
            methods = _methods(*inputs, causal, package)
            times, peaks = _time_all(methods, inputs, repeats, warmup=length < SDPA_MAX_LENGTH)
            errors = _errors(methods, *inputs, causal) if length <= ERROR_MAX_LENGTH else {}
            for name in methods:
                rows.append(
                    {
                        "length": length,
                        "causal": causal,
                        "method": name,
                        "median_s": statistics.median(times[name]),
                        "min_s": min(times[name]),
                        "times_s": times[name],
                        "peak_mib": peaks[name],
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
    return {
        "config": {"batch": 1, "heads": HEADS, "dim": DIM, "block_size": BLOCK, "dtype": "float32"},
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "package_installed": package is not None,
        "rows": rows,
        "ratios": _ratios(rows),
    }


def _project(rows: list[dict], length: int) -> float:
    """Flat attention time at ``length`` from the largest measured one, scaled as L^2."""
    measured = [r for r in rows if r["method"] == "sdpa" and r["causal"] == rows[-1]["causal"]]
    last = max(measured, key=lambda r: r["length"])
    return last["median_s"] * (length / last["length"]) ** 2


def _ratios(rows: list[dict]) -> dict:
    """Side-by-side speed-ups of ours: other method's median (and min) / ours, per (L, causal)."""
    ratios = {}
    for row in rows:
        if row["method"] != "hmatrix":
            continue
        key = f"L={row['length']},causal={row['causal']}"
        for other in rows:
            same = other["length"] == row["length"] and other["causal"] == row["causal"]
            if same and other is not row and "median_s" in other:
                ratios.setdefault(key, {})[other["method"]] = other["median_s"] / row["median_s"]
            if same and other is not row and "min_s" in other:
                ratios[key][other["method"] + " (min)"] = other["min_s"] / row["min_s"]
        ratios[key]["memory_fraction_of_L^2_matrix"] = row["peak_mib"] / (
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
    fig.suptitle(
        f"B=1, H={HEADS}, d={DIM}, Nr={BLOCK}, float32, {result['machine']['threads']} threads"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="L = 1K and 4K only, 3 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed repetitions (default 5)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="output folder")
    args = parser.parse_args()
    lengths = [1024, 4096] if args.quick else [1024, 4096, 16384, 65536]
    result = run(lengths, args.repeats or (3 if args.quick else 5))
    result["command"] = "python benchmarks/hmatrix.py" + (" --quick" if args.quick else "")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hmatrix.json").write_text(json.dumps(result, indent=2))
    plot(result, args.out / "hmatrix.png")
    print(json.dumps(result["ratios"], indent=2))


if __name__ == "__main__":
    main()
