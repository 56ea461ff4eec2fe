"""One VCC layer vs one full-attention layer: time, peak memory and VIP-output error vs length.

Setup: batch 1, d = 256, 4 heads, FFN 1024 (GELU, pre-LN
``nn.TransformerEncoderLayer``), 32 VIP tokens, two resolutions with block size
k = 16 and h = 90 refined blocks (the paper's 16K setting), float32.

* **time**: forward + backward (gradients for the input and all weights), median over
  repetitions interleaved with the full layer so both see the same machine load.
  "VCC layer" is the whole :class:`~hiergraph.nn.VCCEncoder` with one layer: VIP
  permutation, tree build, selection, the layer on ``[P; S_c C]``, tree update,
  materialisation and un-permutation. The full layer runs on all ``n`` tokens
  (PyTorch's SDPA). Beyond ``--full-max`` the full layer is not run; its time is
  projected as ``n^2`` from the largest measured length and labelled as projected.
* **memory**: peak resident memory of the process above its level before the step
  (Linux ``VmHWM`` after a reset), forward + backward.
* **error**: relative error of the VIP rows' layer *update* against the full layer,
  ``|vcc[P] - full[P]| / |full[P] - x[P]|`` (stricter than comparing outputs, which
  are dominated by the residual), and of the outputs, ``|vcc[P] - full[P]| / |full[P]|``.
  Two synthetic inputs, both reported:

  - ``trained_like``: attention is peaked and segment means are representative.
    Non-VIP tokens are a smooth background (white noise smoothed along the
    sequence by a Gaussian of std 8 tokens, unit variance per feature, plus 0.1
    white noise); 4 spans of 16 tokens at random places are "needles" (background
    + 3 x the mean VIP vector); the 32 VIP tokens are N(0, 1) vectors. W_Q = W_K =
    one random orthogonal matrix, so a VIP query scores tokens by similarity
    (needle logits about 8 per head, background about N(0, 1)); other weights
    are PyTorch's default initialisation.
  - ``iid``: every token N(0, 1), default initialisation (near-uniform attention).

    python benchmarks/vcc.py --threads 1   # n = 4K, 16K, 64K, 128K (~10 min; README table)
    python benchmarks/vcc.py --quick       # n = 4K, 16K with fewer repetitions

On a shared, oversubscribed machine use ``--threads 1``: with 2 OpenMP threads per
process, thread contention slows VCC's many medium-sized ops far more than the full
layer's few large ones (the thread count is recorded in the JSON).

Writes ``vcc.json`` and ``vcc.png`` into ``--out`` (a folder; default
``benchmarks/results``). A ``--quick`` run writes into ``benchmarks/results`` only when
``--out`` names it, else into a fresh temporary folder, printed.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import timing
import torch
import torch.nn.functional as F
from memory import peak_rss_mib

from hiergraph.nn.vcc import VCCEncoder, run_layer

DIM, HEADS, FF, NUM_VIP, BLOCK, REFINED = 256, 4, 1024, 32, 16, 90


def _encoder(trained_like: bool, seed: int = 0) -> VCCEncoder:
    torch.manual_seed(seed)
    enc = VCCEncoder(1, DIM, HEADS, FF, block_size=BLOCK, num_refined=REFINED, vip_slots=NUM_VIP)
    if trained_like:
        ortho = torch.linalg.qr(torch.randn(DIM, DIM))[0]
        with torch.no_grad():
            enc.layers[0].self_attn.in_proj_weight[: 2 * DIM] = torch.cat([ortho, ortho])
    return enc


def _inputs(n: int, trained_like: bool, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [1, n, DIM]`` and the VIP mask (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    vip = torch.zeros(1, n, dtype=torch.bool)
    vip[0, torch.randperm(n, generator=gen)[:NUM_VIP]] = True
    x = torch.randn(1, n, DIM, generator=gen)
    if trained_like:
        offsets = torch.arange(-32, 33, dtype=torch.float32)
        kernel = torch.exp(-0.5 * (offsets / 8) ** 2)
        kernel = (kernel / kernel.norm()).expand(DIM, 1, -1)
        smooth = F.conv1d(x.transpose(1, 2), kernel, padding=32, groups=DIM).transpose(1, 2)
        x = smooth / smooth.std() + 0.1 * torch.randn(1, n, DIM, generator=gen)
        direction = torch.randn(NUM_VIP, DIM, generator=gen)
        for start in torch.randint(0, n - 16, (4,), generator=gen).tolist():
            x[0, start : start + 16] += 3 * direction.mean(0) / direction.mean(0).std()
        x[vip] = direction
    return x, vip


def _full(enc: VCCEncoder, x: torch.Tensor) -> torch.Tensor:
    return run_layer(enc.layers[0], x, torch.zeros(x.shape[:2], dtype=x.dtype))


def _timed(fn, x) -> tuple[float, float]:
    def step():
        x.grad = None
        fn(x).sum().backward()

    start = time.perf_counter()
    peak = peak_rss_mib(step)
    return time.perf_counter() - start, peak


@torch.no_grad()
def _errors(n: int) -> dict:
    out = {}
    for kind in ("trained_like", "iid"):
        enc = _encoder(kind == "trained_like")
        x, vip = _inputs(n, kind == "trained_like")
        full, ours = _full(enc, x), enc(x, vip)
        diff = (ours - full)[vip].norm()
        out[kind] = {
            "vip_update_rel_error": (diff / (full - x)[vip].norm()).item(),
            "vip_output_rel_error": (diff / full[vip].norm()).item(),
        }
    return out


def run(lengths: list[int], full_max: int, error_max: int, repeats: dict) -> dict:
    rows = []
    for n in lengths:
        enc = _encoder(True)
        x, vip = _inputs(n, True)
        x.requires_grad_()
        methods = {"vcc": lambda x, enc=enc, vip=vip: enc(x, vip)}
        if n <= full_max:
            methods["full"] = lambda x, enc=enc: _full(enc, x)
        times = {name: [] for name in methods}
        peaks = {name: 0.0 for name in methods}
        for _ in range(repeats.get(n, 2)):  # interleaved
            for name, fn in methods.items():
                seconds, peak = _timed(fn, x)
                times[name].append(seconds)
                peaks[name] = max(peaks[name], peak)
        errors = _errors(n) if n <= error_max else {}
        r = NUM_VIP + -(-n // BLOCK) + REFINED * (BLOCK - 1)  # the static row count
        for name in methods:
            rows.append(
                {
                    "n": n,
                    "method": name,
                    "compressed_length": r if name == "vcc" else n,
                    "median_s": statistics.median(times[name]),
                    "times_s": times[name],
                    "peak_mib": peaks[name],
                    **({"errors": errors} if name == "vcc" else {}),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    _project_full(rows)
    return {
        "config": {
            "batch": 1,
            "dim": DIM,
            "heads": HEADS,
            "ff_dim": FF,
            "num_vip": NUM_VIP,
            "block_size": BLOCK,
            "num_refined": REFINED,
            "dtype": "float32",
            "layer": "nn.TransformerEncoderLayer(norm_first=True, activation='gelu')",
        },
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "rows": rows,
        "speedup_full_over_vcc": {
            str(row["n"]): next(
                f["median_s"] for f in rows if f["n"] == row["n"] and f["method"].startswith("full")
            )
            / row["median_s"]
            for row in rows
            if row["method"] == "vcc"
        },
    }


def _project_full(rows: list[dict]) -> None:
    measured = [r for r in rows if r["method"] == "full"]
    if not measured:
        return
    last = max(measured, key=lambda r: r["n"])
    for n in sorted({r["n"] for r in rows} - {r["n"] for r in measured}):
        rows.append(
            {
                "n": n,
                "method": "full (projected n^2)",
                "median_s": last["median_s"] * (n / last["n"]) ** 2,
            }
        )


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4))
    for method, style in (("vcc", "o-"), ("full", "s-"), ("full (projected n^2)", "s:")):
        rows = [r for r in result["rows"] if r["method"] == method]
        if not rows:
            continue
        ns = [r["n"] for r in rows]
        ax_t.plot(ns, [r["median_s"] for r in rows], style, label=method)
        if "peak_mib" in rows[0]:
            ax_m.plot(ns, [r["peak_mib"] / 1024 for r in rows], style, label=method)
    for ax, label in ((ax_t, "forward + backward (s, median)"), (ax_m, "peak RSS increase (GiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    ax_m.axhline(16, color="grey", ls="--", lw=1)
    fig.suptitle(
        f"one layer, d={DIM}, {HEADS} heads, {NUM_VIP} VIP, k={BLOCK}, h={REFINED}, "
        f"{result['machine']['threads']} CPU threads"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 4K, 16K; fewer repetitions")
    parser.add_argument(
        "--full-max",
        type=int,
        default=16384,
        help="largest n at which the full layer is run (default 16384)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    timing.add_out_option(parser, "", "output folder")
    args = parser.parse_args()
    args.out = timing.output_path(args.out, "", args.quick)
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = [4096, 16384] if args.quick else [4096, 16384, 65536, 131072]
    repeats = {4096: 3, 16384: 2} if args.quick else {4096: 5, 16384: 3}
    result = run(lengths, args.full_max, error_max=16384, repeats=repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vcc.json").write_text(json.dumps(result, indent=1))
    plot(result, args.out / "vcc.png")
    print(json.dumps(result["speedup_full_over_vcc"]))


if __name__ == "__main__":
    main()
