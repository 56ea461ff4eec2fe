"""Starting a KV cache with a prompt: one full causal pass vs a token-by-token loop, CPU.

    python benchmarks/kv_prefill.py            # prompts of 256, 1K and 4K tokens, 1 thread
    python benchmarks/kv_prefill.py --quick    # 64 and 128 tokens, for a smoke test

One attention layer (4 heads of 32 channels, float32, the shapes of
``benchmarks/kv_cache.py``) takes a prompt of ``T`` tokens, from an empty cache, and returns
the prompt's outputs. The prompt's tree holds the first ``T`` leaves of
``window_hierarchy(T + 16, (16,) * 4)`` (:func:`~hiergraph.nn.from_schedule` of
their append events, as a generator builds it):

* ``prefill``: :meth:`~hiergraph.nn.HierarchicalKVCache.prefill`, one strictly causal full
  pass in the compiled causal kernel, whose node statistics fill the store;
* ``prefill_torch``: the same on PyTorch operations (the kernel turned off: the edge lists,
  as without a C++ compiler and on accelerators);
* ``append``: ``T`` calls of :meth:`~hiergraph.nn.HierarchicalKVCache.append` with the
  tree's :func:`~hiergraph.nn.append_schedule`, each step in the compiled CPU kernel;
* ``append_torch``: the same loop on PyTorch operations (the kernel turned off: what runs
  without a C++ compiler and on accelerators);
* ``flat``: a flat decoder's prefill, causal ``scaled_dot_product_attention`` over the
  prompt and :meth:`~hiergraph.nn.FlatKVCache.extend` with its keys and values.

Every method builds its cache inside the timed call. Rounds are interleaved (each round runs
every method once, from a rotating first method); medians, spreads (min–max) and every
sample go to ``benchmarks/results/kv_prefill.json``, with a bar plot beside it (``--out``:
another JSON path; a ``--quick`` run writes into ``benchmarks/results/`` only when ``--out``
names it, else into a fresh temporary folder, printed). Before timing, the prefilled and
the appended caches decode the next 16 tokens, and the largest difference of their outputs
is stored (``max_abs_diff``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import timing
import torch
import torch.nn.functional as F
from hsa_short import bar_plot, on_torch_ops

from hiergraph.data import window_hierarchy
from hiergraph.nn import FlatKVCache, HierarchicalKVCache, append_schedule, from_schedule

HEADS, DIM, BRANCHING = 4, 32, (16,) * 4
PROMPTS, QUICK_PROMPTS = (256, 1024, 4096), (64, 128)
#: Tokens decoded after the prompt by the prefilled and the appended cache, compared.
CHECKED = 16


def make_cases(length: int, seed: int = 0) -> tuple[dict[str, Callable[[], object]], float]:
    """``{method: fn}`` for a prompt of ``length`` tokens (every ``fn`` starts from an empty
    cache and returns the prompt's outputs), and the largest output difference between a
    prefilled and an appended cache over the prompt and the next :data:`CHECKED` tokens."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(3, length + CHECKED, HEADS, DIM, generator=gen).unbind(0)
    events = append_schedule(window_hierarchy(length + CHECKED, BRANCHING)).tolist()
    prompt = from_schedule(events[:length])  # the tree of the prompt's tokens
    flat = [t[:length].transpose(0, 1) for t in (q, k, v)]  # [H, T, d]

    def decode(cache, start: int, stop: int) -> torch.Tensor:
        return torch.stack([
            cache.append(q[i], k[i], v[i], close=events[i][0], open=events[i][1])
            for i in range(start, stop)
        ])  # fmt: skip

    def prefill() -> torch.Tensor:
        return HierarchicalKVCache(HEADS, DIM).prefill(q[:length], k[:length], v[:length], prompt)

    def append() -> torch.Tensor:
        return decode(HierarchicalKVCache(HEADS, DIM), 0, length)

    def flat_prefill() -> torch.Tensor:
        FlatKVCache(HEADS, DIM, capacity=length).extend(k[:length], v[:length])
        return F.scaled_dot_product_attention(*flat, is_causal=True)

    prefilled, appended = HierarchicalKVCache(HEADS, DIM), HierarchicalKVCache(HEADS, DIM)
    outs = [prefilled.prefill(q[:length], k[:length], v[:length], prompt)]
    outs.append(decode(appended, 0, length))
    end = length + CHECKED
    caches = (prefilled, appended)
    outs = [torch.cat([o, decode(c, length, end)]) for o, c in zip(outs, caches, strict=True)]
    cases = {
        "prefill": prefill,
        "prefill_torch": on_torch_ops(prefill),
        "append": append,
        "append_torch": on_torch_ops(append),
        "flat": flat_prefill,
    }
    return cases, (outs[0] - outs[1]).abs().max().item()


def main() -> None:
    parser = timing.round_parser(__doc__.split("\n")[0], rounds=5, out="kv_prefill.json")
    parser.set_defaults(threads=1)
    args = timing.parse_and_apply(parser)
    args.out = timing.output_path(args.out, "kv_prefill.json", args.quick)
    rows = []
    for length in QUICK_PROMPTS if args.quick else PROMPTS:
        cases, diff = make_cases(length)
        with torch.no_grad():
            samples = timing.interleaved({m: (fn, ()) for m, fn in cases.items()}, args.rounds)
        median = timing.medians(samples)
        rows.append({
            "length": length, "rounds": args.rounds, "median_s": median,
            "spread_s": timing.spreads(samples), "samples_s": samples,
            "per_token_us": {m: 1e6 * s / length for m, s in median.items()},
            "over_prefill": {m: s / median["prefill"] for m, s in median.items()},
            "max_abs_diff": diff,
        })  # fmt: skip
        print(
            f"T={length:>5} "
            + "  ".join(f"{m} {s * 1e3:8.2f} ms" for m, s in median.items())
            + f"  | append/prefill {median['append'] / median['prefill']:.2f}"
            + f"  append_torch/prefill {median['append_torch'] / median['prefill']:.2f}"
            + f"  max diff {diff:.1e}"
        )
    tree = f"the first T leaves of window_hierarchy(T + {CHECKED}, {BRANCHING})"
    meta = {"heads": HEADS, "head_dim": DIM, "dtype": "float32", "tree": tree,
            "threads": args.threads, "allocator": args.allocator, "checked_tokens": CHECKED,
            "torch": torch.__version__,
            "command": timing.round_command("kv_prefill.py", args),
            "load_average": os.getloadavg()}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    labels = [f"T={r['length']:,}" for r in rows]
    title = f"Starting a KV cache with a prompt, CPU, {args.threads} thread(s)"
    bar_plot(rows, labels, title, args.out.with_suffix(".png"), log=True, what="prompt")


if __name__ == "__main__":
    main()
