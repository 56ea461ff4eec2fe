"""The report's sections on classifying documents and multimodal records."""

from __future__ import annotations

import json
import statistics

import report_results
from report_format import acc, code, mean_std, num, secs, spread, table, threads
from report_results import load, merged, present, source, sourced


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
    selection = sorted(report_results.RESULTS.glob("documents-select-*.json"))
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
        out += [source(*(p.name for p in selection)), ""]
    epochs = sorted(report_results.RESULTS.glob("documents-epoch-*.json"))
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
    if not out:
        return None
    return out + merged("documents.json", "documents.png", "documents")


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
        out += sourced(name, label)
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
