"""The report's sections on graphs: Cora node classification and GraphHSA at scale."""

from __future__ import annotations

import statistics

from report_format import acc, code, mean_std, median_int, num, ratio, secs, spread, table, threads
from report_results import present, source, sourced


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
            median_int([x["best_epoch"] for x in runs if "best_epoch" in x]), budget,
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
        out += sourced(name, name)
    return out or None
