"""HSA vs flat attention (FSA) vs DeepSet on real long-document classification.

Runs ``examples/document_classification.py`` (frozen all-MiniLM-L6-v2 WordPiece
vectors, one HTE layer, mean pooling, MLP) for every seed and model, models
interleaved within each seed so that all see the same machine load, with the
same budget (training subset, epochs, batch size, learning rate) for all.

    HIERGRAPH_RAW=<datasets> python benchmarks/documents.py run --dataset imdb
    HIERGRAPH_RAW=<datasets> python benchmarks/documents.py run --dataset 20ng
    python benchmarks/documents.py report   # -> results/documents.json + documents.png
    python benchmarks/documents.py epoch --threads 2   # one IMDB HSA epoch, timed

``epoch`` times one training epoch of the HSA model on the full IMDB training
split (``--fraction`` < 1: its first batches, with the full-epoch time
extrapolated and labelled as such) and writes ``results/documents-epoch-<threads>t.json``
(wall and CPU seconds, threads).

``run`` writes ``results/documents_<dataset>.json`` after every finished run,
so an interrupted job keeps what it measured. ``report`` merges them. Budgets
(learning rate, epochs, depth) are chosen on validation: ``run --tag <name>``
writes a selection run to ``results/documents-select-<dataset>-<name>.json``,
which ``report`` lists by validation accuracy only; ``run --configs --tfidf``
(no labels) only adds the TF-IDF + LR baseline.
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
import torch
from report_documents import budget_flags  # the sibling module (benchmarks/ is on sys.path)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
#: (label, --model, extra caps) per dataset; FSA always sees the first 512 tokens. On 20NG,
#: HSA keeps the whole document but caps every sentence at 512 tokens (no family is larger
#: than FSA's one block): a few "sentences" are 15k-token uuencoded files or tables, whose
#: O(W^2) blocks would make HSA's epoch ~10x costlier (12% of the tokens, all in such
#: sentences, are cut; FSA-512 cuts 44%).
SENTENCE_CAP = ["--max-sentence-tokens", "512"]
CONFIGS = {
    "imdb": [
        ("HSA", "hsa", []),
        ("HSA-512", "hsa", ["--max-tokens", "512"]),
        ("FSA-512", "fsa", ["--max-tokens", "512"]),
        ("DeepSet", "deepset", []),
    ],
    "20ng": [
        ("HSA", "hsa", SENTENCE_CAP),
        ("HSA-512", "hsa", ["--max-tokens", "512"]),
        ("FSA-512", "fsa", ["--max-tokens", "512"]),
        ("DeepSet", "deepset", SENTENCE_CAP),
    ],
}
CONFIGS["bbc"] = CONFIGS["imdb"]


def load_example():
    """``examples/document_classification.py`` as a module (imported when a command needs it)."""
    sys.path.insert(0, str(HERE.parent / "examples"))  # the script and the helpers it imports
    return importlib.import_module("document_classification")


def run(args) -> None:
    example = load_example()
    name = f"-select-{args.dataset}-{args.tag}" if args.tag else f"_{args.dataset}"
    out = RESULTS / f"documents{name}.json"
    budget = [
        "--dataset", args.dataset, "--embedding", "static", "--epochs", str(args.epochs),
        "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--depth", str(args.depth),
        "--threads", str(args.threads), "--no-progress",
    ]  # fmt: skip
    for split in ("train", "val", "test"):  # 0: the whole split
        budget += [f"--{split}-size", str(getattr(args, f"{split}_size") or 0)]
    result = {
        "dataset": args.dataset,
        "budget": budget,
        "command": "python benchmarks/documents.py " + " ".join(sys.argv[1:]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "runs": [],
    }  # fmt: skip
    if args.append and out.exists():
        previous = json.loads(out.read_text())
        result["runs"], result["command"] = (
            previous["runs"],
            previous["command"] + " && " + result["command"],
        )
        result["tfidf_logreg"] = previous.get("tfidf_logreg")
    if args.tfidf:
        splits, _ = example.load_splits(example.parse_args(budget))
        start = time.process_time()
        result["tfidf_logreg"] = example.tfidf_baseline(splits)
        result["tfidf_logreg"]["cpu_seconds"] = time.process_time() - start
        out.write_text(json.dumps(result, indent=1))
    configs = list(CONFIGS[args.dataset])
    hsa_caps = next(caps for label, _, caps in configs if label == "HSA")
    for g in args.hubs:  # HSA with g hub tokens per document lifted to the root
        configs.append((f"HSA+hubs{g}", "hsa", [*hsa_caps, "--hubs", str(g)]))
    for seed in args.seeds:
        for label, model, caps in configs:
            if args.configs is not None and label not in args.configs:
                continue
            argv = [*budget, "--model", model, "--seeds", str(seed), *caps]
            load = os.getloadavg()[0]
            res = example.main(argv)
            (run_,) = res["runs"]
            result["runs"].append(
                {
                    "label": label,
                    "model": model,
                    "caps": caps,
                    "seed": seed,
                    "load_average_1min_at_start": load,
                    "test_acc": run_["test_acc"],
                    "test_f1": run_["test_f1"],
                    "val_acc": run_["val_acc"],
                    "trainable_parameters": run_["trainable_parameters"],
                    "history": run_["history"],
                    "full_epoch_seconds_extrapolated": res["summary"][
                        "full_epoch_seconds_extrapolated"
                    ],
                    "sizes": res["sizes"],
                    "truncation_full_splits": res["truncation_full_splits"],
                }
            )
            result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
            out.write_text(json.dumps(result, indent=1))


def epoch(args) -> None:
    example = load_example()
    argv = ["--dataset", "imdb", "--model", "hsa", "--threads", str(args.threads)]
    whole = ["--train-size", "0", "--val-size", "0", "--test-size", "0"]
    ex_args = example.parse_args(
        [*argv, *whole, "--epochs", "1", "--batch-size", str(args.batch_size)]
    )
    torch.set_num_threads(args.threads)
    splits, _ = example.load_splits(ex_args)
    start, cpu = time.perf_counter(), time.process_time()
    loader = example.DocumentLoader(splits["train"], ex_args.batch_size, shuffle=True)
    prepare, prepare_cpu = time.perf_counter() - start, time.process_time() - cpu
    torch.manual_seed(0)
    model = example.build_model(ex_args, splits["train"])
    _, optimizer, scheduler = example.optimizer_and_schedule(ex_args, model, len(loader))
    batches = round(args.fraction * len(loader))
    record = example.train_epoch(model, loader, optimizer, scheduler, max_batches=batches)
    scale = len(splits["train"]) / record["train_documents"]
    result = {
        "command": "python benchmarks/documents.py " + " ".join(sys.argv[1:]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "torch_threads": torch.get_num_threads(),
        "model": {k: getattr(ex_args, k) for k in ("proj", "hidden", "heads", "pos_channels")},
        "train_split_documents": len(splits["train"]),
        "loader_prepare_seconds": prepare,
        "loader_prepare_cpu_seconds": prepare_cpu,
        **record,
        "measured_fraction": 1 / scale,
        "full_epoch_seconds": record["epoch_seconds"] * scale + prepare,
        "full_epoch_seconds_is_extrapolated": scale > 1,
        "full_epoch_cpu_seconds": record["epoch_cpu_seconds"] * scale + prepare_cpu,
    }
    (RESULTS / f"documents-epoch-{args.threads}t.json").write_text(json.dumps(result, indent=1))
    label = "extrapolated from " * (scale > 1) + f"{record['train_documents']} documents"
    print(
        f"one IMDB HSA epoch ({len(splits['train'])} documents, {label}): "
        f"{result['full_epoch_seconds'] / 60:.2f} min wall, "
        f"{result['full_epoch_cpu_seconds'] / 60:.2f} min CPU, {args.threads} threads, "
        f"load average {record['load_average_1min']}"
    )


def summarize(result: dict) -> dict:
    table = {}
    for label in dict.fromkeys(r["label"] for r in result["runs"]):
        runs = [r for r in result["runs"] if r["label"] == label]
        acc = [r["test_acc"] for r in runs]
        epochs = [h for r in runs for h in r["history"]]
        table[label] = {
            "seeds": [r["seed"] for r in runs],
            "test_acc_mean": float(np.mean(acc)),
            "test_acc_std": float(np.std(acc)),
            "test_f1_mean": float(np.mean([r["test_f1"] for r in runs])),
            "val_acc_mean": float(np.mean([r["val_acc"] for r in runs])),
            "epoch_seconds_median": float(np.median([h["epoch_seconds"] for h in epochs])),
            "epoch_cpu_seconds_median": float(
                np.median([h.get("epoch_cpu_seconds", np.nan) for h in epochs])
            ),
            "full_epoch_seconds_extrapolated_median": float(
                np.median([r["full_epoch_seconds_extrapolated"] for r in runs])
            ),
            "trainable_parameters": runs[0]["trainable_parameters"],
        }
    return table


def report(args) -> None:
    merged = {"benchmark": "documents", "datasets": {}}
    for path in sorted(RESULTS.glob("documents_*.json")):
        result = json.loads(path.read_text())
        result["summary"] = summarize(result)
        merged["datasets"][result["dataset"]] = result
    selection = sorted(RESULTS.glob("documents-select-*.json"))
    merged["selection"] = [selection_row(path) for path in selection]
    (RESULTS / "documents.json").write_text(json.dumps(merged, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(merged["datasets"])
    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        summary = merged["datasets"][name]["summary"]
        labels = list(summary)
        ticks = [f"{k}\n({len(summary[k]['seeds'])} seeds)" for k in labels]
        means = [summary[k]["test_acc_mean"] for k in labels]
        stds = [summary[k]["test_acc_std"] for k in labels]
        ax.bar(ticks, means, yerr=stds, capsize=4, color="tab:blue")
        tfidf = merged["datasets"][name].get("tfidf_logreg")
        if tfidf:
            ax.axhline(tfidf["test_acc"], color="tab:red", ls="--", label="TF-IDF + LR")
            ax.legend(loc="lower right")
        top = max(means + [tfidf["test_acc"]] if tfidf else means)
        ax.set_title(f"{name}: test accuracy (mean ± std)")
        ax.set_ylim(max(0.0, min(means) - 0.1), min(1.0, top + 0.05))
    fig.tight_layout()
    fig.savefig(RESULTS / "documents.png", dpi=120)
    print(markdown_table(merged))
    print(selection_table(merged["selection"]))


def selection_row(path: Path) -> dict:
    """A model-selection run: its budget and each model's validation accuracy (mean)."""
    result = json.loads(path.read_text())
    summary = summarize(result)
    return {
        "file": path.name,
        "dataset": result["dataset"],
        "budget": result["budget"],
        "command": result["command"],
        "val_acc": {label: row["val_acc_mean"] for label, row in summary.items()},
        "seeds": {label: row["seeds"] for label, row in summary.items()},
    }


def selection_table(rows: list[dict]) -> str:
    """Validation accuracy of every selection run (test accuracy is not shown: not for choosing)."""
    lines = ["| dataset | budget | seeds | val acc per model |", "|---|---|---|---|"]
    for row in rows:
        budget = " ".join(budget_flags(row["budget"]))
        scores = ", ".join(f"{k} {v:.3f}" for k, v in row["val_acc"].items())
        seeds = sorted({s for v in row["seeds"].values() for s in v})
        lines.append(f"| {row['dataset']} | `{budget}` | {seeds} | {scores} |")
    return "\n".join(lines)


def markdown_table(merged: dict) -> str:
    """The README table: test accuracy mean ± std per dataset and model, and epoch times."""
    rows = [
        "| dataset | model | seeds | test acc (mean ± std) | test F1 | val acc "
        "| epoch wall / CPU [s] |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, result in merged["datasets"].items():
        for label, row in result["summary"].items():
            rows.append(
                f"| {name} | {label} | {len(row['seeds'])} | {row['test_acc_mean']:.3f} ± "
                f"{row['test_acc_std']:.3f} | {row['test_f1_mean']:.3f} | "
                f"{row['val_acc_mean']:.3f} | {row['epoch_seconds_median']:.0f} / "
                f"{row['epoch_cpu_seconds_median']:.0f} |"
            )
        tfidf = result.get("tfidf_logreg")
        if tfidf:
            rows.append(
                f"| {name} | TF-IDF + LR | – | {tfidf['test_acc']:.3f} | – | "
                f"{tfidf['val_acc']:.3f} | – |"
            )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train and evaluate every model for every seed")
    r.add_argument("--dataset", choices=sorted(CONFIGS), default="imdb")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--train-size", type=int, default=None, help="default: the whole split")
    r.add_argument("--val-size", type=int, default=None)
    r.add_argument("--test-size", type=int, default=None)
    r.add_argument("--epochs", type=int, default=1)
    r.add_argument("--batch-size", type=int, default=64)
    r.add_argument("--lr", type=float, default=3e-3)
    r.add_argument("--depth", type=int, choices=(1, 2, 3), default=3, help="tree levels")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--tfidf", action="store_true", help="also a TF-IDF + LR baseline")
    r.add_argument(
        "--configs",
        nargs="*",
        default=None,
        help="labels to run, e.g. HSA FSA-512 (none: only --tfidf)",
    )
    r.add_argument(
        "--hubs", type=int, nargs="*", default=[], help="also HSA with G hubs: label HSA+hubsG"
    )
    r.add_argument("--append", action="store_true", help="add to the existing results file")
    r.add_argument(
        "--tag",
        default=None,
        help="a validation (model selection) run: write results/documents-select-<dataset>-<tag>"
        ".json, which 'report' lists by validation accuracy only",
    )
    sub.add_parser("report", help="merge results into documents.json and documents.png")
    e = sub.add_parser("epoch", help="time one IMDB HSA training epoch")
    e.add_argument("--threads", type=int, default=2)
    e.add_argument("--batch-size", type=int, default=64)
    e.add_argument("--fraction", type=float, default=1.0, help="time only this share of it")
    args = parser.parse_args()
    {"run": run, "report": report, "epoch": epoch}[args.command](args)


if __name__ == "__main__":
    main()
