"""Node classification on Planetoid (Cora, CiteSeer, PubMed) or PPI: GCN, GAT, ConeConv, GPS,
HSA hybrid.

``gat`` and ``cone`` are the model of ``examples/cora_cone_gat.py`` (two
attention layers, 8 heads × 8, ELU, dropout 0.6 on inputs and attention; the
GAT recipe: Adam lr 5e-3, weight decay 5e-4), imported from it, with the score
picked by ``--attention`` (``gat``: PyG's ``GATConv``; ``dot``, ``penumbral``,
``umbral``: ``ConeConv``). The HSA hybrid
(:class:`hiergraph.nn.graph_hsa.GraphHSANet`) is that model with one HSA layer
between its two attention layers: a global residual branch over a Louvain
community tree (:class:`hiergraph.transforms.GraphHierarchy`) with
Laplacian-eigenvector family positions, scaled by a learned gate that starts
at 0 (so training starts from the plain two-layer model). ``gps_full`` is PyG's
``GPSConv`` (GCN local conv + full multi-head attention).

Model selection is that of ``cora_cone_gat.py``: after every epoch the model
is scored on the validation set; the test score is read at the epoch with the
best validation score (ties: lower validation loss); training stops after
``--patience`` epochs without a better one. Planetoid features are row-normalised
and fed as a sparse CSR matrix (the same numbers as dense, cheaper).

Budgets:

* default (quick, about 15 s on 2 cores for the default ``hsa_hybrid`` on Cora): seed 0,
  at most 200 epochs, patience 100;
* ``--paper``: the protocol of the benchmark tables: seeds 0-9, at most 1,000 epochs,
  patience 100. Expect 1-2 minutes for ``hsa_hybrid`` on Cora (about 0.04 s per epoch,
  150-250 epochs per seed), under a minute for ``gat``/``gcn`` (0.014 s per epoch), about
  10 minutes for ``gps_full`` (full attention over all nodes, 0.26 s per epoch).

``--seeds``, ``--epochs`` and ``--patience`` given explicitly override the budget;
``--device`` picks the torch device (default: ``cuda`` when present)::

    HIERGRAPH_RAW=/path/to/datasets python examples/node_classification.py
    python examples/node_classification.py --dataset citeseer --model gat
    python examples/node_classification.py --paper --model hsa_hybrid --hsa-dropout 0.6 \\
        --threads 1 --json out.json

``--dataset ppi --synthetic-ppi DIR`` writes and uses a tiny **synthetic** PPI
(random graphs and labels, labelled as such in the output): a smoke test only.
``--dataset ogbn-arxiv`` (or another ``ogbn-*``) reads OGB's files under the
data root through ``ogb``'s ``PygNodePropPredDataset`` and scores with its
``Evaluator`` (:func:`hiergraph.datasets.ogbn.load_ogbn`); the tree is built
by label propagation (``--tree lp``), which scales to such graphs.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
import torch_geometric.transforms as T
from _cli import (
    LEARNING_RATE,
    PROBABILITY,
    SEED,
    OptionError,
    add_runtime_options,
    at_least,
    example_parser,
    from_options,
    get_device,
    json_to_merge,
    not_below,
    refuse_inapplicable,
    run,
    set_threads,
)
from cora_cone_gat import ATTENTIONS, GAT, make_conv, train_with_early_stopping
from torch import nn
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GCNConv, GPSConv
from torch_geometric.utils import to_undirected

from hiergraph.datasets.ogbn import OGBN_DATASETS, load_ogbn
from hiergraph.datasets.planetoid import is_synthetic, load_planetoid, load_ppi, write_synthetic_ppi
from hiergraph.nn.graph_hsa import GraphHSANet, input_dropout
from hiergraph.runtime import apply_budget
from hiergraph.transforms import GraphHierarchy, hierarchy_stats

MODELS = ("gcn", "gat", "cone", "gps_full", "hsa_hybrid")
#: Options of the HSA branch (``--model hsa_hybrid``), refused with the other models.
HSA_OPTIONS = ("hubs", "max_family", "pe_dim", "tree", "no_gate", "smooth", "attn_dropout",
               "hsa_dropout", "kernel")  # fmt: skip
#: ``--dataset`` name -> PyG's Planetoid name.
PLANETOID = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
QUICK = {"seeds": [0], "epochs": 200, "patience": 100}
PAPER = {"seeds": list(range(10)), "epochs": 1000, "patience": 100}


class TwoLayer(nn.Module):
    """Two message-passing layers with ELU in between (the Kipf/Veličković recipes)."""

    def __init__(self, first: nn.Module, second: nn.Module, dropout: float):
        super().__init__()
        self.first, self.second, self.dropout = first, second, dropout

    def forward(self, x, edge_index, hierarchy=None):
        x = input_dropout(x, self.dropout, self.training)
        x = F.elu(self.first(x, edge_index))
        x = F.dropout(x, self.dropout, self.training)
        return self.second(x, edge_index)


class GPSNet(nn.Module):
    """Input projection, GPSConv layers (GCN local + full multi-head attention), head."""

    def __init__(self, in_channels, hidden, out_channels, layers, heads, dropout):
        super().__init__()
        self.dropout = dropout
        self.lin_in = nn.Linear(in_channels, hidden)
        self.layers = nn.ModuleList(
            GPSConv(hidden, GCNConv(hidden, hidden), heads=heads, dropout=dropout, norm=None)
            for _ in range(layers)
        )
        self.lin_out = nn.Linear(hidden, out_channels)

    def forward(self, x, edge_index, hierarchy=None, batch=None):
        x = self.lin_in(input_dropout(x, self.dropout, self.training))
        for layer in self.layers:
            x = layer(x, edge_index, batch)
        return self.lin_out(F.dropout(x, self.dropout, self.training))


@from_options()
def build_model(name: str, in_channels: int, out_channels: int, args) -> nn.Module:
    if name == "gcn":
        hidden = args.hidden
        return TwoLayer(GCNConv(in_channels, hidden), GCNConv(hidden, out_channels), 0.5)
    if name == "gat":
        return _GraphModel(GAT("gat", in_channels, out_channels))
    cone = None if args.r is None else {"r": args.r}
    if name == "cone":
        return _GraphModel(GAT(args.attention, in_channels, out_channels, cone=cone))
    if name == "gps_full":
        return GPSNet(in_channels, args.hidden, out_channels, args.layers, args.heads, args.dropout)
    # the two attention layers first, so that they get the same initial weights as in `gat`
    first = make_conv(args.attention, in_channels, 8, cone=cone, heads=8, dropout=0.6)
    second = make_conv(
        args.attention, 64, out_channels, cone=cone, heads=1, concat=False, dropout=0.6
    )
    return GraphHSANet(  # the GAT-style model with an HSA residual branch between its layers
        in_channels,
        64,
        out_channels,
        conv_factory=None,
        num_layers=1,
        heads=args.heads,
        graph_pe_dim=args.pe_dim,
        dropout=0.6,
        attn_dropout=args.attn_dropout,
        layer_dropout=args.hsa_dropout,
        input_conv=first,
        output_conv=second,
        act="elu",
        gate=not args.no_gate,
        mlp=False,
        kernel=args.kernel,
        smooth=args.smooth,
        hubs=args.hubs,
    )


class _GraphModel(nn.Module):
    """Adapts a ``model(x, edge_index)`` to the ``(x, edge_index, hierarchy)`` call used here."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x, edge_index, hierarchy=None):
        return self.model(x, edge_index)


def _forward(model, data):
    tree = data.hierarchy() if hasattr(data, "hierarchy") else None
    if isinstance(model, GPSNet):
        return model(data.x, data.edge_index, tree, getattr(data, "batch", None))
    return model(data.x, data.edge_index, tree)


def early_stopping(args, seed: int, train_epoch, validate, score_test) -> dict:
    """One seed under the model selection of ``cora_cone_gat``
    (:func:`cora_cone_gat.train_with_early_stopping`): ``validate() -> (score, loss)``;
    the test score is read at the best-validation epoch, ties ranked by lower loss."""
    run = train_with_early_stopping(args.epochs, args.patience, train_epoch, validate, score_test)
    return {"seed": seed, **run}


def run_full_batch(args, seed: int, data, metric) -> dict:
    """One seed on one graph (Cora, ogbn-*): ``metric(pred, mask) -> float``."""
    torch.manual_seed(seed)
    model = build_model(args.model, data.num_features, int(data.y.max()) + 1, args)
    model.to(args.device)
    gat_recipe = args.model in ("gat", "cone", "hsa_hybrid")
    lr, wd = (0.005, 5e-4) if gat_recipe else (args.lr, args.weight_decay)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=wd)

    def train_epoch():
        model.train()
        opt.zero_grad()
        out = _forward(model, data)
        F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
        opt.step()

    pred = {}

    def accuracy(mask):
        return metric(pred["last"], mask.cpu())

    def validate():
        model.eval()
        with torch.no_grad():
            out = _forward(model, data)
        pred["last"] = out.argmax(-1).cpu()  # metric scores on the host, with the loaded labels
        loss = F.cross_entropy(out[data.val_mask], data.y[data.val_mask])
        return accuracy(data.val_mask), float(loss)

    run = early_stopping(args, seed, train_epoch, validate, lambda: accuracy(data.test_mask))
    layers = getattr(model, "layers", [])
    gates = [
        torch.tanh(g.gate.detach()).item() for g in layers if getattr(g, "gate", None) is not None
    ]
    return dict(run, hsa_gate_at_end=gates) if gates else run


def _micro_f1(model, loader, device) -> tuple[float, float]:
    """Micro-F1 and mean binary cross-entropy over the graphs of ``loader``."""
    model.eval()
    tp = fp = fn = 0
    losses = []
    with torch.no_grad():
        for batch in loader:
            batch = batch.to(device)
            out = _forward(model, batch)
            losses.append(float(F.binary_cross_entropy_with_logits(out, batch.y)))
            pred, true = out > 0, batch.y > 0.5
            tp += int((pred & true).sum())
            fp += int((pred & ~true).sum())
            fn += int((~pred & true).sum())
    return 2 * tp / max(2 * tp + fp + fn, 1), statistics.mean(losses)


def run_ppi(args, seed: int, splits) -> dict:
    torch.manual_seed(seed)
    train, val, test = (DataLoader(s, batch_size=2, shuffle=i == 0) for i, s in enumerate(splits))
    model = build_model(args.model, splits[0].num_features, splits[0].num_classes, args)
    model.to(args.device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    def train_epoch():
        model.train()
        for batch in train:
            batch = batch.to(args.device)
            opt.zero_grad()
            F.binary_cross_entropy_with_logits(_forward(model, batch), batch.y).backward()
            opt.step()

    return early_stopping(
        args,
        seed,
        train_epoch,
        lambda: _micro_f1(model, val, args.device),
        lambda: _micro_f1(model, test, args.device)[0],
    )


def main(argv=None) -> dict:
    p = example_parser(__doc__)
    p.add_argument("--dataset", choices=(*PLANETOID, "ppi", *OGBN_DATASETS), default="cora")
    p.add_argument("--model", choices=MODELS, default="hsa_hybrid")
    p.add_argument(
        "--paper",
        action="store_true",
        help="the benchmark protocol: seeds 0-9, 1,000 epochs, patience 100",
    )
    p.add_argument("--seeds", type=SEED, nargs="+", default=None, help="(quick: 0)")
    p.add_argument("--epochs", type=at_least(1), default=None, help="maximum epochs (quick: 200)")
    p.add_argument("--patience", type=at_least(0), default=None, help="(quick: 100)")
    p.add_argument("--hidden", type=at_least(1), default=64, help="gcn, gps_full: hidden size")
    p.add_argument("--layers", type=at_least(1), default=2, help="gps_full: GPSConv layers")
    p.add_argument(
        "--heads", type=at_least(1), default=4, help="gps_full, hsa_hybrid: attention heads"
    )
    p.add_argument("--dropout", type=PROBABILITY, default=0.6, help="gps_full dropout")
    p.add_argument(
        "--attention",
        choices=ATTENTIONS,
        default=None,
        help="cone: ConeConv score (default penumbral); hsa_hybrid: local layers (default gat)",
    )
    p.add_argument(
        "--r",
        type=float,
        default=None,
        help="cone, hsa_hybrid with a cone --attention: ConeConv radius (default: its own)",
    )
    p.add_argument(
        "--attn-dropout", type=PROBABILITY, default=0.0, help="hsa_hybrid: on HSA output"
    )
    p.add_argument(
        "--hsa-dropout",
        type=PROBABILITY,
        default=0.0,
        help="hsa_hybrid: on the HSA branch (after it)",
    )
    p.add_argument("--no-gate", action="store_true", help="hsa_hybrid: ungated HSA branch")
    p.add_argument(
        "--smooth",
        action="store_true",
        help="hsa_hybrid: HSA smooths the features (no value/output maps)",
    )
    p.add_argument(
        "--hubs", type=at_least(0), default=0, help="hsa_hybrid: nodes lifted to the root per tree"
    )
    p.add_argument("--kernel", choices=("dense", "edge"), default="edge", help="HSA family kernel")
    p.add_argument(
        "--lr", type=LEARNING_RATE, default=0.01, help="gcn, gps_full (GAT recipe: 0.005)"
    )
    p.add_argument("--weight-decay", type=not_below(0), default=5e-4)
    p.add_argument(
        "--max-family", type=at_least(2), default=64, help="hsa_hybrid: tree family size"
    )
    p.add_argument(
        "--pe-dim", type=at_least(0), default=8, help="hsa_hybrid: Laplacian PE size (0: none)"
    )
    p.add_argument(
        "--tree",
        choices=("louvain", "lp", "metis"),
        default=None,
        help="hsa_hybrid: tree builder (default: louvain; lp for ogbn-*; metis: the metis extra)",
    )
    add_runtime_options(p)
    p.add_argument("--root", default=None, help="data root (default $HIERGRAPH_DATA)")
    p.add_argument(
        "--raw-dir", default=None, help="Planetoid, PPI: folder to link the raw files from"
    )
    p.add_argument("--synthetic-ppi", default=None, help="write a SYNTHETIC PPI here and use it")
    p.add_argument(
        "--json", type=json_to_merge, default=None, help="merge the result into this JSON file"
    )
    p.add_argument("--name", default=None, help="JSON row key (default: dataset/model[attention])")
    p.add_argument(
        "--resume-from",
        default=None,
        help="take the seeds already run from this JSON's row of the same key and settings",
    )
    args = p.parse_args(argv)
    model = args.model
    refuse_inapplicable(p, argv, [
        (HSA_OPTIONS, model == "hsa_hybrid", "to --model hsa_hybrid"),
        (("layers", "dropout"), model == "gps_full", "to --model gps_full"),
        (("hidden",), model in ("gcn", "gps_full"), "to --model gcn and gps_full"),
        (("heads",), model in ("gps_full", "hsa_hybrid"), "to --model gps_full and hsa_hybrid"),
        (("r",), model in ("cone", "hsa_hybrid"), "to --model cone and hsa_hybrid"),
        (("synthetic_ppi",), args.dataset == "ppi", "with --dataset ppi"),
        (("raw_dir",), args.dataset in (*PLANETOID, "ppi"), "to the Planetoid datasets and ppi"),
        (("root", "raw_dir"), not args.synthetic_ppi, "without --synthetic-ppi"),
    ])  # fmt: skip
    if model == "gps_full" and args.hidden % args.heads:  # (nn.MultiheadAttention's rule)
        p.error(f"--heads {args.heads} must divide --hidden {args.hidden} for --model gps_full")
    apply_budget(args, QUICK, PAPER)  # explicit options win
    set_threads(args)
    device = get_device(args)
    if args.model == "gat" and args.attention not in (None, "gat"):
        p.error("--model gat uses GATConv; pick a ConeConv score with --model cone")
    args.attention = args.attention or {"cone": "penumbral"}.get(args.model, "gat")
    if args.model == "gps_full":
        # GPSConv passes a padding mask, so nn.MultiheadAttention's inference fast path runs
        # a masked softmax over the [heads, N, N] scores: 4-9 s per Cora evaluation here,
        # against ~1 s for the SDPA path that training takes (outputs agree to 1e-7).
        torch.backends.mha.set_fastpath_enabled(False)

    ogbn = args.dataset.startswith("ogbn-")
    args.tree = args.tree or ("lp" if ogbn else "louvain")
    runs = _resumed_runs(args)  # (refused before the data is read)
    transform = GraphHierarchy(args.tree, max_family=args.max_family, pe_dim=args.pe_dim)
    needs_tree = args.model == "hsa_hybrid"
    t0 = time.perf_counter()
    if args.dataset in PLANETOID or ogbn:
        if ogbn:
            data, metric = load_ogbn(args.dataset, root=args.root)
            data.edge_index = to_undirected(data.edge_index, num_nodes=data.num_nodes)
        else:
            name, transform_x = PLANETOID[args.dataset], T.NormalizeFeatures()
            data = load_planetoid(name, args.root, args.raw_dir, transform=transform_x)[0]
            metric = _accuracy(data.y)
        data = transform(data) if needs_tree else data
        if not ogbn:
            warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")
            data.x = data.x.to_sparse_csr()
        stats = hierarchy_stats(data) if needs_tree else None
        data.to(device)  # the tree is built on the host, then moved with the graph
        synthetic = False
    else:
        raw = args.raw_dir
        if args.synthetic_ppi:
            raw = write_synthetic_ppi(Path(args.synthetic_ppi) / "PPI" / "raw")
        root = args.synthetic_ppi or args.root
        splits = load_ppi(root=root, raw_dir=raw, transform=transform if needs_tree else None)
        splits = [list(s) for s in splits] if needs_tree else splits  # build the trees once
        stats = hierarchy_stats(splits[0][0]) if needs_tree else None
        synthetic = bool(args.synthetic_ppi) or is_synthetic(load_ppi(root=root)[0])
    prep = time.perf_counter() - t0
    if args.dataset == "ppi" and needs_tree:
        splits = [_ListDataset(s) for s in splits]

    def summary() -> dict:
        tests = [r["test"] for r in runs]
        return {
            "dataset": args.dataset + (" (SYNTHETIC)" if synthetic else ""),
            "model": args.model,
            "metric": "micro-F1"
            if args.dataset == "ppi"
            else "accuracy" + (" (OGB)" if ogbn else ""),
            "mean": statistics.mean(tests),
            "std": statistics.stdev(tests) if len(tests) > 1 else 0.0,
            "num_seeds": len(tests),
            "mean_val": statistics.mean(r["val"] for r in runs),
            "sec_per_epoch_median": statistics.median(r["sec_per_epoch"] for r in runs),
            "hierarchy_sec": prep if needs_tree else None,
            "loadavg": os.getloadavg(),
            "hierarchy_stats": stats,
            "runs": runs,
            "args": vars(args),
            "threads": args.threads,
            "device": args.device,
        }

    for seed in args.seeds:
        if any(r["seed"] == seed for r in runs):
            continue
        if args.dataset == "ppi":
            runs.append(run_ppi(args, seed, splits))
        else:
            runs.append(run_full_batch(args, seed, data, metric))
        print(json.dumps(runs[-1]), flush=True)
        if args.json:  # after every seed, so that a cut run leaves its finished seeds
            _save(Path(args.json), args.name or _row_name(args), summary())
    result = summary()
    print(json.dumps({k: result[k] for k in ("dataset", "model", "mean", "std", "num_seeds")}))
    return result


#: Arguments that do not change a seed's result (``--resume-from`` ignores them).
_NOT_SETTINGS = {
    "seeds",
    "json",
    "name",
    "resume_from",
    "root",
    "raw_dir",
    "synthetic_ppi",
    "paper",
}


def _resumed_runs(args) -> list[dict]:
    """Runs of ``args.seeds`` found in ``--resume-from`` (same row key, same settings)."""
    if not args.resume_from:
        return []
    key = args.name or _row_name(args)
    try:
        table = json.loads(Path(args.resume_from).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise OptionError(f"--resume-from {args.resume_from}: unreadable ({error})") from None
    row = table.get(key) if isinstance(table, dict) else None
    if not isinstance(row, dict) or not {"args", "runs"} <= row.keys():
        raise OptionError(f"--resume-from {args.resume_from} has no row {key!r} of results")
    mine = {k: v for k, v in vars(args).items() if k not in _NOT_SETTINGS}
    theirs = {k: row["args"][k] for k in mine if k in row["args"]}
    differ = sorted(k for k in theirs if theirs[k] != mine[k])
    if differ:
        raise OptionError(f"--resume-from: row {key!r} was run with other settings: {differ}")
    runs = [dict(r, resumed_from=args.resume_from) for r in row["runs"] if r["seed"] in args.seeds]
    print(f"resumed seeds {[r['seed'] for r in runs]} from {args.resume_from}", flush=True)
    return runs


def _save(path: Path, key: str, result: dict) -> None:
    table = json.loads(path.read_text()) if path.exists() else {}
    table[key] = result
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1))


def _row_name(args) -> str:
    score = f"[{args.attention}]" if args.model in ("cone", "hsa_hybrid") else ""
    return f"{args.dataset}/{args.model}{score}"


def _accuracy(y):
    return lambda pred, mask: float((pred[mask] == y[mask]).float().mean())


class _ListDataset(list):
    """A list of graphs with the two attributes the PPI loop reads."""

    @property
    def num_features(self) -> int:
        return self[0].num_features

    @property
    def num_classes(self) -> int:
        return self[0].y.size(-1)


if __name__ == "__main__":
    run(main)
