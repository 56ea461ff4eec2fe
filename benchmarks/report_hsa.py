"""The report's sections on the HSA layer on CPU: scaling, short lengths, hubs, wide
families, batches of different lengths and inference."""

from __future__ import annotations

from report_format import allocator, code, num, ratio, secs, spread, table, threads
from report_results import load, present, sourced


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
    return out + sourced("hsa_scaling.json", "HSA scaling")


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
        out += sourced(name, f"HSA short, {name}")
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
    out += sourced("hsa_hubs.json", "HSA layer with hubs")
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
    return out + sourced("hsa_wide.json", "HSA with wide families")


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
    return out + sourced("hsa_lengths.json", "HSA, mixed lengths")


def plan_build() -> list[str] | None:
    data = load("plan_build.json")
    if data is None:
        return None
    meta = data["meta"]
    out = [
        "A batch's plan (`TreeIndex`), built once per batch on the host, beside the step of "
        "the HSA op it serves: the rows of the section above, window trees (`windows`) "
        "and trees of windows of random sizes (`ragged`). `collate`: PyG's "
        "`Batch.from_data_list`; `plan`: `TreeIndex.from_hierarchy` as the ops build it, the "
        "padded embedding and the family blocks left for the paths that read them; "
        "`plan-complete`: with those built, as `tree_index()` and `HierarchyLoader` build it "
        "(and as every plan was built before they were left for first use); `hsa`: "
        "forward+backward on the built plan (default kernel, which reads neither part), "
        f"{meta['heads']} heads, d = {meta['dim']}, {meta['dtype']}; `flat`: SDPA on the "
        f"zero-padded batch with a key padding mask; {threads(meta['threads'])}, "
        f"{allocator(meta)}, CPU capability {meta['cpu_capability']}. Cells: median "
        "[min–max] over the interleaved rounds; `plan share`: plan ÷ (plan + hsa). "
        f"Command: {code(meta['command'])}.",
        "",
    ]
    body = []
    for row in data["rows"]:
        shape = row_shape(row)
        samples = row["samples_s"]
        for forest, derived in row["derived"].items():
            body.append([
                shape, forest, row["paths"][forest],
                *(spread(samples[f"{forest}/{step}"]) for step in ("collate", "plan")),
                spread(samples[f"{forest}/plan-complete"]),
                ratio(derived["complete_over_plan"]), spread(samples[f"{forest}/hsa"]),
                num(derived["plan_share"], 2), spread(samples["flat"]),
                ratio(derived["flat_over_hsa"]), ratio(derived["flat_over_hsa_and_plan"]),
            ])  # fmt: skip
            shape = ""
    out += table(["B × L (branching)", "forest", "path", "collate", "plan", "plan-complete",
                  "complete ÷ plan", "hsa", "plan share", "flat", "flat ÷ hsa",
                  "flat ÷ (hsa + plan)"], body)  # fmt: skip
    return out + sourced("plan_build.json", "plan build beside the HSA step")


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
    return out + sourced("hsa_inference.json", "HSA inference")
