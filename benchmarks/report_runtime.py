"""The report's sections on how the library runs: leaf-budget batching and the
operations dispatched per step."""

from __future__ import annotations

from report_format import code, num, ratio, table, threads
from report_results import load, plot, source, sourced


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
    return out + sourced("leaf_budget.json", "leaf budget")


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
