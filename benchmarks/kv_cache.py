"""Per-token decode time and cache memory vs context length: hierarchical vs flat KV cache.

    python benchmarks/kv_cache.py            # context 1K .. 64K (a few minutes on 1 core)
    python benchmarks/kv_cache.py --quick    # 1K .. 4K
    python benchmarks/kv_cache.py --quick --tokens 8 --out /tmp/kv.json   # a smoke test

One attention layer (4 heads of 32 channels, float32, one CPU thread) decodes
one sequence of ``64K + 768`` tokens. The hierarchy is a 16-ary window tree
deep enough for the whole sequence (``window_hierarchy(n, (16,) * 4)``), grown
token by token with :func:`~hiergraph.nn.append_schedule`; its prefix
at ``N`` tokens is the tree a decoder holds at context ``N``. After the cache
holds ``N`` tokens (``N = 1K, 2K, …, 64K``), the next 256 tokens are timed one
by one, interleaving the three caches token by token:

* ``hierarchical``: :class:`~hiergraph.nn.HierarchicalKVCache` (the whole run is
  real decoding: every token goes through ``append``), whose step runs in the compiled
  CPU kernel;
* ``hierarchical_torch``: a second one on the same tokens with the kernel turned off
  (PyTorch operations: what runs without a C++ compiler, on accelerators and under
  ``torch.compile``);
* ``flat``: :class:`~hiergraph.nn.FlatKVCache`, prefilled with ``extend`` between
  the timed windows (its keys/values are the same random tokens);
* ``torch_op`` (alone and from cold caches only, see below): no cache, one in-place
  addition on a tensor of 4 values, timed as a step: the least any step that calls
  PyTorch costs there (a reference, not a method).

Then the next 256 tokens are timed once more, each cache in a block of its own
(``hierarchical_alone``, ``hierarchical_torch_alone``, ``flat_alone``, then
``torch_op_alone`` on the same tokens): interleaved, a
step of one cache follows a step of the other, and the flat cache's pass over
its ``N`` keys and values evicts the CPU caches, which a short hierarchical step
then refills (at 64K that is a 64 MiB pass per token); alone, each step follows
its own previous step. A last block of 256 tokens (``hierarchical_evicted``,
``hierarchical_torch_evicted``, ``flat_evicted``, then ``torch_op_evicted`` on the same
tokens) separates the two
effects: before every step the process reads a buffer of :data:`EVICT_BYTES` (the flat cache's
size at 64K), the same at every context, so each step starts from cold CPU
caches as in a model whose other layers run between two steps of this one, and
its growth with ``N`` is the cache's own. A first round of the three blocks at a
256-token context warms every path up and is not recorded; freed CPU memory is kept
for reuse (``--allocator default``: glibc's settings).

Per context length the JSON holds the mean and median time per token, both as
wall-clock time (``perf_counter``) and as CPU time of the thread (``thread_time``,
less sensitive to other processes on a shared machine), and the bytes held by
each cache; ``summary`` has the 1K → 64K growth factors. ``--replot`` redraws
the PNG from the JSON. Results
go to ``benchmarks/results/kv_cache.json`` and ``kv_cache.png`` (``--out``: another JSON
path, the plot beside it). A ``--quick`` run writes into ``benchmarks/results/`` only when
``--out`` names it, else ``kv_cache_quick.json`` into a fresh temporary folder, printed.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import timing
import torch

from hiergraph.data import window_hierarchy
from hiergraph.nn import FlatKVCache, HierarchicalKVCache, append_schedule
from hiergraph.ops.hsa import native

HEADS, DIM, BRANCH, WINDOW = 4, 32, 16, 256
#: Bytes read before every step of the ``*_evicted`` blocks: the flat cache's keys and
#: values at a 64K context (4 heads x 32 channels, float32), larger than the CPU caches.
EVICT_BYTES = 64 << 20


#: The caches (``hierarchical_torch``: the kernel turned off) in each block of a context,
#: and the reference step, timed alone and from cold caches only (interleaved, it would
#: stand between the flat cache's step and the next).
CACHES = ("hierarchical", "hierarchical_torch", "flat")
STEPS = (*CACHES, "torch_op")
METHODS = (*CACHES, *(f"{c}_alone" for c in STEPS), *(f"{c}_evicted" for c in STEPS))


def run(contexts: list[int], window: int = WINDOW, seed: int = 0) -> tuple[list[dict], int]:
    """Decode up to every context length and time ``window`` tokens per block there."""
    total = contexts[-1] + 3 * window
    levels = 1
    while BRANCH ** (levels + 1) < total:
        levels += 1
    schedule = append_schedule(window_hierarchy(total, (BRANCH,) * levels)).tolist()
    hier = HierarchicalKVCache(HEADS, DIM)
    hier_torch = HierarchicalKVCache(HEADS, DIM)
    flat = FlatKVCache(HEADS, DIM, capacity=total)
    rows, pos = [], 0
    evictor, tiny = torch.ones(EVICT_BYTES // 4), torch.zeros(4)

    def token(i: int):
        g = torch.Generator().manual_seed(seed * 1_000_003 + i)
        return torch.randn(3, HEADS, DIM, generator=g).unbind(0)

    def block(start: int) -> list[tuple]:
        """``window`` tokens from ``start`` with their schedule: ``(q, k, v, close, open)``."""
        return [(*token(i), *schedule[i]) for i in range(start, start + window)]

    def step(method: str, q, k, v, close: int, open_: int) -> tuple[float, float]:
        """One decode step of the cache ``method`` names: its CPU and wall seconds."""
        torch_ops = method.startswith("hierarchical_torch")
        kernel = native.set_enabled(not torch_ops)  # (outside the timed span)
        c0, t0 = time.thread_time(), time.perf_counter()
        if method.startswith("hierarchical"):
            (hier_torch if torch_ops else hier).append(q, k, v, close=close, open=open_)
        elif method.startswith("flat"):
            flat.append(q, k, v)
        else:
            tiny.add_(1.0)
        seconds = time.thread_time() - c0, time.perf_counter() - t0
        native.set_enabled(kernel)
        return seconds

    # a first context of `window` tokens runs every timed path once (its times are dropped):
    # the first flat append, the first read of the evictor
    for n in [window, *contexts]:
        while pos < n:  # decode up to context n (untimed)
            for method in ("hierarchical", "hierarchical_torch"):
                step(method, *token(pos), *schedule[pos])
            pos += 1
        if flat.num_tokens < n:  # the flat cache takes the same tokens as a prompt
            chunk = torch.stack([torch.stack(token(i)[1:]) for i in range(flat.num_tokens, n)])
            flat.extend(chunk[:, 0], chunk[:, 1])
        times = {method: [] for method in METHODS}
        cpu = {method: [] for method in METHODS}
        held = hier.nbytes()  # (both hierarchical caches hold the same tokens)
        memory = {"hierarchical": held, "hierarchical_torch": held, "flat": flat.nbytes()}

        timed = [  # (method, tokens, evict first): interleaved, alone, from cold caches
            *((m, [args], False) for args in block(pos) for m in CACHES),
            *((f"{m}_alone", block(pos + window), False) for m in STEPS),
            *((f"{m}_evicted", block(pos + 2 * window), True) for m in STEPS),
        ]
        for method, tokens, evict in timed:
            for args in tokens:
                if evict:
                    evictor.sum()  # a fixed-size read before the step
                seconds = step(method, *args)
                cpu[method].append(seconds[0])
                times[method].append(seconds[1])
        pos += 3 * window
        if n == window:  # the warm-up
            continue
        for method, ts in times.items():
            rows.append(
                {
                    "context": n,
                    "method": method,
                    "mean_us": 1e6 * statistics.fmean(ts),
                    "median_us": 1e6 * statistics.median(ts),
                    "cpu_mean_us": 1e6 * statistics.fmean(cpu[method]),
                    "cpu_median_us": 1e6 * statistics.median(cpu[method]),
                    "bytes": memory.get(_cache(method), 0),
                }
            )
            print(
                f"N={n:6d} {method:26s} median {rows[-1]['median_us']:9.1f} us  "
                f"cpu mean {rows[-1]['cpu_mean_us']:9.1f} us  {rows[-1]['bytes'] / 1024:10.1f} KiB",
                flush=True,
            )
    return rows, levels


def _cache(method: str) -> str:
    """The cache (or reference step) a method times: its name without the protocol."""
    return method.removesuffix("_alone").removesuffix("_evicted")


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for method, color in zip(STEPS, ("C0", "C2", "C1", "0.5"), strict=True):
        sel = [r for r in rows if r["method"] == method]
        alone = [r for r in rows if r["method"] == f"{method}_alone"]
        ns = [r["context"] for r in sel]
        interleaved = (("median_us", "o-", "wall median"), ("cpu_mean_us", "^:", "CPU mean"))
        for key, style, what in interleaved if sel else ():  # (the reference: none)
            axes[0].plot(ns, [r[key] for r in sel], style, color=color, label=f"{method} {what}")
        if alone:  # (results from before the alone blocks have none)
            ns_alone, cpu_alone = [r["context"] for r in alone], [r["cpu_mean_us"] for r in alone]
            axes[0].plot(ns_alone, cpu_alone, "s--", color=color, mfc="none",
                         label=f"{method} CPU mean, alone")  # fmt: skip
        evicted = [r for r in rows if r["method"] == f"{method}_evicted"]
        if evicted:  # (results from before the evicted block have none)
            axes[0].plot([r["context"] for r in evicted], [r["cpu_mean_us"] for r in evicted],
                         "d-.", color=color, label=f"{method} CPU mean, cold caches")  # fmt: skip
        if method in CACHES:
            axes[1].plot(ns, [r["bytes"] / 1024 for r in sel], "o-", color=color, label=method)
    for ax, label in zip(axes, ("time per token [µs]", "cache size [KiB]"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length N (tokens)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"decode step, {HEADS} heads x {DIM}, float32, 1 thread, 16-ary window tree")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="contexts 1K .. 4K only")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=WINDOW, help="timed tokens per block")
    timing.add_out_option(parser, "kv_cache.json")
    parser.add_argument("--replot", action="store_true", help="redraw the PNG from the JSON")
    timing.add_allocator_option(parser)
    args = parser.parse_args(argv)
    if args.replot and args.quick and args.out is None:
        parser.error("--replot --quick redraws a quick run's JSON: name it with --out")
    out = timing.output_path(
        args.out, "kv_cache_quick.json" if args.quick else "kv_cache.json", args.quick
    )
    if args.replot:
        plot(json.loads(out.read_text())["rows"], out.with_suffix(".png"))
        return
    torch.set_num_threads(args.threads)
    timing.apply_allocator(args.allocator)
    contexts = [1024 * 2**i for i in range(3 if args.quick else 7)]
    rows, levels = run(contexts, args.tokens)
    lo, hi = contexts[0], contexts[-1]

    def growth(method, key):
        pick = {r["context"]: r[key] for r in rows if r["method"] == method}
        return pick[hi] / pick[lo]

    summary = {
        f"{m}_{key}_growth_{lo}_to_{hi}": growth(m, key)
        for m in METHODS
        for key in ("mean_us", "median_us", "cpu_mean_us", "cpu_median_us", "bytes")
        if key != "bytes" or _cache(m) != "torch_op"
    }
    result = {
        "meta": {
            "command": "python benchmarks/kv_cache.py"
            + (" --quick" if args.quick else "")
            + (f" --tokens {args.tokens}" if args.tokens != WINDOW else "")
            + (" --allocator default" if args.allocator != "reuse" else ""),
            "allocator": args.allocator,
            "heads": HEADS,
            "head_dim": DIM,
            "dtype": "float32",
            "threads": args.threads,
            "tree": f"window_hierarchy(N_total, ({BRANCH},) * {levels})",
            "timed_tokens_per_context": args.tokens,
            "alone_tokens_per_context": args.tokens,
            "evicted_tokens_per_context": args.tokens,
            "evict_bytes": EVICT_BYTES,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        },
        "rows": rows,
        "summary": summary,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    plot(rows, out.with_suffix(".png"))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
