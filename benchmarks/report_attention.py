"""The report's sections on the other attention layers: the Hierarchical Transformer
Encoder, masked attention, cone attention, H-matrix attention and VCC."""

from __future__ import annotations

import statistics

from report_format import acc, code, mean_std, median_int, num, ratio, secs, spread, table, threads
from report_results import load, present, source, sourced


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
    return out + sourced("hte_epoch.json", "HTE epoch")


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
        out += sourced(name, name)
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
    return out + sourced("cone.json", "ConeConv vs GATConv")


def _fmean(values: list | None) -> float | None:
    return statistics.fmean(values) if values else None


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
                acc(_fmean(r.get("val_accuracy"))), median_int(r.get("best_epoch")),
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
        out += sourced(name, name)
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
    return out + sourced("vcc.json", "VCC") + vcc_retrieval()


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
