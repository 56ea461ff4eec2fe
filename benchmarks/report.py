"""Render ``benchmarks/README.md`` from the JSON results in ``benchmarks/results/``.

    python benchmarks/report.py            # rewrite benchmarks/README.md
    python benchmarks/report.py --check    # exit 1 when README.md is not what the JSON gives

Every number of the README comes from a JSON file: nothing is typed by hand.
``tests/test_benchmarks_report.py`` checks that the committed README equals this
rendering, so after a benchmark writes new results, run this script and commit both.

Conventions of the tables:

* a time measured more than once is ``median [min–max]``, with the number of samples
  or interleaved rounds in the caption or in brackets (``×n``); where only medians or
  quartiles were recorded, the table says so;
* an accuracy over seeds is ``mean ± std [min–max]``, std the sample standard deviation
  (n − 1), with the number of seeds in its own column;
* sections whose JSON is absent are left out (the GPU section says that no run was made).

The script needs only the standard library (no torch, no matplotlib): the plots are the
PNGs the benchmarks wrote next to their JSON, and are linked, not redrawn.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE / "README.md"

sys.path.insert(0, str(HERE))
import gpu_targets as targets  # noqa: E402

# ------------------------------------------------------------------ number formatting


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


def load(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def present(items):
    """``(item, data)`` for every result file of ``items`` that exists (an item is a file
    name or a tuple whose first element is one)."""
    for item in items:
        data = load(item if isinstance(item, str) else item[0])
        if data is not None:
            yield item, data


def plot(name: str, alt: str) -> list[str]:
    return [f"![{alt}](results/{name})", ""] if (RESULTS / name).exists() else []


def source(*names: str) -> str:
    present = [n for n in names if (RESULTS / n).exists()]
    return "Source: " + ", ".join(f"[`{n}`](results/{n})" for n in present) + "."


# ------------------------------------------------------------------------- sections


def compare_commits() -> list[str] | None:
    """One table per ``compare_commits*.json`` (the quick run, and runs at chosen HSA
    sizes)."""
    out = []
    for path in sorted(RESULTS.glob("compare_commits*.json")):
        data = json.loads(path.read_text())
        meta = data["meta"]
        _, _, sizes = meta["command"].partition("--hsa-sizes ")
        what = "quick benchmarks" if not sizes else (
            "benchmarks, the HSA scaling run at "
            + ", ".join(f"{int(n):,}" for n in sizes.split()) + " leaves,"
        )  # fmt: skip
        out += [
            f"The {what} of commit `{meta['old']}` (old) and `{meta['new']}` (new), "
            f"{meta['rounds']} interleaved rounds, each from its own checkout; cells are "
            f"medians [min–max]. Command: {code(meta['command'])}.",
            "",
        ]
        out += table(
            ["case", "old", "new", "old ÷ new"],
            [[r["case"], spread(r["old_s"]), spread(r["new_s"]), ratio(r["old_over_new"])]
             for r in data["rows"]],
        )  # fmt: skip
        out += [source(path.name), ""]
    return out or None


def allocator(meta: dict) -> str:
    """How the run's CPU allocator was set (runs that predate the option used glibc's)."""
    if meta.get("allocator") == "reuse":
        return "freed memory reused (`hiergraph.runtime.reuse_freed_memory`)"
    return "glibc's default allocator"


def hsa_scaling() -> list[str] | None:
    data = load("hsa_scaling.json")
    if data is None:
        return None
    meta, rows = data["meta"], data["rows"]
    by = {(r["n"], r["method"]): r for r in rows}
    reps = meta["reps"]
    out = [
        f"{meta['heads']} heads, d = {meta['dim']}, {meta['dtype']}, CPU, "
        f"{threads(meta['threads'])}, {allocator(meta)}. Window hierarchy (branching per N "
        "below); ragged: "
        "random windows with the same mean; bound: one batched SDPA call per level over "
        "that level's families; compiled: the window case through "
        "`torch.compile(fullgraph=True, dynamic=False)`, contiguous inputs. "
        f"Medians of {reps} interleaved repetitions up to N = 16,384 and "
        f"{max(reps - 2, 1)} above (only the medians are stored); peak: growth of the "
        "resident-set high-water mark during one forward+backward in a fresh process. "
        f"Command: {code(meta['command'])}.",
        "",
    ]
    body = []
    for n in sorted({r["n"] for r in rows}):
        w, g, b = by[(n, "hsa-window")], by[(n, "hsa-ragged")], by[(n, "bound")]
        f, h = by.get((n, "flat-sdpa")), by.get((n, "hsa-window-heads-first"))
        c = by.get((n, "hsa-window-compiled"))
        flat = f"{secs(f['forward_s'])} / {secs(f['forward_backward_s'])}" if f else "not run"
        body.append([
            f"{n:,}", ",".join(map(str, meta["branching"][str(n)])),
            f"{secs(w['forward_s'])} / {secs(w['forward_backward_s'])}",
            secs(g["forward_backward_s"]), secs(b["forward_backward_s"]), flat,
            ratio(f["forward_backward_s"] / w["forward_backward_s"]) if f else "–",
            ratio(w["forward_backward_s"] / b["forward_backward_s"]),
            secs(h["forward_backward_s"]) if h else "–",
            ratio(h["forward_backward_s"] / b["forward_backward_s"]) if h else "–",
            f"{secs(c['forward_backward_s'])} ({secs(c['compile_s'])})" if c else "–",
            ratio(c["forward_backward_s"] / b["forward_backward_s"]) if c else "–",
            num(w["peak_mb"]) if w["peak_mb"] is not None else "–",
        ])  # fmt: skip
    out += table(
        ["N", "branching", "HSA window fwd / fwd+bwd", "HSA ragged fwd+bwd", "bound fwd+bwd",
         "flat SDPA fwd / fwd+bwd", "flat ÷ HSA", "HSA ÷ bound", "HSA heads first fwd+bwd",
         "heads first ÷ bound", "HSA compiled fwd+bwd (compile)", "compiled ÷ bound",
         "HSA peak MB"],
        body,
    )  # fmt: skip
    return out + [source("hsa_scaling.json"), ""] + plot("hsa_scaling.png", "HSA scaling")


def hsa_short() -> list[str] | None:
    found = list(present(("hsa_short_1t.json", "hsa_short_2t.json", "hsa_short_2t_avx2.json")))
    if not found:
        return None
    out = [
        "Batches of window trees at the lengths most models run, forward+backward, float32, "
        "CPU. Methods ran in interleaved rounds (each round runs every method once); cells "
        "are median [min–max] over the rounds, wall clock and process CPU time.",
        "",
    ]
    for name, data in found:
        meta, rows = data["meta"], data["rows"]
        n_threads = rows[0]["threads"] if rows else "?"
        # PyTorch's torch.backends.cpu.get_cpu_capability(), as recorded (AVX512, AVX2, ...)
        isa = meta.get("cpu_capability", "not recorded")
        out += [
            f"**{threads(n_threads)}, CPU capability {isa}**: {meta['heads']} heads, "
            f"d = {meta['dim']}, {meta['dtype']}, {allocator(meta)}; "
            f"command {code(meta['command'])}.",
            "",
        ]
        body = []
        for row in rows:
            shape = row_shape(row)
            cpu = row.get("cpu_samples_s", {})
            median = row["median_s"]
            for method, samples in row["samples_s"].items():
                compile_s = row.get("compile_s") if method.endswith("compiled") else None
                # causal methods against causal flat attention, the others against flat
                peer = "flat-causal" if "causal" in method and "flat-causal" in median else "flat"
                body.append([
                    shape, method, row["rounds"], spread(samples),
                    spread(cpu[method]) if method in cpu else "–",
                    ratio(median[peer] / median[method]), ratio(row["over_bound"][method]),
                    secs(compile_s) if compile_s else "–",
                ])  # fmt: skip
                shape = ""
        out += table(
            ["B × L (branching)", "method", "rounds", "wall", "CPU", "flat ÷ method",
             "method ÷ bound", "compile"],
            body,
        )  # fmt: skip
        out += [
            "Causal methods are compared with causal flat attention (`flat-causal`). Where "
            "the time of HSA goes (self CPU time of one forward+backward under the "
            "profiler, by operator group; the compiled kernel is one call, counted as "
            "element-wise and other):",
            "",
        ]
        profiled = [(r, r.get("profiles") or {"hsa": r["profile_hsa"]}) for r in rows]
        groups = next(iter(profiled[0][1].values()))["self_cpu_s_by_group"]
        out += table(
            ["B × L", "method", *groups, "aten calls"],
            [
                [f"{r['batch']} × {r['length']:,}", method,
                 *(secs(v) for v in p["self_cpu_s_by_group"].values()), str(p["aten_calls"])]
                for r, profiles in profiled
                for method, p in profiles.items()
            ],
        )  # fmt: skip
        flops = ", ".join(
            f"{r['batch']} × {r['length']:,}: {num(r['flop_ratio_flat_over_hsa'])}×" for r in rows
        )
        out += [f"Attention FLOPs, flat ÷ HSA: {flops}.", ""]
        out += [source(name), ""] + plot(name.replace(".json", ".png"), f"HSA short, {name}")
    return out


def row_shape(row: dict) -> str:
    """``B × L (branching)`` of a row of the short-length HSA benchmarks."""
    return f"{row['batch']} × {row['length']:,} ({','.join(map(str, row['branching']))})"


def hsa_hubs() -> list[str] | None:
    data = load("hsa_hubs.json")
    if data is None:
        return None
    meta, rows = data["meta"], data["rows"]
    out = [
        f"Forward+backward of a `HierarchicalSelfAttention` layer ({meta['channels']} channels, "
        f"{meta['heads']} heads × {meta['dim']}, {meta['dtype']}, no position embeddings) over "
        "batches of window trees (equal, then of lengths drawn from [L/2, L], whose forest runs "
        "on its equal-fanout embedding, and from [L/8, L], whose trees differ in height and run "
        "on the forest's own levels), "
        f"{rows[0]['hubs']} hub leaves per tree, {threads(rows[0]['threads'])}, "
        f"{allocator(meta)}. `no-hubs`: the same layer without hubs; `hubs`: the default, "
        "on the batch's own plan, its embedding or its levels (no lifted tree is built); "
        "`hubs-rebuilt`: the lifted tree built on every pass (as before the layer ran hubs in "
        'place), with `kernel="blocks"`; '
        "`hubs-compiled`: the `hubs` layer through `torch.compile(fullgraph=True, "
        "dynamic=False)`, compile time apart. Cells: median [min–max] over interleaved "
        "rounds. Command: "
        f"{code(meta['command'])}.",
        "",
    ]
    body = []
    for row in rows:
        shape = row_shape(row)
        if row.get("ragged"):
            where = row.get("runs_on", "embedding")
            shape += (
                f", lengths in [L/{row.get('spread', 2)}, L] ({row['tokens']:,} tokens, {where})"
            )
        for method, samples in row["samples_s"].items():
            compile_s = row.get("compile_s") if method.endswith("compiled") else None
            body.append([shape, method, row["rounds"], spread(samples),
                         ratio(row["rebuilt_over"][method]),
                         secs(compile_s) if compile_s else "–"])  # fmt: skip
            shape = ""
    out += table(
        ["B × L (branching)", "method", "rounds", "wall", "rebuilt ÷ method", "compile"], body
    )
    out += [source("hsa_hubs.json"), ""] + plot("hsa_hubs.png", "HSA layer with hubs")
    return out


def hsa_wide() -> list[str] | None:
    data = load("hsa_wide.json")
    if data is None:
        return None
    meta, rows = data["meta"], data["rows"]
    out = [
        f"Forward+backward over **synthetic** hierarchies with wide families ({meta['heads']} "
        f"heads × {meta['dim']}, {meta['dtype']}, {threads(meta['threads'])}, "
        f"{allocator(meta)}): a *star* of W leaves is one family under a root, where HSA is "
        "softmax attention of every leaf over the others, the work of flat attention over W "
        "tokens. `hsa`: the default: with a gradient the compiled kernels take families of "
        f"fewer than {meta['wide_fanout']:,} members, the forest kernel leaves forests whose "
        f"blocks of {meta['wide_block']:,} or more members hold {meta['wide_pairs_per_leaf']} "
        "or more (query, key) pairs per leaf to the others, and the block kernel runs such "
        "blocks in PyTorch's fused CPU attention kernel; `hsa-kernels`: the same op without "
        "those rules (the compiled kernels at every width, no fused attention kernel); "
        "`hsa-torch`: PyTorch operations alone, no fused attention kernel (reshaped views "
        'where they fit, else batched products); `hsa-blocks`: `kernel="blocks"`, wide blocks '
        "in the fused kernel; `sdpa`: `scaled_dot_product_attention` over each tree's leaves "
        "as one sequence (zero-padded with a key padding mask where the trees differ); "
        "`hsa-causal`: strictly causal HSA, equal forests past the reshaped views' usual "
        "logit limit as reshaped views, whose wide leaf families run in the fused kernel; "
        "`hsa-causal-kernel`: the same without the first rule (the "
        "compiled causal kernel); `sdpa-causal`: `sdpa` with a causal mask, the causal "
        "methods' peer. "
        "Path: where `hsa` runs. Cells: median [min–max] over interleaved rounds. Command: "
        f"{code(meta['command'])}.",
        "",
    ]
    body = []
    for row in rows:
        name = f"{row['name']} ({row['leaves']:,} leaves)"
        for method, samples in row["samples_s"].items():
            body.append([name, row["path"] if name else "", method, spread(samples),
                         ratio(row["over_sdpa"][method])])  # fmt: skip
            name = ""
    out += table(["trees", "path", "method", "wall", "method ÷ its SDPA"], body)
    return out + [source("hsa_wide.json"), ""] + plot("hsa_wide.png", "HSA with wide families")


def hsa_lengths() -> list[str] | None:
    data = load("hsa_lengths.json")
    if data is None:
        return None
    meta = data["meta"]
    out = [
        "Batches of sequences of different lengths (uniform in [L/2, L], one window tree per "
        f"sequence), forward+backward, {meta['heads']} heads, d = {meta['dim']}, "
        f"{meta['dtype']}, {threads(meta['threads'])}, {allocator(meta)}. `flat` is SDPA on "
        "the zero-padded batch with a key padding mask; `hsa` the default kernel ('path': on "
        "the CPU the compiled forest kernel; `hsa-torch`, the kernels off, the forest "
        "embedded in an equal-fanout one when that is cheaper, else the block kernel); "
        "`hsa-blocks` the block kernel; `hsa-ragged-trees` trees of the same lengths with "
        "window sizes uniform in [1, 2b − 1] (the path after the slash); the causal methods "
        "(compared with `flat-causal`, SDPA with a causal and key padding mask) are the "
        "strictly causal op, by default on the padded forest, and its edge-list path; "
        "`hsa-causal-ragged-trees` the strictly causal op on the ragged trees (on the CPU its "
        "compiled kernel), `hsa-causal-ragged-edges` its edge lists (their softmax in the "
        "compiled kernel), `hsa-causal-ragged-torch` the edge lists on PyTorch operations "
        "alone. Cells: median [min–max] over the interleaved rounds. "
        f"Command: {code(meta['command'])}.",
        "",
    ]
    body = []
    for row in data["rows"]:
        shape = row_shape(row)
        tokens = f"{row['tokens']:,}"
        path = f"{row['hsa_path']} / {row['ragged_path']}"
        for method, samples in row["samples_s"].items():
            body.append([shape, tokens, path, method, row["rounds"], spread(samples),
                         ratio(row["flat_over"][method])])  # fmt: skip
            shape = tokens = path = ""
    out += table(["B × L (branching)", "tokens", "path", "method", "rounds", "wall",
                  "flat ÷ method"], body)  # fmt: skip
    return out + [source("hsa_lengths.json"), ""] + plot("hsa_lengths.png", "HSA, mixed lengths")


def hsa_inference() -> list[str] | None:
    data = load("hsa_inference.json")
    if data is None:
        return None
    meta = data["meta"]
    out = [
        "The forward alone under `torch.no_grad()`, float32, "
        f"{threads(meta['threads'])}, {allocator(meta)}. `flat`: SDPA (with the padding as "
        "an additive mask on a padded batch); `hsa`: the op on contiguous `[L, H, d]` inputs "
        "(batches of trees: the compiled kernel), or `padded_window_hsa` on a padded batch in "
        "a Hugging Face layer's memory layout (synthetic lengths); `hsa-torch`: the `hsa` call "
        "of a batch of trees on PyTorch operations alone (the kernel turned off); "
        "`hsa-heads-first`: inputs whose memory is heads first; "
        "`hsa-recorded`: the `hsa` call with the fused passes switched off (the op as "
        "autograd would record it). Cells: median [min–max] over the interleaved rounds. "
        f"Command: {code(meta['command'])}.",
        "",
    ]
    body = []
    for row in data["rows"]:
        shape = row_shape(row)
        heads = f"{row['heads']} × {row['dim']}"
        padded = "–" if row["lengths"] is None else f"{min(row['lengths'])}–{max(row['lengths'])}"
        for method, samples in row["samples_s"].items():
            ratios = (row["flat_over"][method], row["recorded_over"][method])
            body.append([shape, heads, padded, method, row["rounds"], spread(samples),
                         *map(ratio, ratios)])  # fmt: skip
            shape = heads = padded = ""
    out += table(["B × L (branching)", "heads × d", "lengths", "method", "rounds", "wall",
                  "flat ÷ method", "recorded ÷ method"], body)  # fmt: skip
    out += [
        "Largest difference between the outputs of `hsa` and `hsa-recorded` per row: "
        + ", ".join(num(r["max_abs_diff_vs_recorded"], 2) for r in data["rows"])
        + ".",
        "",
    ]
    return out + [source("hsa_inference.json"), ""] + plot("hsa_inference.png", "HSA inference")


def hte_epoch() -> list[str] | None:
    d = load("hte_epoch.json")
    if d is None:
        return None
    out = [
        f"One training epoch of a Hierarchical Transformer Encoder on {d['data']}: "
        f"{d['trees']:,} trees of {num(d['mean_leaves'])} leaves on average, {d['layers']} "
        f"layers, width {d['hidden']}, {d['heads']} heads, batch {d['batch_size']}, "
        f"{threads(d['threads'])}; one run. Command: {code(d['command'])}.",
        "",
    ]
    out += table(
        ["epoch", "target", "median step", "steps", "tree building", "parameters"],
        [[secs(d["epoch_s"]), secs(d["target_s"]), secs(d["median_step_s"]), d["steps"],
          secs(d["build_trees_s"]), f"{d['parameters']:,}"]],
    )  # fmt: skip
    return out + [source("hte_epoch.json"), ""] + plot("hte_epoch.png", "HTE epoch")


def _masked_case_row(case: dict, with_edges: bool = True) -> list[str]:
    methods = case["methods"]

    def cell(method):
        m = methods.get(method)
        if m is None:
            return "–"
        if "skipped" in m or "samples_s" not in m:
            return "skipped"
        return spread(m["samples_s"])

    def peak(method):
        m = methods.get(method) or {}
        return num(m["peak_mib"]) if "peak_mib" in m and "samples_s" in m else "–"

    r = case["ratios"]
    diff = [
        r.get("max_abs_diff_ours_vs_transformer_conv"),
        r.get("max_abs_diff_ours_vs_dense_sdpa"),
    ]
    row = [case["mask"], f"{case['num_nodes']:,}"]
    row += [f"{case['num_edges']:,}"] if with_edges else []
    return row + [
        cell("ours"), cell("transformer_conv"), cell("dense_sdpa"),
        ratio(r.get("transformer_conv_time_over_ours")), ratio(r.get("dense_sdpa_time_over_ours")),
        " / ".join(peak(m) for m in ("ours", "transformer_conv", "dense_sdpa")),
        " / ".join(num(x, 2) if x is not None else "–" for x in diff),
    ]  # fmt: skip


def masked_attention() -> list[str] | None:
    out = []
    for name, data in present(
        ("masked_attention.json", "masked_attention_cora.json", "masked_attention_16k.json")
    ):
        s = data["setting"]
        out += [
            f"**{code(data['command'])}**: one layer, {s['pass']}, {s['in_channels']} input "
            f"channels, {s['heads']} heads × {s['out_channels_per_head']}, {s['dtype']}, "
            f"{threads(s['threads'])}, window p = {s['window_p']}. Samples per method: one "
            f"run in a fresh process (its peak memory) plus {s['reps']} interleaved rounds; a "
            f"method whose fresh run took over {num(s['single_sample_above_s'])} s keeps that "
            "run as its only sample.",
            "",
        ]
        out += table(
            ["mask", "N", "edges", "ours", "TransformerConv", "dense SDPA", "TC ÷ ours",
             "dense ÷ ours", "peak MiB ours / TC / dense", "max abs diff vs TC / dense"],
            [_masked_case_row(c) for c in data["cases"]],
        )  # fmt: skip
        out += [source(name), ""] + plot(name.replace(".json", ".png"), name)
    return out or None


def cone_speed() -> list[str] | None:
    d = load("cone.json")
    if d is None:
        return None
    out = [
        f"Forward+backward on Cora, {threads(d['threads'])}, {d['reps']} interleaved rounds "
        "(after warm-up rounds). CPU time of the timing thread: median [first–third "
        "quartile] (only the quartiles are stored); wall clock: median. Target: "
        f"{d['target']}.",
        "",
    ]
    body = []
    for kind, rows in d["results"].items():
        for name, r in rows.items():
            body.append([
                kind, name, f"{num(r['median_ms'])} ms [{num(r['q1_ms'])}–{num(r['q3_ms'])}]",
                ratio(r["ratio_to_gat"]), f"{num(r['wall_median_ms'])} ms",
                ratio(r["wall_ratio_to_gat"]),
            ])  # fmt: skip
            kind = ""
    out += table(["step", "attention", "CPU ms", "÷ gat (CPU)", "wall", "÷ gat (wall)"], body)
    return out + [source("cone.json"), ""] + plot("cone.png", "ConeConv vs GATConv")


def _fmean(values: list | None) -> float | None:
    return statistics.fmean(values) if values else None


def _median_int(values: list | None) -> str:
    return f"{statistics.median(values):g}" if values else "–"


def _by_validation(item: tuple[str, dict]) -> float:
    return -statistics.fmean(item[1]["val_accuracy"])


def cone_accuracy() -> list[str] | None:
    files = [
        "cone_cora_accuracy.json", "cone_cora_accuracy_p300.json",
        "cone_cora_accuracy_p1000.json", "cone_cora_accuracy_p300_feature_dropout.json",
    ]  # fmt: skip
    out = []
    for name, data in present(files):
        body = []
        for key, r in data["rows"].items():
            final = r.get("final_model")
            body.append([
                code(key), len(r["test_accuracy"]), mean_std(r["test_accuracy"]),
                acc(_fmean(r.get("val_accuracy"))), _median_int(r.get("best_epoch")),
                f"{r['budget']['max_epochs']:,} / {r['budget']['patience']:,}",
                mean_std(final["test_accuracy"]) if final else "–",
            ])  # fmt: skip
        patience = sorted({r["budget"]["patience"] for r in data["rows"].values()})
        label = "patience " + " / ".join(f"{p:,}" for p in patience)
        out += [f"**{label}** (`{name}`): {data['what']}.", ""]
        out += table(
            ["attention [options]", "seeds", "test accuracy", "validation (mean)",
             "best epoch (median)", "max epochs / patience", "final model (paper's protocol)"],
            body,
        )  # fmt: skip
        out += [source(name), ""]
    for name, data in present(("cone_cora_sweep.json", "cone_cora_sweep_p300.json")):
        rows = dict(data["rows"])
        rows.update({f"{k} (compared with)": v for k, v in data.get("compared_with", {}).items()})
        body = [
            [code(k), len(r["seeds"]), acc(statistics.fmean(r["val_accuracy"])),
             acc(statistics.fmean(r["test_accuracy"]))]
            for k, r in sorted(rows.items(), key=_by_validation)
        ]  # fmt: skip
        out += [f"**Validation sweep** ({data['what']} Command: {code(data['command'])}.)", ""]
        out += table(["attention [options]", "seeds", "validation (mean)", "test (mean)"], body)
        out += [source(name), ""]
    return out or None


def _hmatrix_table(data: dict) -> list[str]:
    rows = data["rows"]
    by = {(r["length"], r["causal"], r["method"]): r for r in rows}
    body = []
    for length, causal in sorted({(r["length"], r["causal"]) for r in rows}):
        ours = by[(length, causal, "hmatrix")]
        sdpa = by.get((length, causal, "sdpa"))
        proj = by.get((length, causal, "sdpa (projected L^2 matrix)"), {})
        pkg = by.get((length, causal, "h-transformer-1d"))
        if sdpa:
            sdpa_cell, sdpa_ratio = (
                spread(sdpa["times_s"]),
                ratio(sdpa["median_s"] / ours["median_s"]),
            )
        elif "median_s" in proj:
            sdpa_cell = f"({secs(proj['median_s'])}, projected from L²)"
            sdpa_ratio = f"({ratio(proj['median_s'] / ours['median_s'])})"
        else:
            sdpa_cell = sdpa_ratio = "–"
        err = (
            f"{num(ours['max_err_vs_softmax'], 2)} / {num(pkg['max_err_vs_softmax'], 2)}"
            if pkg
            else "–"
        )
        body.append([
            f"{length:,}", "causal" if causal else "bidir.", spread(ours["times_s"]), sdpa_cell,
            spread(pkg["times_s"]) if pkg else "–", sdpa_ratio,
            ratio(pkg["median_s"] / ours["median_s"]) if pkg else "–",
            num(ours["max_err_vs_implied"], 2), err,
            num(pkg["max_err_ones"], 3) if pkg else "–",
            num(ours["peak_mib"] / proj["peak_mib"], 3) if "peak_mib" in proj else "–",
        ])  # fmt: skip
    return table(
        ["L", "mode", "ours", "flat SDPA", "`h-transformer-1d`", "SDPA ÷ ours", "package ÷ ours",
         "ours: err vs implied dense", "err vs softmax: ours / package",
         "package: max abs(out − 1) at V ≡ 1", "ours peak ÷ L² matrix"],
        body,
    )  # fmt: skip


def hmatrix() -> list[str] | None:
    out = []
    for (name, label), data in present((
        ("hmatrix.json", "allocator: freed memory reused (`hiergraph.runtime.reuse_freed_memory`)"),
        ("hmatrix_default_allocator.json", "allocator: glibc defaults"),
    )):  # fmt: skip
        c = data["config"]
        out += [
            f"**{label}**. B = {c['batch']}, {c['heads']} heads, d = {c['dim']}, block size "
            f"(Nr) {c['block_size']}, {c['dtype']}, {c['threads']} threads, forward+backward; "
            f"methods interleaved, {c['repeats']} rounds (flat SDPA: {c['sdpa_rounds_from_16k']} "
            f"from 16K; every method {c['rounds_at_64k']} at 64K); errors on "
            f"{data['rows'][0].get('sampled_rows', '–')} sampled query rows against float64 "
            f"references. Command: {code(data['command'])}.",
            "",
        ]
        out += _hmatrix_table(data)
        out += [source(name), ""] + plot(name.replace(".json", ".png"), name)
    listops = load("hmatrix_listops.json")
    if listops is not None:
        a = listops["args"]
        out += [
            f"**ListOps** ({a['train_size']:,} training / {a['test_size']:,} test expressions "
            f"of {a['min_len']}–{a['max_len']} tokens, {num(a['budget_seconds'])} s of training "
            f"per encoder; `examples/listops.py`): a smoke-scale run, not an accuracy "
            "comparison.",
            "",
        ]
        out += table(
            ["encoder", "parameters", "steps", "s / step", "last loss", "test accuracy"],
            [[r["encoder"], f"{r['parameters']:,}", r["steps"], num(r["seconds_per_step"]),
              num(r["last_loss"]), acc(r["test_accuracy"])] for r in listops["results"]],
        )  # fmt: skip
        out += [source("hmatrix_listops.json"), ""]
    return out or None


def vcc() -> list[str] | None:
    d = load("vcc.json")
    if d is None:
        return None
    c, m = d["config"], d["machine"]
    out = [
        f"One layer ({c['layer']}), forward+backward, d = {c['dim']}, {c['heads']} heads, "
        f"{c['num_vip']} VIP tokens, block size {c['block_size']}, {c['num_refined']} refined "
        f"blocks, {c['dtype']}, batch {c['batch']}, {threads(m['threads'])}; VCC and the full "
        f"layer interleaved (`python benchmarks/vcc.py --threads {m['threads']}`). Error: "
        "relative error of the VIP rows' update, on trained-like / iid inputs.",
        "",
    ]
    by = {(r["n"], r["method"]): r for r in d["rows"]}
    body = []
    for n in sorted({r["n"] for r in d["rows"]}):
        v = by[(n, "vcc")]
        full = by.get((n, "full"))
        projected = by.get((n, "full (projected n^2)"))
        if full:
            full_cell, speed = spread(full["times_s"]), ratio(full["median_s"] / v["median_s"])
            peaks = f"{num(v['peak_mib'])} / {num(full['peak_mib'])}"
        else:
            full_cell = f"({secs(projected['median_s'])}, projected n²)" if projected else "–"
            speed, peaks = "–", f"{num(v['peak_mib'])} / –"
        e = v.get("errors", {})
        err = (
            f"{num(100 * e['trained_like']['vip_update_rel_error'])}% / "
            f"{num(100 * e['iid']['vip_update_rel_error'])}%"
            if e
            else "–"
        )
        body.append([f"{n:,}", f"{v['compressed_length']:,}", spread(v["times_s"]), full_cell,
                     speed, peaks, err])  # fmt: skip
    out += table(
        ["n", "compressed length r", "VCC", "full", "full ÷ VCC", "peak RSS MiB VCC / full",
         "VIP update error"],
        body,
    )  # fmt: skip
    return out + [source("vcc.json"), ""] + plot("vcc.png", "VCC") + vcc_retrieval()


def vcc_retrieval() -> list[str]:
    """``examples/vcc_long_qa.py``'s run: trained from scratch on synthetic retrieval."""
    d = load("vcc_long_qa.json")
    if d is None:
        return []
    a = d["args"]
    out = [
        f"Trained from scratch on synthetic retrieval (a question token and a fact planted "
        f"among filler tokens; synthetic data) with a length curriculum up to "
        f"{a['length']:,} tokens, {secs(a['budget'])} of training per model, "
        f"{threads(a['threads'])}; accuracy on {a['eval_batches']} held-out batches at "
        f"{a['length']:,} tokens (`python examples/vcc_long_qa.py --length {a['length']} "
        f"--threads {a['threads']} --distractors {a['distractors']} --budget "
        f"{a['budget']:g} --eval-batches {a['eval_batches']} --models "
        f"{' '.join(a['models'])} --json ...`).",
        "",
    ]
    rows = [[r["model"], f"{r['reached_length']:,}", f"{r['steps']:,}",
             f"{r['accuracy']:.3f}", f"{r['chance']:.3f}"] for r in d["results"]]  # fmt: skip
    out += table(["model", "training length reached", "steps", "accuracy", "chance"], rows)
    return out + [source("vcc_long_qa.json"), ""]


def _budget(data: dict) -> str:
    return " ".join(budget_flags(data["budget"]))


def budget_flags(budget: list[str]) -> list[str]:
    """The flags of a documents budget that change results (not the dataset, threads or
    progress); ``benchmarks/documents.py`` uses it too."""
    skip = {"--dataset", "--embedding", "--threads"}
    out, i = [], 0
    while i < len(budget):
        if budget[i] in skip:
            i += 2
        elif budget[i] == "--no-progress":
            i += 1
        else:
            out.append(budget[i])
            i += 1
    return out


def _doc_rows(data: dict, with_test: bool = True) -> list[list[str]]:
    body = []
    for label in dict.fromkeys(r["label"] for r in data["runs"]):
        runs = [r for r in data["runs"] if r["label"] == label]
        epochs = [h for r in runs for h in r["history"]]
        cpu = [h["epoch_cpu_seconds"] for h in epochs if "epoch_cpu_seconds" in h]
        row = [label, len(runs)]
        if with_test:
            row += [mean_std([r["test_acc"] for r in runs]),
                    acc(statistics.fmean(r["test_f1"] for r in runs))]  # fmt: skip
        row += [
            acc(statistics.fmean(r["val_acc"] for r in runs)),
            spread([h["epoch_seconds"] for h in epochs], num),
            spread(cpu, num) if cpu else "–",
        ]
        body.append(row)
    return body


def documents() -> list[str] | None:
    out = []
    header = ["model", "seeds", "test accuracy", "test F1 (mean)", "validation (mean)",
              "epoch wall s", "epoch CPU s"]  # fmt: skip
    for name, data in present(("documents_imdb.json", "documents_20ng.json", "documents_bbc.json")):
        out += [
            f"**{data['dataset']}**, one budget for every model: "
            f"{code(_budget(data))}. Epoch times: median [min–max] over the "
            "epochs of all seeds.",
            "",
        ]
        body = _doc_rows(data)
        tfidf = data.get("tfidf_logreg")
        if tfidf:
            body.append(["TF-IDF + LR", "–", acc(tfidf["test_acc"]), "–", acc(tfidf["val_acc"]),
                         "–", "–"])  # fmt: skip
        out += table(header, body)
        out += [f"Commands: {code(data['command'])}.", "", source(name), ""]
    selection = sorted(RESULTS.glob("documents-select-*.json"))
    if selection:
        out += [
            "**Model-selection and longer-budget runs** (`run --tag NAME`): each file, its "
            "budget and its models.",
            "",
        ]
        for path in selection:
            data = json.loads(path.read_text())
            out += [
                f"`{path.name}` ({data['dataset']}, {code(_budget(data))}):",
                "",
            ]
            out += table(header, _doc_rows(data))
        out += ["Commands are stored in each file (`command`).", ""]
    epochs = sorted(RESULTS.glob("documents-epoch-*.json"))
    if epochs:
        body = []
        for path in epochs:
            d = json.loads(path.read_text())
            kind = "extrapolated" if d.get("full_epoch_seconds_is_extrapolated") else "measured"
            body.append([
                code(d["command"]), d["torch_threads"], f"{d['train_documents']:,}",
                num(d["measured_fraction"]), f"{secs(d['full_epoch_seconds'])} ({kind})",
                secs(d["full_epoch_cpu_seconds"]), f"{num(d['leaves_per_second'])}",
            ])  # fmt: skip
        out += [
            "**One IMDB HSA training epoch** (the whole training split, "
            f"{json.loads(epochs[0].read_text())['train_split_documents']:,} documents):",
            "",
        ]
        out += table(["command", "threads", "documents timed", "fraction", "epoch wall",
                      "epoch CPU", "leaves / s"], body)  # fmt: skip
        out += [source(*(p.name for p in epochs)), ""]
    return (out + plot("documents.png", "documents")) if out else None


def _mm_summary(runs: list[dict]) -> dict:
    return {
        "test_acc": [r["test"]["acc"] for r in runs],
        "test_f1": [r["test"]["f1"] for r in runs],
        "val_acc": [r["val"]["acc"] for r in runs],
        "val_f1": [r["val"]["f1"] for r in runs],
        "train": [r["train_seconds"] for r in runs],
    }


MM_DATASETS = {"openclipart": "Open Clip Art", "emoji": "Google emoji"}


def multimodal() -> list[str] | None:
    files = [
        "multimodal.json", "multimodal_hubs.json", "multimodal_unimodal_hubs.json",
        "multimodal_hubs_seeds5-9.json", "multimodal_emoji.json", "multimodal_emoji_hubs.json",
    ]  # fmt: skip
    out = []
    for name, data in present(files):
        cfg, sizes = data["config"], data["sizes"]
        label = (
            f"{MM_DATASETS.get(data['dataset'], data['dataset'])}: "
            f"{', '.join(data['models'])}; seeds {' '.join(map(str, cfg['seeds']))}"
        )
        out += [
            f"**{label}** ({len(data['classes'])} classes; train / val / test "
            f"{sizes['train']:,} / {sizes['val']:,} / {sizes['test']:,}; {cfg['epochs']} epochs, "
            f"batch {cfg['batch_size']}, lr {cfg['lr']:g}, {threads(data.get('torch_threads'))}; "
            f"hub leaves per record: {cfg.get('hubs', 0)}). Command: {code(data['command'])}.",
            "",
        ]
        body = []
        for model, result in data["models"].items():
            s = _mm_summary(result["runs"])
            body.append([
                model, f"{result['summary']['parameters']:,}", len(result["runs"]),
                mean_std(s["test_acc"]), mean_std(s["test_f1"]), mean_std(s["val_acc"]),
                mean_std(s["val_f1"]), spread(s["train"], num),
            ])  # fmt: skip
        for key, b in (data.get("baselines") or {}).items():
            c = f" (C = {b['C']:g})" if "C" in b else ""
            val = b.get("val", {})
            body.append([f"{key}{c}", "–", "–", acc(b["test"]["acc"]), acc(b["test"]["f1"]),
                         acc(val.get("acc")), acc(val.get("f1")), "–"])  # fmt: skip
        out += table(
            ["model", "parameters", "seeds", "test accuracy", "test macro-F1", "val accuracy",
             "val macro-F1", "train s"],
            body,
        )  # fmt: skip
        if "hsa" in data["models"] and len(data["models"]) > 1:
            hsa = {r["seed"]: r for r in data["models"]["hsa"]["runs"]}
            paired = []
            for model, result in data["models"].items():
                if model == "hsa":
                    continue
                cells = []
                for metric in ("acc", "f1"):
                    diffs = [hsa[r["seed"]]["test"][metric] - r["test"][metric]
                             for r in result["runs"] if r["seed"] in hsa]  # fmt: skip
                    wins = sum(d > 0 for d in diffs)
                    std = f" ± {statistics.stdev(diffs):.3f}" if len(diffs) > 1 else ""
                    cells.append(f"{statistics.fmean(diffs):+.3f}{std} ({wins}/{len(diffs)})")
                paired.append([model, *cells])
            out += ["Paired per seed, HSA − model on test (seeds where HSA is ahead):", ""]
            out += table(["model", "accuracy", "macro-F1"], paired)
        out += [source(name), ""] + plot(name.replace(".json", ".png"), label)
    sel = load("multimodal_val_selection.json")
    if sel is not None:
        body = []
        for r in sel["runs"]:
            c = r["config"]
            body.append([
                r["model"], c["image_stem"], f"{c['image_size']}²", c["group_size"] or "–",
                c["readout"], c["dropout"], c.get("hubs", 0),
                " ".join(str(s["seed"]) for s in r["val_per_seed"]),
                acc(r["val_acc_mean"]), acc(r["val_f1_mean"]),
            ])  # fmt: skip
        out += [f"**Model selection** ({sel['note']}):", ""]
        out += table(["model", "stem", "image", "group", "readout", "dropout", "hubs", "seeds",
                      "val accuracy", "val macro-F1"], body)  # fmt: skip
        out += [source("multimodal_val_selection.json"), ""]
    return out or None


def _nc_table(data: dict) -> list[str]:
    body = []
    for key, r in data.items():
        runs = r["runs"]
        args = r.get("args", {})
        stats = r.get("hierarchy_stats")
        tree = (f"{args.get('tree', '?')}: {stats['num_families']:,} families, height "
                f"{stats['height']}" if stats else "–")  # fmt: skip
        budget = f"{args['epochs']:,} / {args['patience']}" if "epochs" in args else (
            f"– / {r['patience']}" if "patience" in r else "–")  # fmt: skip
        per_epoch = [x["sec_per_epoch"] for x in runs if "sec_per_epoch" in x]
        body.append([
            code(key), len(runs), mean_std([x["test"] for x in runs]),
            acc(statistics.fmean(x["val"] for x in runs)),
            _median_int([x["best_epoch"] for x in runs if "best_epoch" in x]), budget,
            spread(per_epoch, num) if per_epoch else "–", tree,
        ])  # fmt: skip
    return table(
        ["key", "seeds", "test accuracy", "validation (mean)", "best epoch (median)",
         "max epochs / patience", "s / training step", "tree"],
        body,
    )  # fmt: skip


def node_classification() -> list[str] | None:
    files = [
        ("node_classification.json", "the models"),
        ("node_classification_sweep.json", "hybrid options, chosen on validation"),
        ("node_classification_p300.json", "the models at a longer patience"),
        ("node_classification_sweep_p300.json", "hybrid options, chosen on validation"),
        ("node_classification_p300_lp_02af190.json",
         "the hybrid on the label-propagation tree (trading moves resolved)"),
        ("node_classification_sweep_p300_lp_02af190.json",
         "ConeConv local layers under that tree, chosen on validation"),
    ]  # fmt: skip
    out = [
        "`examples/node_classification.py`, Cora public split, 1 thread; the test score is read "
        "at the epoch of best validation accuracy (ties: lower validation loss). Training-step "
        "times: median [min–max] over the seeds' medians.",
        "",
    ]
    found = False
    for (name, label), data in present(files):
        found = True
        out += [f"**{label}** (`{name}`)", ""] + _nc_table(data)
        notes = [f"{code(k)}: {r['note']}" for k, r in data.items() if r.get("note")]
        out += [f"Note: {n}" for n in notes] + ([""] if notes else [])
        out += [source(name), ""]
    return out if found else None


def _gh_cell(runs: list[dict]) -> str:
    if not runs:
        return "–"
    if "skipped" in runs[0]:
        extra = runs[0].get("extrapolated_sec")
        return "not run" + (f" (extrapolated {secs(extra)})" if extra else "")
    return " / ".join(spread(r["times"]) for r in runs)


def _over(runs: list[dict], hybrid_s: float | None) -> str:
    """A method's time over the hybrid's (its two runs' median), or the extrapolated ratio."""
    if runs and "sec" in runs[0] and hybrid_s:
        return ratio(runs[0]["sec"] / hybrid_s)
    if runs and runs[0].get("extrapolated_sec") and hybrid_s:
        return f"({ratio(runs[0]['extrapolated_sec'] / hybrid_s)}, extrapolated)"
    return "–"


def graph_hsa() -> list[str] | None:
    out = []
    for name, data in present(("graph_hsa.json", "graph_hsa_full_attention.json",
                 "graph_hsa_full_attention_100k.json")):  # fmt: skip
        out += [f"**{code(data['command'])}**: {data['what']}; {threads(data['threads'])}. The "
                "hybrid runs twice per N (before and after the others); each run's cell is "
                "median [min–max] over its repetitions.", ""]  # fmt: skip
        body = []
        for row in data["rows"]:
            m = row["methods"]
            hybrid = m["hsa_hybrid"]
            first = hybrid[0]
            medians = [r["sec"] for r in hybrid if "sec" in r]
            full = m.get("gps_full", [])
            perf = m.get("gps_performer", [])

            hybrid_s = statistics.median(medians) if medians else None

            body.append([
                f"{row['n']:,}", secs(first.get("tree_build_sec")), _gh_cell(hybrid),
                _gh_cell(full), _gh_cell(perf) if perf else "–",
                " / ".join(f"{num(r['peak_mib'])}" for r in hybrid if "peak_mib" in r),
                _over(full, hybrid_s), _over(perf, hybrid_s) if perf else "–",
                f"{100 * first['leaf_families_in_one_block']:.1f}%"
                if "leaf_families_in_one_block" in first else "–",
            ])  # fmt: skip
        out += table(
            ["N", "tree build", "hybrid (2 runs)", "GPS full", "GPS Performer",
             "hybrid peak MiB (runs)", "full ÷ hybrid", "Performer ÷ hybrid",
             "leaf families in one block"],
            body,
        )  # fmt: skip
        if data.get("note"):
            out += [f"Note: {data['note']}.", ""]
        out += [source(name), ""] + plot(name.replace(".json", ".png"), name)
    return out or None


def _mcnemar(a: str, b: str) -> tuple[int, int, float]:
    """Exact McNemar test of two per-document bit strings: (only a, only b, two-sided p)."""
    only_a = sum(x == "1" and y == "0" for x, y in zip(a, b, strict=True))
    only_b = sum(x == "0" and y == "1" for x, y in zip(a, b, strict=True))
    n, k = only_a + only_b, min(only_a, only_b)
    if n == 0:
        return only_a, only_b, 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return only_a, only_b, min(1.0, 2 * tail)


ZS_METHODS = ("hsa", "block", "hsa_no_size_bias")
ZS_LAYERS = ("last1", "last2", "last3", "all")


def zs_tree_label(branching, hubs) -> str:
    """``16,8`` or ``16,8 +4 hubs``: a zero-shot row's window branching and hubs."""
    return ",".join(map(str, branching)) + (f" +{hubs} hubs" if hubs else "")


def _zs_configs(res: dict) -> dict:
    by = {}
    for r in res["runs"]:
        by[(r["layers"], tuple(r["branching"]), r.get("hubs", 0), r["method"])] = r
    keys = sorted({k[:3] for k in by}, key=lambda k: (ZS_LAYERS.index(k[0]), k[1:]))
    return {k: [by.get((*k, m)) for m in ZS_METHODS] for k in keys}


def zs_cells(runs, metric) -> str:
    """``a / b / c``: ``metric`` of the three methods, the best (ties included) in bold."""
    vals = [r.get(metric) for r in runs]
    if None in vals:
        return "–"
    text = [f"{v:.3f}" for v in vals]
    best = max(text)
    return " / ".join(f"**{t}**" if t == best else t for t in text)


def zeroshot() -> list[str] | None:
    files = [  # the documents' count comes from each file
        ("zeroshot_bbc.json", "BBC News, all articles"),
        ("zeroshot_imdb.json", "IMDB, a fixed class-balanced subset, half training, half test"),
        ("zeroshot_bbc_n200.json", "BBC News, a seeded sample"),
        ("zeroshot_imdb_n400.json", "IMDB, a seeded sample"),
        ("zeroshot_bbc_n48.json", "BBC News, a seeded sample (timing runs)"),
    ]
    out = [
        "all-MiniLM-L6-v2 with the attention of some layers replaced, no training. Each cell: "
        "**HSA / same-FLOPs block attention / HSA without log n(B)**, the best in bold. "
        "Cosine: sentence embedding vs the original; token cosine: last hidden states; probe: "
        "logistic regression retrained on each method's embeddings; frozen probe: trained on "
        "the original embeddings. FLOPs: attention FLOPs per replaced layer at the maximum "
        "length.",
        "",
    ]
    found = False
    for (name, label), res in present(files):
        found = True
        configs = _zs_configs(res)
        out += [
            f"**{label}** ({res['documents']:,} documents, {num(res['mean_tokens'])} tokens on "
            f"average, at most {res['max_tokens']}; original probe "
            f"{res['original']['probe']:.4f}; {threads(res['threads'])}):",
            "",
        ]
        body = []
        for (layers, branching, hubs), runs in configs.items():
            if None in runs:
                continue
            f = runs[0]["flops_per_layer_at_max_tokens"]
            body.append([
                layers, zs_tree_label(branching, hubs),
                *(zs_cells(runs, m) for m in ("cosine", "token_cosine", "self_retrieval",
                                              "probe", "frozen_probe")),
                f"{num(f['flat'] / f['method'])}× (block {runs[1]['block']})",
            ])  # fmt: skip
        out += table(
            ["layers", "branching", "cosine", "token cosine", "self-retrieval", "probe",
             "frozen probe", "fewer FLOPs than softmax"],
            body,
        )  # fmt: skip
        original = res["original"].get("probe_correct")
        tests = []
        for (layers, branching, hubs), runs in configs.items():
            if original is None or None in runs or any("probe_correct" not in r for r in runs):
                continue
            for probe in ("probe", "frozen_probe"):
                bits = [r[probe + "_correct"] for r in runs]
                cells = []
                for other in (*bits[1:], original):
                    a, b, p = _mcnemar(bits[0], other)
                    cells.append(f"{a}:{b}, p = {p:.2g}")
                tests.append([layers, zs_tree_label(branching, hubs), probe, *cells])
        if tests:
            out += ["Paired exact McNemar tests (documents only HSA gets right : documents only "
                    "the other gets right, two-sided p):", ""]  # fmt: skip
            out += table(["layers", "branching", "probe", "HSA vs block", "HSA vs no log n(B)",
                          "HSA vs original"], tests)  # fmt: skip
        timing = {k: v for k, v in res.get("timing", {}).items() if "flat_sdpa" in v}
        if timing:
            out += ["Attention op alone, last layer, one batch (trees and hub choice included); "
                    "medians of interleaved repetitions (rows without a count: 5, from before "
                    "the count was stored). HSA: the trees built for the batch and run by "
                    "`padded_hsa`; on the padded batch: what the injected layers run, "
                    "`padded_window_hsa` (`padded_hub_window_hsa` with hubs), the same "
                    "result:", ""]  # fmt: skip

            def maybe(t, key):
                return secs(t[key]) if key in t else "–"

            out += table(
                ["tree", "batch", "repeats", "flat SDPA", "HSA", "HSA on the padded batch",
                 "same, compiled (compile)", "HSA without log n(B)", "block", "allocator"],
                [[k, " × ".join(map(str, t["batch"])), t.get("repeats", "–"),
                  secs(t["flat_sdpa"]), secs(t["hsa"]),
                  maybe(t, "hsa_padded_windows"),
                  f"{maybe(t, 'hsa_padded_windows_compiled')} ({maybe(t, 'compile_s')})",
                  secs(t["hsa_no_size_bias"]), secs(t["block"]), allocator(t)]
                 for k, t in timing.items()],
            )  # fmt: skip
            phased = {k: t["hub_phases"] for k, t in timing.items() if "hub_phases" in t}
            if phased:
                phases = list(dict.fromkeys(name for ph in phased.values() for name in ph))
                out += ["Where the time of HSA on the padded batch goes with hubs (median CPU "
                        "time per call of each phase, timed in the same run; tree rows: the "
                        "rows of every tree's tokens and hubs; kernel: the compiled kernel "
                        "running the whole trees, where it applies; else root family, window "
                        "forest and gathers: the windows' tokens and the hubs taken from the "
                        "batch; rest: the tokens' order and, without the kernel, the outputs "
                        "written back; rows without tree rows or kernel: from before the "
                        "kernel):", ""]  # fmt: skip
                out += table(
                    ["tree", *phases, "sum"],
                    [[k, *(secs(ph[name]) if name in ph else "–" for name in phases),
                      secs(sum(ph.values()))]
                     for k, ph in phased.items()],
                )  # fmt: skip
        out += [f"{len(res['commands'])} command(s), stored in the file.", "", source(name), ""]
    fid = [(n, load(n)) for n in ("zeroshot_fidelity.json", "zeroshot_fidelity_hubs96.json")]
    fid = [(n, d) for n, d in fid if d is not None]
    if fid:
        found = True
        body = []
        for _, d in fid:
            tree = f"windows ({', '.join(map(str, d['branching']))})" + (
                f" + {d['hubs']} hubs" if d["hubs"] else "")  # fmt: skip
            body.append([tree, *(" / ".join(num(d[m][k], 2) for m in ZS_METHODS) for k in
                                 ("row_kl", "token_rel_error", "pooled_rel_error", "hub_mass")),
                         num(d["softmax_hub_mass"], 2)])  # fmt: skip
        d0 = fid[0][1]
        out += [f"**Attention-level fidelity**, last layer, {d0['documents']} documents of "
                f"{d0['tokens']} tokens (HSA / block / HSA without log n(B)):", ""]  # fmt: skip
        out += table(["tree", "row KL to softmax", "output error per token",
                      "error of the token mean", "mass on softmax's top-5% keys",
                      "softmax's own mass there"], body)  # fmt: skip
        out += [source(*(n for n, _ in fid)), ""]
    return (out + plot("zeroshot.png", "zero-shot")) if found else None


def kv_cache() -> list[str] | None:
    d = load("kv_cache.json")
    if d is None:
        return None
    meta = d["meta"]
    methods = list(dict.fromkeys(r["method"] for r in d["rows"]))
    alone = [m for m in methods if m.endswith("_alone")]
    evicted = [m for m in methods if m.endswith("_evicted")]
    interleaved = [m for m in methods if m not in alone + evicted]
    out = [
        f"Decode step of one attention layer ({meta['heads']} heads × {meta['head_dim']}, "
        f"{meta['dtype']}, {threads(meta['threads'])}, {allocator(meta)}), tree "
        f"{code(meta['tree'])}; at each "
        f"context length the next {meta['timed_tokens_per_context']} tokens are timed one by "
        "one, the caches interleaved token by token"
        + (
            f" ({', '.join(interleaved)}), then "
            f"{meta.get('alone_tokens_per_context', '?')} more tokens with each cache in a "
            f"block of its own ({', '.join(alone)})"
            if alone
            else ""
        )
        + (
            f", then {meta['evicted_tokens_per_context']} more with a read of "
            f"{meta['evict_bytes'] >> 20} MiB (the same at every context) before each "
            f"step, from cold CPU caches ({', '.join(evicted)})"
            if evicted
            else ""
        )
        + (
            ". `torch_op` is no cache: one in-place addition on 4 values, timed as a step, the"
            " least any step that calls PyTorch costs in each protocol"
            if "torch_op" in methods
            else ""
        )
        + f". Only the mean and the median per token are stored. Command: "
        f"{code(meta['command'])}.",
        "",
    ]
    body = []
    for r in sorted(d["rows"], key=lambda r: (r["context"], methods.index(r["method"]))):
        body.append([
            f"{r['context']:,}", r["method"],
            f"{num(r['cpu_median_us'])} / {num(r['cpu_mean_us'])}",
            f"{num(r['median_us'])} / {num(r['mean_us'])}", f"{num(r['bytes'] / 1024)} KiB",
        ])  # fmt: skip
    out += table(
        ["context", "cache", "CPU µs/token, median / mean", "wall µs/token, median / mean",
         "cache size"],
        body,
    )  # fmt: skip
    spans = sorted({k.rsplit("growth_", 1)[1] for k in d["summary"]})
    for span in spans:
        out += [f"Growth from context {span.replace('_to_', ' to ')}:", ""]
        out += table(
            ["quantity", *methods],
            [[q.replace("_", " "),
              *(ratio(d["summary"].get(f"{m}_{q}_growth_{span}")) for m in methods)]
             for q in ("cpu_median_us", "cpu_mean_us", "median_us", "mean_us", "bytes")],
        )  # fmt: skip
    out += [source("kv_cache.json"), ""]
    return out + plot("kv_cache.png", "KV cache")


def kv_prefill() -> list[str] | None:
    data = load("kv_prefill.json")
    if data is None:
        return None
    meta = data["meta"]
    out = [
        f"One attention layer ({meta['heads']} heads × {meta['head_dim']}, {meta['dtype']}, "
        f"{threads(meta['threads'])}, {allocator(meta)}) starts from an empty cache with a "
        f"prompt of T tokens ({meta['tree']}) and returns the prompt's outputs. `prefill`: "
        "`HierarchicalKVCache.prefill` (one full causal pass, in the compiled causal kernel); "
        "`prefill_torch`: the same pass on PyTorch operations (its edge lists: no C++ "
        "compiler, accelerators); `append`: "
        "T calls of `append`, each step in the compiled CPU kernel; `append_torch`: the same "
        "loop on PyTorch operations (no C++ compiler, accelerators); `flat`: causal SDPA over "
        "the prompt and `FlatKVCache.extend`. Cells: median [min–max] over the interleaved "
        f"rounds. Command: {code(meta['command'])}.",
        "",
    ]
    body = []
    for row in data["rows"]:
        length = f"{row['length']:,}"
        for method, samples in row["samples_s"].items():
            per_token, over = row["per_token_us"][method], row["over_prefill"][method]
            body.append(
                [length, method, row["rounds"], spread(samples), num(per_token), ratio(over)]
            )
            length = ""
    out += table(["T", "method", "rounds", "wall", "µs per token", "method ÷ prefill"], body)
    out += [
        f"Largest output difference between a prefilled and an appended cache over the prompt "
        f"and the next {meta['checked_tokens']} decoded tokens, per row: "
        + ", ".join(num(r["max_abs_diff"], 2) for r in data["rows"])
        + ".",
        "",
    ]
    return out + [source("kv_prefill.json"), ""] + plot("kv_prefill.png", "KV cache prefill")


def hierarchical_lm() -> list[str] | None:
    d = load("hierarchical_lm.json")
    if d is None:
        return None
    meta = d["meta"]
    flags = " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in meta["args"].items() if k not in ("tar", "out")
    )
    out = [f"{meta['data']}; {meta['budget']}. Command: {code(meta['command'].strip())} with "
           f"{code(flags)}.", ""]  # fmt: skip
    body = [
        [model, f"{r['parameters']:,}", r["train_steps"], num(r["train_cpu_seconds"]),
         num(r["test_bits_per_byte"]), num(r["test_perplexity_per_byte"]),
         num(r["decode_ms_per_token_median"]), num(r["cache_vs_full_pass_max_logit_diff"], 2)]
        for model, r in d["results"].items()
    ]  # fmt: skip
    out += table(["model", "parameters", "training steps", "training CPU s", "test bits/byte",
                  "perplexity/byte", "decode ms/token (median)",
                  "cache vs full pass, max logit diff"], body)  # fmt: skip
    return out + [source("hierarchical_lm.json"), ""] + plot("hierarchical_lm.png", "LM")


def leaf_budget() -> list[str] | None:
    d = load("leaf_budget.json")
    if d is None:
        return None
    out = [
        f"{d['memory']}; {d['num_trees']} synthetic trees ({d['giant_leaves']:,}-leaf giants "
        f"included), hidden {d['hidden']}, {threads(d['threads'])}, {d['device']}. Target: "
        f"{d['target']}. Command: {code(d['command'])}.",
        "",
    ]
    body = []
    for run in d["runs"]:
        for model, m in run["models"].items():
            fit, s = m["fit"], m["summary"]
            cost = f"{num(fit['bytes_per_leaf'] / 1024)} KiB/leaf"
            if fit.get("internal_weight"):
                cost += f" + w = {num(fit['internal_weight'], 2)}/internal"
            body.append([
                run["budget"], model, f"{s['num_batches']} ({s['num_oversized']})", cost,
                num(s["max_ratio_to_budget_prediction"]),
                f"{num(s['min_ratio_to_own_prediction'])}–{num(s['max_ratio_to_own_prediction'])}",
                num(s["mean_fill"], 2),
            ])  # fmt: skip
        fixed = run.get("fixed")
        if fixed:
            s = fixed["summary"]
            body.append([
                run["budget"], f"fixed {run['fixed_batch_size']} trees/batch",
                s["num_batches"], "–", num(s["max_ratio_to_budget_prediction"]),
                f"{num(s['min_ratio_to_own_prediction'])}–{num(s['max_ratio_to_own_prediction'])}",
                "–",
            ])  # fmt: skip
    out += table(["budget", "cost model", "batches (oversized)", "fitted cost",
                  "max peak ÷ budget prediction", "peak ÷ own prediction", "mean fill"],
                 body)  # fmt: skip
    return out + [source("leaf_budget.json"), ""] + plot("leaf_budget.png", "leaf budget")


def dispatch_count() -> list[str] | None:
    """Operations per step off the CPU (``dispatch_count.py``), beside the same cases
    counted on another version of the library (``dispatch_count_before.json``) if present."""
    data = load("dispatch_count.json")
    if data is None:
        return None
    meta, before = data["meta"], load("dispatch_count_before.json")
    earlier = {} if before is None else {
        (r["case"], r["dtype"], r["method"]): r for r in before["rows"]
    }  # fmt: skip
    out = [
        "Operations PyTorch dispatches per forward+backward (`out.sum().backward()`) off "
        "the CPU: the HSA cases of the GPU check (`hierarchical_attention`, and "
        "`causal_hierarchical_attention` as `hsa-causal` on its batches, "
        f"{meta['heads']} heads × {meta['head_dim']}) and its H-matrix attention cases "
        "(`L=…`), run on the `meta` device (shapes only: the branches taken off the CPU, "
        "no arithmetic) and counted by a `TorchDispatchMode`. A small step on a GPU is "
        "launch-bound (see the GPU section: eager steps against their CUDA-graph replays), "
        "so its eager time grows with this count. *views*: operations that return a view; "
        "*path*: one autograd node with a written backward (`fused`) or every operation "
        "recorded (`recorded`). "
        f"Command: {code(meta['command'])} ({meta['label']}, torch {meta['torch']}"
        + ("" if before is None else f"; *before*: {code(before['meta']['command'])}, "
           f"{before['meta']['label']}") + ").",
        "",
    ]  # fmt: skip
    body = []
    for r in data["rows"]:
        old = earlier.get((r["case"], r["dtype"], r["method"]))
        cells = [] if before is None else ["–", "–"]
        if old is not None:
            cells = [f"{old['ops']:,} ({old['path']})", ratio(old["ops"] / r["ops"])]
        body.append([r["case"], r["dtype"], r["method"], r["path"], f"{r['ops']:,}",
                     f"{r['views']:,}", *cells])  # fmt: skip
    header = ["case", "dtype", "method", "path", "operations", "of them views"]
    if before is not None:
        header += ["before", "before ÷ now"]
    out += table(header, body)
    sources = ["dispatch_count.json"] + ([] if before is None else ["dispatch_count_before.json"])
    return out + [source(*sources), ""] + plot("dispatch_count.png", "operations per step")


def gpu_table(d: dict) -> list[str]:
    """One row per (section, case, dtype, method) of a ``gpu.py`` run. Memory: the absolute
    peak (all live tensors, the case's other methods' too), what the step added above the
    level before it (its inputs and their gradients excluded), and the step's own footprint
    where the run recorded it."""

    def mib(row: dict, key: str) -> str:
        return num(row[key]) if row.get(key) is not None else "–"

    body = []
    for r in d["rows"]:
        base = next((k for k in r if k.startswith("ratio_to_")), None)
        if r["status"] == "ok":
            times = spread([t / 1e3 for t in r.get("times_ms", [])])
            memory = [mib(r, "peak_mib"), mib(r, "peak_above_mib"), mib(r, "footprint_mib")]
            rel = f"{ratio(r[base])} ({base.removeprefix('ratio_to_')})" if base else "–"
        else:
            times, memory, rel = f"{r['status']}: {r.get('reason', '')}", ["–"] * 3, "–"
        body.append([r["section"], r["case"], r["dtype"], r["method"], times, *memory, rel])
    return table(["section", "case", "dtype", "method", "forward+backward", "peak MiB",
                  "step's rise MiB", "own footprint MiB", "time ÷ the case's first method"],
                 body)  # fmt: skip


def gpu_profiles(d: dict) -> list[str]:
    """The profiled rows of a ``gpu.py`` run: per step, the kernels (operators on a CPU)
    launched, their summed time, the wall time and the three that took longest."""
    body = [
        [r["case"], r["dtype"], r["method"], f"{num(p['per_step'])} {p['unit']}",
         f"{p['busy_ms']:.3g} ms", f"{p['wall_ms']:.3g} ms",
         "; ".join(f"{code(t['name'][:60])} ×{t['calls']:g} {t['ms']:.3g} ms"
                   for t in p["top"][:3])]
        for r in d["rows"] if (p := r.get("profile"))
    ]  # fmt: skip
    if not body:
        return []
    return [
        "Where the time goes (`torch.profiler`, three steps, per step): the kernels launched "
        "(operators on a CPU), their summed time, the step's wall time, and the three that "
        "took longest.",
        "",
        *table(
            ["case", "dtype", "method", "launched", "their time", "wall", "longest three"], body
        ),  # fmt: skip
    ]


def gpu_run(d: dict) -> list[str]:
    """The device, the command, the CUDA tests' counts and sections that did not finish."""
    meta, tests = d["meta"], d.get("tests", {})
    out = [
        f"Device: {meta.get('device_name', meta.get('device'))}; torch {meta.get('torch')}, "
        f"CUDA {meta.get('cuda')}; command {code(str(meta.get('command', '')))}; sources "
        f"{code(str(meta.get('source_sha1', '?')))}. Methods of a case ran in interleaved "
        "rounds; cells are median [min–max] over the rounds. Memory: *peak* counts every "
        "live tensor, the case's other methods' too; *the step's rise* is what one step "
        "allocated above the level before it (its own inputs and their gradients not "
        "included); *own footprint*, where recorded, is the step alone (its rise plus its "
        "inputs and gradients).",
        "",
    ]
    if counts := pytest_counts(tests):
        out += [f"`pytest -m cuda`: {counts}.", ""]
    compiled = d["sections"].get("compiled", {})
    if counts := pytest_counts(compiled):
        out += [f"Compiled by inductor vs eager (`{compiled['command']}`): {counts}.", ""]
    unfinished = [name for name, sec in d["sections"].items() if sec.get("status") == "running"]
    if unfinished:
        out += [f"Sections the process ended in before finishing: {', '.join(unfinished)} "
                "(rows after the last one shown were not measured).", ""]  # fmt: skip
    return out


def pytest_counts(run: dict) -> str:
    """``passed N, failed N, …`` of a pytest run recorded by ``benchmarks/gpu.py``."""
    keys = ("passed", "failed", "errors", "skipped")
    return ", ".join(f"{k} {run[k]}" for k in keys if k in run)


def gpu_targets_table(runs: list[tuple[dict, str]]) -> list[str]:
    """The targets of ``benchmarks/gpu_targets.py`` on each ``(run, twin)``: eager steps
    (``twin = ""``) and the CUDA-graph twins (``"+graph"``), one column each."""
    results = [targets.evaluate(d, twin) for d, twin in runs]
    cells = {}  # (target, dtype) -> one cell per run
    for i, rows in enumerate(results):
        for t in rows:
            cell = cells.setdefault((t["target"], t["dtype"], t["need"]), ["–"] * len(runs))
            if t["met"] is None:
                cell[i] = "not measured"
            else:
                value = f"{num(t['value'])}{t['unit']}" if t["unit"] else num(t["value"])
                note = f", {t['why']}" if t.get("why") else ""
                cell[i] = f"{'met' if t['met'] else '**not met**'}: {value}{note}"
    header = ["target", "dtype", "needs", *(("eager", "CUDA graph")[: len(runs)])]
    body = [[target, dtype, need, *cell] for (target, dtype, need), cell in cells.items()]
    return [
        "Targets (`benchmarks/gpu_targets.py`), from the runs below: each method against its "
        "peer in the same case; *CUDA graph*: the steps replayed as captured graphs (a peer "
        "without a twin counts with its eager step, as named).",
        "",
        *table(header, body),
    ]


def gpu() -> list[str]:
    d = load("gpu/gpu.json")
    if d is None:
        return ["No GPU run is recorded (`results/gpu/gpu.json` is absent). "
                "`python benchmarks/gpu.py --out benchmarks/results/gpu` on a CUDA machine "
                "writes it; this section then shows its tables.", ""]  # fmt: skip
    graphs = load("gpu/graphs/gpu.json")
    runs = [(d, "")] + ([] if graphs is None else [(graphs, "+graph")])
    out = gpu_targets_table(runs) + gpu_run(d) + gpu_table(d) + [""] + gpu_profiles(d)
    out += [source("gpu/gpu.json"), ""] + plot("gpu/gpu.png", "GPU")
    if graphs is not None:
        out += ["", "### CUDA-graph twins", "",
                "The same cases with `--graphs`: `name+graph` replays the method's whole step "
                "(forward and backward) captured as one CUDA graph.", ""]  # fmt: skip
        out += gpu_run(graphs) + crashed(d["sections"].get("graphs", {}))
        out += gpu_table(graphs) + [source("gpu/graphs/gpu.json"), ""]
    return out


def crashed(section: dict) -> list[str]:
    """Why a section's subprocess exited with an error: its last exception line and the
    first device-side assertion in its log, if any."""
    if section.get("status") != "error":
        return []
    lines = str(section.get("reason", "")).splitlines()
    error = next((x for x in reversed(lines) if re.match(r"[\w.]+(Error|Exception)\b", x)), "")
    asserted = next((x for x in lines if "Assertion" in x), "")
    why = "; ".join(code(x.strip()) for x in (error, asserted.split(": ", 1)[-1]) if x)
    return [f"The process exited with code {section.get('returncode')}: {why or 'no message'}.", ""]


SECTIONS: list[tuple[str, Callable[[], list[str] | None]]] = [
    ("HSA: scaling to 256K leaves", hsa_scaling),
    ("Two commits side by side", compare_commits),
    ("HSA at short lengths", hsa_short),
    ("HSA inference at short lengths", hsa_inference),
    ("HSA on batches of different lengths", hsa_lengths),
    ("HSA layer with hub leaves", hsa_hubs),
    ("HSA with wide families", hsa_wide),
    ("Hierarchical Transformer Encoder: one epoch", hte_epoch),
    ("Masked attention (MaskedAttentionConv)", masked_attention),
    ("Cone attention: speed", cone_speed),
    ("Cone attention: Cora accuracy", cone_accuracy),
    ("H-matrix attention", hmatrix),
    ("VCC", vcc),
    ("Documents", documents),
    ("Multimodal records", multimodal),
    ("Graphs: Cora node classification", node_classification),
    ("Graphs: one GraphHSA layer at scale", graph_hsa),
    ("Zero-shot HSA in a pretrained encoder", zeroshot),
    ("Hierarchical KV cache", kv_cache),
    ("Starting a KV cache with a prompt", kv_prefill),
    ("Byte-level language model", hierarchical_lm),
    ("Leaf-budget batching", leaf_budget),
    ("Operations per step off the CPU", dispatch_count),
    ("GPU", gpu),
]


def anchor(title: str) -> str:
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -")
    return keep.replace(" ", "-")


def render() -> str:
    sections = [(title, fn()) for title, fn in SECTIONS]
    sections = [(title, lines) for title, lines in sections if lines]
    out = [
        "# Benchmark results",
        "",
        "<!-- Generated by benchmarks/report.py from benchmarks/results/*.json: do not edit. -->",
        "",
        "Every number below is read from the JSON files in [`results/`](results/) by "
        "`python benchmarks/report.py`, which writes this file; the plots are the PNGs the "
        "benchmark scripts wrote. Timings are CPU measurements unless a section says "
        "otherwise, on the machine named in each JSON; compare methods within a table.",
        "",
        "Conventions: a repeated time is **median [min–max] ×n** (n samples or interleaved "
        "rounds); an accuracy over seeds is **mean ± std [min–max]** (sample std), with the "
        "number of seeds in its own column; `–` marks a value that was not measured.",
        "",
        "## Contents",
        "",
    ]
    out += [f"- [{title}](#{anchor(title)})" for title, _ in sections] + [""]
    for title, lines in sections:
        out += [f"## {title}", "", *lines]
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare, exit 1 if stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = README.read_text() if README.exists() else ""
        if current != text:
            print(f"{README} is out of date: run python benchmarks/report.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(text)
    print(f"wrote {README.relative_to(HERE.parent)} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
