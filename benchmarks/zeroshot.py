"""Zero-shot HSA inside pretrained all-MiniLM-L6-v2 on real text.

For every layer set x branching tuple, three replacements of the chosen
layers' softmax attention, measured on the same cached documents:

* ``hsa``: HSA over the fixed window hierarchy (include-self, eps = 0);
* ``block``: the same-FLOPs local baseline, softmax inside blocks of ``w`` tokens,
  ``w`` the smallest block whose attention FLOPs at 256 tokens are >= HSA's (always
  at least the leaf window);
* ``hsa_no_size_bias``: HSA without the log n(B) sibling-size bias (an ablation: without
  it HSA is no longer the KL projection of Amizadeh et al., Thm. 3.2).

Reported per run: mean cosine to the original sentence embeddings, probe
accuracies (see examples/zeroshot_minilm.py), attention FLOPs per replaced
layer (mean over the documents at their real lengths, and at 256 tokens), and
wall time. A separate timing section times the attention op alone (flat SDPA vs
the three replacements) on one batch of 256-token documents, interleaved,
medians; the process keeps freed CPU memory for reuse (``--allocator default``: glibc's
settings). With hubs it also splits the padded path's call into phases (hub choice, the
trees' token rows, the compiled kernel or else root family, window forest and gathers, the
rest; :func:`hub_phases`).

    HF_HUB_OFFLINE=1 HIERGRAPH_RAW=<folder with the corpora> nice -n 5 \\
        python benchmarks/zeroshot.py \\
        run --dataset bbc --layer-sets last2 --branchings 2,4,8,16
    python benchmarks/zeroshot.py report   # -> results/zeroshot.json + zeroshot.png
    python benchmarks/zeroshot.py fidelity --limit 200   # -> results/zeroshot_fidelity.json

``run`` appends to ``results/zeroshot_<dataset>[_n<limit>].json`` after every finished
configuration (skipping ones already there), so the grid can be run in parts.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import timing
import torch
from report_zeroshot import zs_cells, zs_tree_label  # the report's section renders the same tables

from hiergraph.datasets.processed import load_weights_only
from hiergraph.integrations import (
    block_attention_flops,
    flat_attention_flops,
    hub_scores,
    hub_window_hierarchies,
    padded_block_attention,
    padded_hsa,
    padded_hub_window_hsa,
    padded_window_hsa,
    select_hubs,
    window_hierarchies,
)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CACHE = HERE.parent / "datasets" / "zeroshot_cache"  # git-ignored
METHODS = ("hsa", "block", "hsa_no_size_bias")
TIMING_REPEATS = 15
LAYER_ORDER = ("last1", "last2", "last3", "all")


def load_example():
    """``examples/zeroshot_minilm.py`` as a module (imported when a command needs it)."""
    sys.path.insert(0, str(HERE.parent / "examples"))  # the script and the helpers it imports
    return importlib.import_module("zeroshot_minilm")


def same_flops_block(ex, branching, length: int, head_dim: int, heads: int, hubs: int = 0):
    """Smallest block size whose block attention at ``length`` tokens costs >= HSA's."""
    target = ex.hsa_flops(length, branching, head_dim, heads, hubs)
    block = branching[0] if branching else length
    while block_attention_flops(length, block, head_dim, heads) < target:
        block += 1
    return block


def load_cache(ex, model, tokenizer, dataset, args, starts):
    """The original pass (embeddings + inputs of the layers in ``starts``), from disk if
    there."""
    path = CACHE / f"{dataset}_{args.max_tokens}_{args.limit or 'all'}.pt"
    if path.exists():
        cache = load_weights_only(path, "a cache of this benchmark", "it", allow=())
        if starts <= set(cache["batches"][0][1]):
            return cache
    texts, labels, split = ex.load_texts(dataset, args.limit)
    start = time.perf_counter()
    cache = ex.encode_original(model, tokenizer, texts, args.max_tokens, args.batch_size, starts)
    cache.update(labels=labels, split=split, seconds=time.perf_counter() - start)
    CACHE.mkdir(parents=True, exist_ok=True)
    torch.save(cache, path)
    return cache


@torch.no_grad()
def time_attention(ex, model, cache, branching, block, hubs=0) -> dict[str, float]:
    """Median seconds of the attention op of the last layer on the largest cached batch
    (most tokens): flat SDPA vs the replacements, interleaved. The HSA ops include building
    their trees (and choosing the hubs)."""
    last = ex.NUM_LAYERS - 1
    valid, kept = max(cache["batches"], key=lambda batch: batch[0].numel())
    hidden = kept[last] if last in kept else None
    if hidden is None:
        return {}
    attn = ex.encoder_layers(model)[last].attention.self
    b, t, _ = hidden.shape
    q, k, v = (
        p(hidden).view(b, t, attn.num_attention_heads, -1).transpose(1, 2)
        for p in (attn.query, attn.key, attn.value)
    )
    token_mask = valid.bool()
    mask = ex.additive_mask(valid)

    def tree():
        lengths = token_mask.sum(1).tolist()
        if not hubs:
            return window_hierarchies(lengths, branching)
        lifted = select_hubs(hub_scores(q, k, token_mask, attn.scaling), token_mask, hubs)
        return hub_window_hierarchies(lengths, branching, lifted)

    ops = {
        "flat_sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, mask),
        "hsa": lambda: padded_hsa(q, k, v, token_mask, tree()),
        "hsa_no_size_bias": lambda: padded_hsa(q, k, v, token_mask, tree(), size_bias=False),
        "block": lambda: padded_block_attention(q, k, v, token_mask, block),
    }
    # what the injected layers run: the padded batch, no per-batch trees (with hubs, the
    # compiled op breaks its graph where it reads the hub counts on the host)
    if hubs:
        padded, options = padded_hub_window_hsa, dict(hubs=hubs, scale=attn.scaling)
    else:
        padded, options = padded_window_hsa, {}
    ops["hsa_padded_windows"] = lambda: padded(q, k, v, token_mask, branching, **options)
    compiled = torch.compile(padded, dynamic=False)
    start = time.perf_counter()
    compiled(q, k, v, token_mask, branching, **options)
    compile_s = time.perf_counter() - start
    ops["hsa_padded_windows_compiled"] = lambda: compiled(q, k, v, token_mask, branching, **options)
    times = {name: [] for name in ops}
    for _ in range(TIMING_REPEATS):
        for name, op in ops.items():
            start = time.perf_counter()
            op()
            times[name].append(time.perf_counter() - start)
    out = {name: float(np.median(t)) for name, t in times.items()}
    out["batch"], out["repeats"], out["compile_s"] = [b, t], TIMING_REPEATS, compile_s
    if hubs:
        out["hub_phases"] = hub_phases(ops["hsa_padded_windows"], TIMING_REPEATS)
    return out


#: Phases of ``padded_hub_window_hsa``: the functions of ``hiergraph.integrations.hub_windows``
#: (a dotted name: of a module it imports) whose calls are timed, and what each phase is (a
#: phase that calls another excludes it). Where the compiled kernel runs the hub trees, the
#: last three take no time.
HUB_PHASES = {
    "hub choice": ("checked_hub_scores", "lifted_tokens"),
    "tree rows": ("_slots",),
    "kernel": ("native.hub_tree_attention",),  # the whole trees, tokens read in place
    "root family": ("hub_family",),
    "window forest": ("uniform_hierarchical_attention",),  # less the root family inside it
    "gathers": ("_root_split",),  # less the forest and the root family
}


def phase_owner(name: str) -> tuple[object, str]:
    """The module that holds the function a name of :data:`HUB_PHASES` times, and its name
    there."""
    from hiergraph.integrations import hub_windows

    *path, attr = name.split(".")
    module = hub_windows
    for part in path:
        module = getattr(module, part)
    return module, attr


def hub_phases(op, repeats: int) -> dict[str, float]:
    """Median CPU seconds per call of ``op`` (``padded_hub_window_hsa`` on one batch) in each
    of :data:`HUB_PHASES`, and ``"rest"`` (the tokens' order, the output rows written back
    where the kernel does not run): the functions are wrapped with timers for the
    measurement."""

    spent: dict[str, float] = {}

    def timed(name, fn):
        def call(*args, **kwargs):
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.thread_time() - start

        return call

    names = [name for names in HUB_PHASES.values() for name in names]
    originals = {name: getattr(*phase_owner(name)) for name in names}
    samples = {phase: [] for phase in (*HUB_PHASES, "rest")}
    try:
        for name, fn in originals.items():
            setattr(*phase_owner(name), timed(name, fn))
        for _ in range(repeats):
            spent.clear()
            start = time.thread_time()
            op()
            total = time.thread_time() - start
            own = {phase: sum(spent.get(n, 0.0) for n in fns) for phase, fns in HUB_PHASES.items()}
            # the root family runs inside the forest, or alone where the top windows are
            # single tokens (no forest)
            forest = own["window forest"] - own["root family"] if own["window forest"] else 0.0
            below = own["window forest"] or own["root family"]
            for phase in ("hub choice", "tree rows", "kernel", "root family"):
                samples[phase].append(own[phase])
            samples["window forest"].append(forest)
            samples["gathers"].append(own["gathers"] - below)
            outside = ("hub choice", "tree rows", "kernel", "gathers")
            samples["rest"].append(total - sum(own[phase] for phase in outside))
    finally:
        for name, fn in originals.items():
            setattr(*phase_owner(name), fn)
    return {phase: float(np.median(values)) for phase, values in samples.items()}


def run(args) -> None:
    ex = load_example()
    torch.set_num_threads(args.threads)
    timing.apply_allocator(args.allocator)
    suffix = "" if args.limit is None else f"_n{args.limit}"
    out = RESULTS / f"zeroshot_{args.dataset}{suffix}.json"
    result = json.loads(out.read_text()) if out.exists() else {"runs": [], "commands": []}
    command = "python benchmarks/zeroshot.py " + " ".join(sys.argv[1:])
    # the distinct commands that made the file, in the order of their first run
    result["commands"] = list(dict.fromkeys([*result["commands"], command]))
    model, tokenizer = ex.load_minilm()
    cfg = model.config
    heads, head_dim = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    layer_sets = {name: ex.LAYER_SETS[name] for name in args.layer_sets}
    # cache every start layer of the grid once, so later parts reuse the original pass
    starts = {min(layers) for layers in ex.LAYER_SETS.values()} | {ex.NUM_LAYERS - 1}
    cache = load_cache(ex, model, tokenizer, args.dataset, args, starts)
    labels, split = cache["labels"], cache["split"]
    lengths = [int(n) for valid, _ in cache["batches"] for n in valid.sum(1)]
    emb = cache["embedding"].numpy()
    original = ex.probe_correct(emb, emb, labels, split)
    result.update(
        dataset=args.dataset,
        documents=len(labels),
        mean_tokens=float(np.mean(lengths)),
        max_tokens=args.max_tokens,
        threads=args.threads,
        original={"probe": float(original.mean()), "probe_correct": ex.bits(original)},
        original_pass_seconds=cache["seconds"],
        machine={"platform": platform.platform(), "cpus": os.cpu_count()},
    )
    done = {_config(r) + (r["method"],): i for i, r in enumerate(result["runs"])}
    for branching in args.branchings:
        block = same_flops_block(ex, branching, args.max_tokens, head_dim, heads, args.hubs)
        flops = ex.attention_flops(lengths, branching, head_dim, heads, args.hubs)
        n = args.max_tokens
        flops_at_n = {
            "flat": flat_attention_flops(n, head_dim, heads),
            "hsa": ex.hsa_flops(n, branching, head_dim, heads, args.hubs),
            "block": block_attention_flops(n, block, head_dim, heads),
        }
        flops_at_n["hsa_no_size_bias"] = flops_at_n["hsa"]
        flops["block"] = float(
            np.mean([block_attention_flops(m, block, head_dim, heads) for m in lengths])
        )
        flops["hsa_no_size_bias"] = flops["hsa"]
        op_times = time_attention(ex, model, cache, branching, block, args.hubs)
        if op_times:  # caches without the last layer's input have no timing
            op_times.update(load=os.getloadavg(), allocator=args.allocator)
            result.setdefault("timing", {})[zs_tree_label(branching, args.hubs)] = op_times
        for name, layers in layer_sets.items():
            for method in METHODS:
                key = (name, branching, args.hubs, method)
                if key in done and not args.redo:
                    continue
                hubs = 0 if method == "block" else args.hubs
                r = ex.evaluate(model, cache, labels, split, layers, branching, method, block, hubs)
                r.update(
                    layers=name,
                    layer_ids=layers,
                    branching=list(branching),
                    hubs=args.hubs,
                    method=method,
                    block=block if method == "block" else None,
                    flops_per_layer={"flat": flops["flat"], "method": flops[method]},
                    flops_per_layer_at_max_tokens={
                        "flat": flops_at_n["flat"],
                        "method": flops_at_n[method],
                    },
                    load=os.getloadavg(),
                )
                tok = "-" if r["token_cosine"] is None else f"{r['token_cosine']:.4f}"
                print(
                    f"{args.dataset} {name} {branching} hubs {args.hubs} {method}: "
                    f"cos {r['cosine']:.4f} tok {tok} retrieval {r['self_retrieval']:.4f} "
                    f"probe {r['probe']:.4f} frozen {r['frozen_probe']:.4f} "
                    f"(orig {result['original']['probe']:.4f}) {r['seconds']:.0f}s",
                    flush=True,
                )
                if key in done:  # --redo: the same numbers, now with per-document probes
                    _check_reproduced(result["runs"][done[key]], r)
                    result["runs"][done[key]] = r
                else:
                    result["runs"].append(r)
                out.write_text(json.dumps(result, indent=1))
    out.write_text(json.dumps(result, indent=1))


@torch.no_grad()
def fidelity(args) -> None:
    """Attention-level diagnostic: for the last layer of ``--docs`` cached full-length
    documents, the HSA / block / no-size-bias matrices (from identity values) against the
    layer's softmax: mean row KL(theta || softmax), the relative error of the attention
    output after the output projection, per token and after mean pooling over tokens, and
    the share of the attention mass on the softmax's hub keys (the 5% of keys with the
    most mass summed over the queries)."""
    ex = load_example()
    torch.set_num_threads(args.threads)
    model, _ = ex.load_minilm()
    path = CACHE / f"{args.dataset}_{args.max_tokens}_{args.limit or 'all'}.pt"
    cache = load_weights_only(path, "a cache of this benchmark", "it", allow=())
    last = ex.NUM_LAYERS - 1
    valid, kept = max(cache["batches"], key=lambda batch: batch[0].numel())
    valid, hidden = valid[: args.docs].bool(), kept[last][: args.docs].double()
    layer = ex.encoder_layers(model)[last].attention
    attn, dense = layer.self.double(), layer.output.dense.double()
    b, t, _ = hidden.shape
    q, k, v = (
        p(hidden).view(b, t, attn.num_attention_heads, -1).transpose(1, 2)
        for p in (attn.query, attn.key, attn.value)
    )
    flat = torch.softmax(
        q @ k.transpose(-1, -2) * attn.scaling + ex.additive_mask(valid).double(), -1
    )
    eye = torch.eye(t, dtype=q.dtype).expand(b, q.size(1), t, t)
    lengths = valid.sum(1).tolist()
    if args.hubs:
        lifted = select_hubs(hub_scores(q, k, valid, attn.scaling), valid, args.hubs)
        tree = hub_window_hierarchies(lengths, args.branching, lifted)
    else:
        tree = window_hierarchies(lengths, args.branching)
    block = same_flops_block(ex, args.branching, args.max_tokens, q.size(-1), q.size(1), args.hubs)
    mats = {
        "hsa": padded_hsa(q, k, eye, valid, tree),
        "block": padded_block_attention(q, k, eye, valid, block),
        "hsa_no_size_bias": padded_hsa(q, k, eye, valid, tree, size_bias=False),
    }

    def project(x):  # [b, H, t, d] -> [b, t, hidden] through W_o (no bias)
        return x.transpose(1, 2).reshape(b, t, -1) @ dense.weight.T

    ref = project(flat @ v)
    mask = valid[:, :, None].double()
    # the "hub" keys: the 5% of keys with the most softmax mass summed over the queries
    hubs = (flat * mask[:, None]).sum(2).topk(max(1, t // 20), dim=-1).indices  # [b, H, t/20]
    queries = mask[:, None, :, 0].sum(-1)  # [b, 1] valid queries per document

    def hub_mass(theta):  # share of all attention mass that goes to the hub keys
        to_hubs = (theta * mask[:, None]).sum(2).gather(-1, hubs).sum(-1)
        return float((to_hubs / queries).mean())

    out = {"documents": b, "tokens": t, "branching": list(args.branching), "block": block,
           "hubs": args.hubs,
           "softmax_hub_mass": hub_mass(flat)}  # fmt: skip
    for name, theta in mats.items():
        theta = theta.permute(0, 2, 1, 3)  # [b, H, t, t]
        kl = (theta * (theta.clamp_min(1e-300).log() - flat.clamp_min(1e-300).log())).sum(-1)
        err = project(theta @ v) - ref
        out[name] = {
            "row_kl": float(kl.transpose(1, 2)[valid].mean()),
            "token_rel_error": float((err.norm(dim=-1) / ref.norm(dim=-1))[valid].mean()),
            "pooled_rel_error": float(
                ((err * mask).sum(1).norm(dim=-1) / (ref * mask).sum(1).norm(dim=-1)).mean()
            ),
            "hub_mass": hub_mass(theta),
        }
        print(name, out[name])
    suffix = f"_hubs{args.hubs}" if args.hubs else ""
    (RESULTS / f"zeroshot_fidelity{suffix}.json").write_text(json.dumps(out, indent=1))


def report(args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = {}
    paths = [*RESULTS.glob("zeroshot_bbc*.json"), *RESULTS.glob("zeroshot_imdb*.json")]
    for path in sorted(paths):
        parts[path.stem.removeprefix("zeroshot_")] = json.loads(path.read_text())
    (RESULTS / "zeroshot.json").write_text(json.dumps(parts, indent=1))
    panels = (("cosine", "sentence-embedding cosine"), ("token_cosine", "token-state cosine"),
              ("probe", "probe accuracy"))  # fmt: skip
    fig, axes = plt.subplots(len(parts), 3, figsize=(15, 3.6 * len(parts)), squeeze=False)
    colors = {"hsa": "C0", "block": "C1", "hsa_no_size_bias": "C2"}
    for row, (dataset, res) in zip(axes, parts.items(), strict=True):
        keys = sorted({_config(r) for r in res["runs"]}, key=lambda k: (k[1:], _row_order(k)))
        x = np.arange(len(keys))
        for j, method in enumerate(METHODS):
            by = {_config(r): r for r in res["runs"] if r["method"] == method}
            for ax, (metric, _) in zip(row, panels, strict=True):
                vals = [by[k].get(metric) if k in by else None for k in keys]
                vals = [np.nan if v is None else v for v in vals]
                ax.bar(x + (j - 1) * 0.27, vals, 0.27, color=colors[method], label=method)
        row[2].axhline(res["original"]["probe"], color="k", ls="--", label="original")
        for ax, (_, title) in zip(row, panels, strict=True):
            ax.set_xticks(x, [f"{k[0]}\n{zs_tree_label(*k[1:])}" for k in keys], fontsize=7)
            ax.set_title(f"{dataset.upper()} ({res['documents']} docs): {title}", fontsize=9)
            ax.set_ylim(0.3, 1.0)
        row[2].set_ylim(max(0.0, res["original"]["probe"] - 0.2), 1.0)
        row[2].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(RESULTS / "zeroshot.png", dpi=120)
    ex = load_example()
    for dataset, res in parts.items():  # the README tables: HSA / block / no-size-bias
        print(f"\n{dataset}: {res['documents']} documents, original probe "
              f"{res['original']['probe']:.3f}")  # fmt: skip
        print("| layers | branching | cosine | token cosine | self-retrieval | probe "
              "| frozen probe | fewer FLOPs |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        by = {_config(r) + (r["method"],): r for r in res["runs"]}
        for layers, branching, hubs in sorted({k[:3] for k in by}, key=_row_order):
            runs = [by.get((layers, branching, hubs, method)) for method in METHODS]
            if None in runs:
                continue
            metrics = ("cosine", "token_cosine", "self_retrieval", "probe", "frozen_probe")
            f = runs[0]["flops_per_layer_at_max_tokens"]
            print(
                f"| {layers} | {zs_tree_label(branching, hubs)} | "
                + " | ".join(zs_cells(runs, metric) for metric in metrics)
                + f" | {f['flat'] / f['method']:.1f}× (block {runs[1]['block']}) |"
            )
        _paired_tests(ex, res)


def _check_reproduced(old: dict, new: dict) -> None:
    """Warn when a re-run configuration does not reproduce its stored metrics."""
    for metric in ("cosine", "self_retrieval", "probe", "frozen_probe"):
        if abs(old[metric] - new[metric]) > 1e-6:
            print(f"  WARNING: {metric} {old[metric]:.6f} stored, {new[metric]:.6f} now")


def _paired_tests(ex, res) -> None:
    """Exact McNemar tests of HSA's probes against the baselines' and the original's, for
    the rows that store per-document probe results; cells are ``HSA only : other only``
    (documents right by one of the two) and the two-sided p-value."""
    original = res["original"].get("probe_correct")
    if original is None:  # runs from before per-document probes
        return
    by = {_config(r) + (r["method"],): r for r in res["runs"]}
    lines = []
    for layers, branching, hubs in sorted({k[:3] for k in by}, key=_row_order):
        runs = [by.get((layers, branching, hubs, method)) for method in METHODS]
        if None in runs or any("probe_correct" not in r for r in runs):
            continue
        for probe in ("probe", "frozen_probe"):  # the original's probe is both, unchanged
            bits = [r[probe + "_correct"] for r in runs]
            tests = [ex.mcnemar(bits[0], other) for other in (*bits[1:], original)]
            cells = [f"{t['only_a']}:{t['only_b']}, p = {t['p']:.2g}" for t in tests]
            lines.append(f"| {layers} | {zs_tree_label(branching, hubs)} | {probe} | "
                         + " | ".join(cells) + " |")  # fmt: skip
    if lines:
        print("\n| layers | branching | probe | HSA vs block | HSA vs no log n(B) "
              "| HSA vs original |\n|---|---|---|---|---|---|")  # fmt: skip
        print("\n".join(lines))


def _row_order(key: tuple) -> tuple:
    return LAYER_ORDER.index(key[0]), key[1:]


def _config(run: dict) -> tuple:
    """(layer set, branching, hubs) of a result row (rows before hubs existed have none)."""
    return run["layers"], tuple(run["branching"]), run.get("hubs", 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run")
    p.add_argument("--dataset", choices=("bbc", "imdb"), default="bbc")
    p.add_argument("--layer-sets", nargs="+", default=["last1", "last2", "last3", "all"])
    p.add_argument(
        "--branchings",
        nargs="+",
        default=[(2, 4, 8, 16), (2, 2, 2, 2), (8, 4, 2)],
        type=lambda s: tuple(int(b) for b in s.split(",")),
    )
    p.add_argument("--hubs", type=int, default=0, help="HSA methods: hub tokens at the root")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--limit", type=int, default=None, help="documents (default: all)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    timing.add_allocator_option(p)
    p.add_argument(
        "--redo", action="store_true", help="re-run stored configurations (per-document probes)"
    )
    f = sub.add_parser("fidelity")
    f.add_argument("--dataset", choices=("bbc", "imdb"), default="bbc")
    f.add_argument("--limit", type=int, default=None, help="the cached run's --limit")
    f.add_argument("--max-tokens", type=int, default=256)
    f.add_argument("--docs", type=int, default=6)
    f.add_argument("--branching", default=(2, 4, 8, 16),
                   type=lambda s: tuple(int(b) for b in s.split(",")))  # fmt: skip
    f.add_argument("--hubs", type=int, default=0, help="-> zeroshot_fidelity_hubs<g>.json")
    f.add_argument("--threads", type=int, default=1)
    sub.add_parser("report")
    args = parser.parse_args()
    {"run": run, "fidelity": fidelity, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
