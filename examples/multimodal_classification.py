"""Image + text classification on multimodal signal hierarchies: HSA vs FSA vs DeepSet vs unimodal.

Every record (a clip-art file, an emoji) is a key–value tree (Amizadeh et al.,
Sec. 4.2, App. C): the image is a 2-D grid of 8×8 patch leaves of a 32×32
thumbnail, each text field a 1-D grid of token leaves (frozen
all-MiniLM-L6-v2 static token vectors). Patch pixels are standardised per
channel with training statistics and, with ``--image-stem conv`` (the README
setting), passed through a small per-patch CNN (:class:`PatchStem`); raw
``[0, 1]`` pixels (``--image-stem none``, mostly white background) leave the
image-only model at the majority class. Patches and tokens get their own
input projections (node types). Every model is the paper's
[one HTE layer] → [mean over leaves] → [one-hidden-layer MLP] with the same
sizes, trained the same way; only the attention and the leaves differ:

* ``hsa``: hierarchical self-attention over the multimodal tree;
* ``fsa``: the same layer on the flattened tree (softmax attention among all
  patches and tokens of a record);
* ``deepset``: the same layer with attention off (per-leaf MLP + mean);
* ``text``, ``image``: HSA over the text fields only / the image only.

Logistic-regression baselines on the same split (``--baselines``, needs
scikit-learn): TF-IDF of title + description words, and 32×32 pixels +
an 8-bin-per-channel colour histogram; C chosen on the validation split.

Large title groups (collections such as "gramastar", 1,375 records) would
dominate training: at most ``--max-per-group`` (32) records of each title
group are used for training (a seeded choice, the same for every model and
for the logistic-regression baselines). The epoch reported for each run is the one with the best
validation accuracy (the test split is evaluated once, with that model).

Budgets:

* default (quick): seed 0, 2 epochs per model, standardised-pixel patches, mean over
  leaves; about 1.5 minutes for the five models on 2 cores once the dataset is cached
  (estimated from the recorded 8-epoch training times; the first run of a dataset
  also builds its cache). A smoke test: two epochs leave the models near chance (HSA
  0.247 on Open Clip Art in one run, majority class about 0.26);
* ``--paper``: the benchmark setting chosen on validation: seeds 0-4, 8 epochs,
  ``--image-stem conv --group-size 2 --readout tree`` and the logistic-regression
  baselines; about 30 minutes on one thread (5-6 minutes per seed for the five models).

Options given explicitly override the budget (``--group-size 0``: no patch groups);
``--device`` picks where the models and the batches live (default: cuda if any).
Examples::

    HIERGRAPH_OPENCLIPART=<cache>/openclipart/usr/share/openclipart \\
    python examples/multimodal_classification.py
    python examples/multimodal_classification.py --dataset emoji --models hsa fsa
    python examples/multimodal_classification.py --paper --json out.json --plot out.png
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import sys
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
from torch_geometric.loader import DataLoader
from tqdm import tqdm

from hiergraph.datasets.emoji import GoogleEmoji
from hiergraph.datasets.multimodal_records import IMAGE
from hiergraph.datasets.openclipart import OpenClipArt
from hiergraph.nn import HierarchicalTransformerEncoder, global_leaf_mean_pool
from hiergraph.nn.pool import coarsen_leaves
from hiergraph.runtime import apply_budget, progress

DATASETS = {"openclipart": OpenClipArt, "emoji": GoogleEmoji}
QUICK = {"seeds": [0], "epochs": 2, "image_stem": "pixels", "group_size": 0, "readout": "leaves",
         "baselines": False}  # fmt: skip
PAPER = {"seeds": [0, 1, 2, 3, 4], "epochs": 8, "image_stem": "conv", "group_size": 2,
         "readout": "tree", "baselines": True}  # fmt: skip
#: model -> (attention of the HTE layer, fields in the tree: None = all)
MODELS = {
    "hsa": ("hsa", None),
    "fsa": ("flat", None),
    "deepset": ("none", None),
    "text": ("hsa", "text"),
    "image": ("hsa", ("image",)),
}


class PatchStem(nn.Module):
    r"""Image patch leaves: per-channel standardised pixels, optionally through a small conv stem.

    A patch leaf holds ``C·p²`` pixels in ``[0, 1]`` (clip art: mostly white
    background, mean ≈ 0.85). They are standardised with the training
    split's per-channel statistics,

    .. math:: \tilde x_{c,u,v} = (x_{c,u,v} - \mu_c) / \sigma_c,

    and with ``stem='conv'`` mapped by a small per-patch CNN,
    :math:`\mathrm{GELU}(\mathrm{Conv}_{3\times3,\,s=2}(\mathrm{GELU}(
    \mathrm{Conv}_{3\times3}(\tilde x))))`, whose ``C·p²`` outputs
    (``4C`` channels on the ``p/2 × p/2`` grid) replace the pixels. The
    model's per-type input map then projects them (the encoder's
    :class:`~hiergraph.nn.TypedLinear`). Other leaves pass through.

    Args:
        channels, patch_size: image channels ``C`` and patch side ``p`` (even for ``'conv'``).
        image_type: node type of the patch leaves.
        mean, std: ``[C]`` per-channel pixel statistics of the training images.
        stem: ``'pixels'`` (standardised raw pixels) or ``'conv'``.
    """

    def __init__(self, channels, patch_size, image_type, mean, std, stem="pixels"):
        super().__init__()
        if stem not in ("pixels", "conv"):
            raise ValueError(f"stem must be 'pixels' or 'conv', got {stem!r}")
        if stem == "conv" and patch_size % 2:
            raise ValueError(f"the conv stem needs an even patch_size, got {patch_size}")
        self.channels, self.patch_size, self.image_type = channels, patch_size, image_type
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float).view(1, -1, 1, 1))
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float).view(1, -1, 1, 1))
        width = 4 * channels
        self.conv = (
            nn.Sequential(
                nn.Conv2d(channels, width, 3, padding=1),
                nn.GELU(),
                nn.Conv2d(width, width, 3, stride=2, padding=1),
                nn.GELU(),
            )
            if stem == "conv"
            else None
        )

    def forward(self, x: torch.Tensor, leaf_type: torch.Tensor) -> torch.Tensor:
        """``x: [L, F]`` leaf features, ``leaf_type: [L]`` → ``[L, F]``."""
        rows = (leaf_type == self.image_type).nonzero().view(-1)
        if rows.numel() == 0:
            return x
        p, c = self.patch_size, self.channels
        patches = x.index_select(0, rows)[:, : c * p * p].view(-1, c, p, p)
        patches = (patches - self.mean) / self.std
        if self.conv is not None:
            patches = self.conv(patches)
        return x.index_copy(0, rows, F.pad(patches.flatten(1), (0, x.size(1) - c * p * p)))


class MultimodalClassifier(nn.Module):
    r"""[Patch stem] → typed input projections → HTE layer → readout → MLP.

    .. math:: \hat y = \mathrm{MLP}\Big(\tfrac{1}{|\ell(T)|}\sum_{i\in\ell(T)}
        \mathrm{HTE}(W_{t_i} \mathrm{stem}(x_i))_i\Big)

    Args:
        in_channels: leaf width (``schema.in_channels``).
        num_node_types: leaf types (``schema.num_node_types``).
        num_classes: output classes.
        attention: ``'hsa'``, ``'flat'`` or ``'none'``.
        hidden, heads, pos_channels, mlp, layers, dropout: sizes.
        readout: ``'leaves'`` (mean over all leaves, the paper's) or ``'tree'``
            (:func:`tree_mean_pool`, on the record's tree for every model).
        stem: optional :class:`PatchStem` applied to the image leaves first.
        hubs: HSA only: leaves per record lifted to the root in every layer
            (:class:`~hiergraph.nn.HierarchicalSelfAttention` ``hubs``).
    """

    def __init__(
        self,
        in_channels: int,
        num_node_types: int,
        num_classes: int,
        attention: str = "hsa",
        hidden: int = 64,
        heads: int = 4,
        pos_channels: int = 32,
        mlp: int = 128,
        layers: int = 1,
        dropout: float = 0.1,
        readout: str = "leaves",
        stem: PatchStem | None = None,
        hubs: int = 0,
    ):
        super().__init__()
        if hubs and attention != "hsa":
            raise ValueError(f"hubs are an option of HSA, not of attention={attention!r}")
        self.readout, self.stem = readout, stem
        self.encoder = HierarchicalTransformerEncoder(
            in_channels,
            hidden,
            num_layers=layers,
            heads=heads,
            num_node_types=num_node_types,
            pos_channels=pos_channels,
            mlp_channels=mlp,
            dropout=dropout,
            attention=attention,
            hubs=hubs,
        )
        self.head = nn.Sequential(
            nn.Linear(hidden, mlp), nn.GELU(), nn.Dropout(dropout), nn.Linear(mlp, num_classes)
        )

    def forward(self, batch) -> torch.Tensor:
        """A batch of record hierarchies → ``[B, num_classes]`` logits."""
        x = batch.x
        if self.stem is not None:
            x = self.stem(x, batch.node_type.index_select(0, batch.tree_index().leaf_node))
        h = self.encoder(x, batch)
        if self.readout == "tree":
            return self.head(tree_mean_pool(h, batch))
        return self.head(global_leaf_mean_pool(h, batch))


def tree_mean_pool(x: torch.Tensor, hierarchy) -> torch.Tensor:
    r"""Recursive mean over the tree: a node is the mean of its children, ``[B, C]`` at the roots.

    Every field of a record weighs the same, however many leaves it has
    (the image's 16 patches and a 3-token title count equally).
    """
    while hierarchy.num_nodes > hierarchy.num_trees:
        x, hierarchy, _ = coarsen_leaves(x, hierarchy)
    return x


def predict(model, loader, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted and true classes of ``loader``, the batches run on ``device``; on the CPU."""
    model.eval()
    preds, golds = [], []
    with torch.no_grad():
        for batch in loader:
            batch = batch.to(device)
            preds.append(model(batch).argmax(-1).cpu())
            golds.append(batch.y.cpu())
    return torch.cat(preds), torch.cat(golds)


def scores(pred, gold, num_classes: int) -> dict:
    """Accuracy and macro-F1 (over the classes present in ``gold``)."""
    pred, gold = torch.as_tensor(pred), torch.as_tensor(gold)
    f1 = []
    for c in range(num_classes):
        if int((gold == c).sum()):
            tp = int(((pred == c) & (gold == c)).sum())
            f1.append(2 * tp / (int((pred == c).sum()) + int((gold == c).sum())))
    return {"acc": float((pred == gold).float().mean()), "f1": float(np.mean(f1))}


def confusion(pred, gold, num_classes: int) -> list[list[int]]:
    m = torch.zeros(num_classes, num_classes, dtype=torch.long)
    m.index_put_((torch.as_tensor(gold), torch.as_tensor(pred)), torch.tensor(1), accumulate=True)
    return m.tolist()


def train(
    args, model_name: str, seed: int, data: dict, schema, num_classes: int, device: torch.device
) -> dict:
    """One training run on ``device``; returns its history, best-validation epoch and test
    scores."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    attention, _ = MODELS[model_name]
    with from_options():
        model = MultimodalClassifier(
            schema.in_channels,
            schema.num_node_types,
            num_classes,
            attention,
            readout=args.readout,
            stem=make_stem(args, schema, data["pixel_stats"]),
            hubs=args.hubs if attention == "hsa" else 0,
            **options_named(args, ENCODER_OPTIONS),
        ).to(device)
    loader = DataLoader(data["train"], batch_size=args.batch_size, shuffle=True)
    val_loader = DataLoader(data["val"], batch_size=256)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LinearLR(
        optimizer, 1.0, 0.05, total_iters=args.epochs * len(loader)
    )
    history, best, best_state, train_seconds = [], None, None, 0.0
    bar = progress(total=args.epochs * len(loader), desc=f"{model_name} seed {seed}", leave=False)
    for epoch in range(args.epochs):
        model.train()
        start, losses = time.perf_counter(), []
        for batch in loader:
            bar.update()
            batch = batch.to(device)
            loss = F.cross_entropy(model(batch), batch.y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
        train_seconds += time.perf_counter() - start
        val = scores(*predict(model, val_loader, device), num_classes)
        history.append({"epoch": epoch, "loss": float(np.mean(losses)), **val})
        if best is None or val["acc"] > best["acc"]:
            best, best_state = {"epoch": epoch, **val}, copy.deepcopy(model.state_dict())
        tqdm.write(json.dumps({"model": model_name, "seed": seed, **history[-1]}))
    bar.close()
    model.load_state_dict(best_state)
    pred, gold = predict(model, DataLoader(data["test"], batch_size=256), device)
    return {
        "seed": seed,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": train_seconds,
        "best_epoch": best["epoch"],
        "val": {"acc": best["acc"], "f1": best["f1"]},
        "test": scores(pred, gold, num_classes),
        "confusion": confusion(pred, gold, num_classes),
        "history": history,
    }


def load(args, fields) -> dict:
    """``{split: list of hierarchies}`` with the given fields (built once, kept in memory)."""
    cls = DATASETS[args.dataset]
    out = {}
    for split in ("train", "val", "test"):
        ds = cls(
            args.root,
            split=split,
            raw_dir=args.raw_dir,
            image_size=args.image_size,
            patch_size=args.patch_size,
            group_size=args.group_size,
            fields=fields,
        )
        keep = range(len(ds))
        if split == "train" and args.max_per_group:
            keep = capped(ds, args.max_per_group)
        out[split] = [ds[i] for i in keep]
        if split == "train":
            out["_dataset"], out["pixel_stats"] = ds, pixel_stats(ds, keep)
    return out


def pixel_stats(ds, keep) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std ``([C], [C])`` of the images of records ``keep`` of ``ds``."""
    records = ds.records()
    images = torch.cat([records[i].image for i in keep]).float() / 255.0
    return images.mean((0, 2, 3)), images.std((0, 2, 3))


def make_stem(args, schema, stats) -> PatchStem | None:
    """The :class:`PatchStem` of ``--image-stem`` (``None`` for ``'none'``: raw pixels)."""
    if args.image_stem == "none":
        return None
    key = schema.keys[IMAGE]
    field = schema.fields[key]
    return PatchStem(
        field.channels, field.patch_size, schema.node_types[key], *stats, stem=args.image_stem
    )


def capped(ds, cap: int, seed: int = 0) -> list[int]:
    """Indices of ``ds`` keeping at most ``cap`` records of each title group (seeded choice)."""
    members: dict[str, list[int]] = {}
    for i, r in enumerate(ds.records()):
        members.setdefault(r.group, []).append(i)
    gen = torch.Generator().manual_seed(seed)
    keep = []
    for idx in members.values():
        chosen = torch.randperm(len(idx), generator=gen)[:cap].tolist()
        keep.extend(idx[j] for j in chosen)
    return sorted(keep)


def logistic_baselines(args) -> dict:
    """Text-only (TF-IDF words) and image-only (pixels + colour histogram) logistic regression."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    cls = DATASETS[args.dataset]
    splits = {
        s: cls(args.root, split=s, raw_dir=args.raw_dir, image_size=args.image_size)
        for s in ("train", "val", "test")
    }
    records = {s: d.records() for s, d in splits.items()}
    ds = splits["train"]
    if args.max_per_group:
        records["train"] = [records["train"][i] for i in capped(ds, args.max_per_group)]
    y = {s: np.array([int(r.y) for r in recs]) for s, recs in records.items()}

    def texts(recs):
        return [" ".join(r[f"{f}_text"] for f in ds.text_fields) for r in recs]

    def pixels(recs):
        img = torch.cat([r.image for r in recs]).float() / 255.0  # [n, 3, S, S]
        hist = torch.stack(
            [torch.stack([torch.histc(ch, bins=8, min=0, max=1) for ch in im]) for im in img]
        )
        return torch.cat([img.flatten(1), hist.flatten(1) / img[0, 0].numel()], 1).numpy()

    out = {}
    vec = TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=True)
    text = {
        s: (vec.fit_transform if s == "train" else vec.transform)(texts(records[s]))
        for s in ("train", "val", "test")
    }
    scaler = StandardScaler()
    image = {
        s: (scaler.fit_transform if s == "train" else scaler.transform)(pixels(records[s]))
        for s in ("train", "val", "test")
    }
    for name, feats in (("lr_text", text), ("lr_image", image)):
        best = None
        for c in (0.01, 0.1, 1.0, 10.0) if name == "lr_text" else (0.001, 0.01, 0.1):  # val
            clf = LogisticRegression(C=c, max_iter=300).fit(feats["train"], y["train"])
            val = scores(clf.predict(feats["val"]), y["val"], ds.num_classes)
            if best is None or val["acc"] > best[1]["acc"]:
                best = (clf, val, c)
        clf, val, c = best
        out[name] = {
            "C": c,
            "val": val,
            "test": scores(clf.predict(feats["test"]), y["test"], ds.num_classes),
        }
        print(json.dumps({name: out[name]}), flush=True)
    majority = np.full_like(y["test"], np.bincount(y["train"]).argmax())
    out["majority"] = {"test": scores(majority, y["test"], ds.num_classes)}
    return out


def summarize(runs: list[dict]) -> dict:
    return {
        f"{split}_{m}": {
            "mean": float(np.mean([r[split][m] for r in runs])),
            "std": float(np.std([r[split][m] for r in runs])),
        }
        for split in ("val", "test")
        for m in ("acc", "f1")
    } | {
        "train_seconds_median": float(np.median([r["train_seconds"] for r in runs])),
        "parameters": runs[0]["parameters"],
    }


def paired(models: dict, reference: str = "hsa") -> dict:
    """Per-seed differences ``reference − model`` of test accuracy and macro-F1 (same seeds).

    ``{model: {metric: {"mean", "std", "wins"}}}``, ``wins`` = seeds where the reference is better.
    """
    if reference not in models:
        return {}
    ref = {r["seed"]: r["test"] for r in models[reference]["runs"]}
    out = {}
    for name, model in models.items():
        runs = [r for r in model["runs"] if r["seed"] in ref and name != reference]
        if runs:
            out[name] = {
                m: {
                    "mean": float(np.mean([ref[r["seed"]][m] - r["test"][m] for r in runs])),
                    "std": float(np.std([ref[r["seed"]][m] - r["test"][m] for r in runs])),
                    "wins": sum(ref[r["seed"]][m] > r["test"][m] for r in runs),
                    "seeds": len(runs),
                }
                for m in ("acc", "f1")
            }
    return out


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(result["models"])
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [1, 1.2]})
    width = 0.38
    for k, metric in enumerate(("acc", "f1")):
        means = [result["models"][m]["summary"][f"test_{metric}"]["mean"] for m in models]
        stds = [result["models"][m]["summary"][f"test_{metric}"]["std"] for m in models]
        xs = np.arange(len(models)) + (k - 0.5) * width
        ax.bar(xs, means, width, yerr=stds, capsize=3, label=f"test {metric}")
        for lr_name, style in (("lr_text", "--"), ("lr_image", ":")):
            if metric == "acc" and lr_name in result.get("baselines", {}):
                ax.axhline(
                    result["baselines"][lr_name]["test"]["acc"],
                    ls=style,
                    color="grey",
                    label=f"{lr_name} acc",
                )
    ax.set_xticks(np.arange(len(models)), models)
    ax.set_ylim(0, 1)
    ax.set_title(f"{result['dataset']}: mean ± std over seeds {result['config']['seeds']}")
    ax.legend(fontsize=8)
    best = "hsa" if "hsa" in result["models"] else models[0]
    cm = np.array(result["models"][best]["runs"][0]["confusion"], dtype=float)
    cm = cm / np.maximum(cm.sum(1, keepdims=True), 1)
    ax2.imshow(cm, cmap="Blues", vmin=0, vmax=1)
    classes = result["classes"]
    ax2.set_xticks(range(len(classes)), classes, rotation=90, fontsize=7)
    ax2.set_yticks(range(len(classes)), classes, fontsize=7)
    ax2.set_xlabel("predicted")
    ax2.set_ylabel("true")
    ax2.set_title(f"{best} confusion (test, seed {result['config']['seeds'][0]}, row-normalised)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def save(result: dict, path: str | None) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=1))


def parse_args(argv=None) -> argparse.Namespace:
    p = example_parser(__doc__)
    p.add_argument("--dataset", choices=sorted(DATASETS), default="openclipart")
    p.add_argument("--root", default=None, help="cache folder (default $HIERGRAPH_DATA/<Name>)")
    p.add_argument(
        "--raw-dir",
        default=None,
        help="the dataset's raw folder (default: $HIERGRAPH_OPENCLIPART or $HIERGRAPH_EMOJI, "
        "else where the loader looks)",
    )
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    p.add_argument(
        "--paper",
        action="store_true",
        help="seeds 0-4, 8 epochs, the validation-chosen setting, baselines",
    )
    p.add_argument("--seeds", type=SEED, nargs="+", default=None, help="(quick: 0)")
    p.add_argument("--epochs", type=at_least(1), default=None, help="(quick: 2)")
    p.add_argument("--batch-size", type=at_least(1), default=64)
    p.add_argument("--lr", type=LEARNING_RATE, default=1e-3)
    p.add_argument("--weight-decay", type=not_below(0), default=0.01)
    p.add_argument("--hidden", type=at_least(1), default=64)
    p.add_argument("--heads", type=at_least(1), default=4)
    p.add_argument("--pos-channels", type=at_least(0), default=32, help="0: no positions")
    p.add_argument("--mlp", type=at_least(1), default=128)
    p.add_argument("--layers", type=at_least(1), default=1)
    p.add_argument("--dropout", type=PROBABILITY, default=0.1)
    p.add_argument(
        "--max-per-group",
        type=at_least(0),
        default=32,
        help="training records kept per title group (0: all)",
    )
    p.add_argument(
        "--readout", choices=("leaves", "tree"), default=None, help="(quick: leaves; paper: tree)"
    )
    p.add_argument(
        "--hubs", type=at_least(0), default=0, help="HSA models: leaves lifted to the root"
    )
    p.add_argument("--image-size", type=at_least(1), default=32, help="a multiple of --patch-size")
    p.add_argument("--patch-size", type=at_least(1), default=8, help="even for --image-stem conv")
    p.add_argument(
        "--group-size",
        type=at_least(0),
        default=None,
        help="2-level patch grid, 0: none (paper: 2)",
    )
    p.add_argument(
        "--image-stem",
        choices=("none", "pixels", "conv"),
        default=None,
        help="patch leaves: raw [0, 1] pixels, standardised pixels (quick), or a conv stem "
        "(PatchStem; paper)",
    )
    p.add_argument(
        "--baselines", action="store_true", default=None, help="logistic-regression baselines"
    )
    add_runtime_options(p, threads_help="torch CPU threads (default 1: fastest for this model)")
    p.add_argument("--json", type=output_file, default=None, help="write the results here")
    p.add_argument(
        "--plot", type=output_file, default=None, help="bar chart + confusion matrix PNG"
    )
    args = p.parse_args(argv)
    apply_budget(args, QUICK, PAPER)  # explicit options win
    if args.image_size % args.patch_size:  # (the datasets' own rule, checked before loading)
        p.error(f"--image-size {args.image_size} is no multiple of --patch-size {args.patch_size}")
    if args.image_stem == "conv" and args.patch_size % 2:  # (PatchStem's rule)
        p.error(f"--image-stem conv needs an even --patch-size, got {args.patch_size}")
    args.group_size = args.group_size or None  # 0: no patch groups
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    set_threads(args, default=1)  # one thread is fastest for this model
    device = get_device(args)
    given = sys.argv[1:] if argv is None else list(argv)
    result = {
        "dataset": args.dataset,
        "config": vars(args),
        "command": " ".join(["python examples/multimodal_classification.py", *given]),
        "models": {},
        "loadavg_start": os.getloadavg(),
    }
    cache = {}
    for name in args.models:
        wanted = MODELS[name][1]
        data = cache.get(wanted)
        if data is None:
            fields = wanted
            if wanted == "text":
                ds = DATASETS[args.dataset](
                    args.root, raw_dir=args.raw_dir, image_size=args.image_size
                )
                fields = ds.text_fields
            data = cache[wanted] = load(args, fields)
        ds = data["_dataset"]
        result["classes"] = list(ds.classes)
        result["sizes"] = {s: len(data[s]) for s in ("train", "val", "test")}
        runs = [
            train(args, name, seed, data, ds.schema, ds.num_classes, device) for seed in args.seeds
        ]
        result["models"][name] = {"summary": summarize(runs), "runs": runs}
        result["paired_vs_hsa"] = paired(result["models"])
        print(json.dumps({name: result["models"][name]["summary"]}), flush=True)
        save(result, args.json)  # after every model: a crash keeps what is done
    if args.baselines:
        result["baselines"] = logistic_baselines(args)
    result["loadavg_end"] = os.getloadavg()
    result["torch_threads"] = torch.get_num_threads()
    save(result, args.json)
    if args.plot:
        plot(result, args.plot)
    return result


if __name__ == "__main__":
    run(main)
