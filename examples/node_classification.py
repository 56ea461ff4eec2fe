"""Node classification on Cora (public split) or PPI: GCN, GAT, ConeConv, GPS, HSA hybrid.

The HSA hybrid (:class:`hiergraph.nn.graph_hsa.GraphHSANet`) is GAT (two
``GATConv`` layers, 8 heads × 8, dropout 0.6, the GAT recipe) with one gated
HSA layer between them: a global residual branch over a Louvain community tree
(:class:`hiergraph.transforms.GraphHierarchy`) with Laplacian-eigenvector
family positions. ``gps_full`` is PyG's ``GPSConv`` (GCN local conv + full
multi-head attention). Test accuracy (Cora) or micro-F1 (PPI) is taken at the
epoch of best validation score, over several seeds.

    HIERGRAPH_RAW=/path/to/shared/datasets python examples/node_classification.py \
        --model hsa_hybrid --seeds 0 1 2 --epochs 200 --patience 50 --json out.json

``--dataset ppi --synthetic-ppi DIR`` writes and uses a tiny **synthetic** PPI
(random graphs and labels, labelled as such in the output): a smoke test only.
``--dataset ogbn-arxiv`` (or another ``ogbn-*``) reads OGB's files under the
data root through ``ogb``'s ``PygNodePropPredDataset`` and scores with its
``Evaluator`` (:func:`hiergraph.datasets.ogbn.load_ogbn`); the tree is built
by label propagation (``--tree lp``), which scales to such graphs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GATConv, GCNConv, GPSConv
from torch_geometric.utils import to_undirected

from hiergraph.datasets.ogbn import OGBN_DATASETS, load_ogbn
from hiergraph.datasets.planetoid import is_synthetic, load_planetoid, load_ppi, write_synthetic_ppi
from hiergraph.nn.cone_conv import ConeConv
from hiergraph.nn.graph_hsa import GraphHSANet
from hiergraph.transforms import GraphHierarchy, hierarchy_stats

MODELS = ("gcn", "gat", "cone", "gps_full", "hsa_hybrid")


class TwoLayer(nn.Module):
    """Two message-passing layers with ELU in between (the Kipf/Veličković recipes)."""

    def __init__(self, first: nn.Module, second: nn.Module, dropout: float):
        super().__init__()
        self.first, self.second, self.dropout = first, second, dropout

    def forward(self, x, edge_index, hierarchy=None):
        x = F.dropout(x, self.dropout, self.training)
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
        x = self.lin_in(F.dropout(x, self.dropout, self.training))
        for layer in self.layers:
            x = layer(x, edge_index, batch)
        return self.lin_out(F.dropout(x, self.dropout, self.training))


def build_model(name: str, in_channels: int, out_channels: int, args) -> nn.Module:
    hidden = args.hidden
    if name == "gcn":
        return TwoLayer(GCNConv(in_channels, hidden), GCNConv(hidden, out_channels), 0.5)
    if name in ("gat", "cone"):
        conv = GATConv if name == "gat" else ConeConv
        return TwoLayer(
            conv(in_channels, 8, heads=8, dropout=0.6),
            conv(64, out_channels, heads=1, concat=False, dropout=0.6),
            0.6,
        )
    if name == "gps_full":
        return GPSNet(in_channels, hidden, out_channels, args.layers, args.heads, args.dropout)
    return GraphHSANet(  # GAT with a gated HSA residual branch between its two layers
        in_channels,
        64,
        out_channels,
        conv_factory=None,
        num_layers=1,
        heads=args.heads,
        graph_pe_dim=args.pe_dim,
        dropout=0.6,
        attn_dropout=args.attn_dropout,
        layer_dropout=0.0,
        input_conv=GATConv(in_channels, 8, heads=8, dropout=0.6),
        output_conv=GATConv(64, out_channels, heads=1, concat=False, dropout=0.6),
        act="elu",
        gate=True,
        mlp=False,
    )


def _forward(model, data):
    tree = data.hierarchy() if hasattr(data, "hierarchy") else None
    if isinstance(model, GPSNet):
        return model(data.x, data.edge_index, tree, getattr(data, "batch", None))
    return model(data.x, data.edge_index, tree)


def early_stopping(args, seed: int, train_epoch, validate, score_test) -> dict:
    """Train until ``args.patience`` epochs pass without a better validation score; the
    test score is read at the best-validation epoch. Times cover training only."""
    best_val, test_at_best, bad, times = -1.0, 0.0, 0, []
    for _ in range(args.epochs):
        t0 = time.perf_counter()
        train_epoch()
        times.append(time.perf_counter() - t0)
        val = validate()
        if val > best_val:
            best_val, test_at_best, bad = val, score_test(), 0
        else:
            bad += 1
            if bad >= args.patience:
                break
    return {
        "seed": seed,
        "val": best_val,
        "test": test_at_best,
        "epochs": len(times),
        "sec_per_epoch": statistics.median(times),
    }


def run_full_batch(args, seed: int, data, metric) -> dict:
    """One seed on one graph (Cora, ogbn-*): ``metric(pred, mask) -> float``."""
    torch.manual_seed(seed)
    model = build_model(args.model, data.num_features, int(data.y.max()) + 1, args)
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
        return metric(pred["last"], mask)

    def validate():
        model.eval()
        with torch.no_grad():
            pred["last"] = _forward(model, data).argmax(-1)
        return accuracy(data.val_mask)

    return early_stopping(args, seed, train_epoch, validate, lambda: accuracy(data.test_mask))


def _micro_f1(model, loader) -> float:
    model.eval()
    tp = fp = fn = 0
    with torch.no_grad():
        for batch in loader:
            pred = _forward(model, batch) > 0
            true = batch.y > 0.5
            tp += int((pred & true).sum())
            fp += int((pred & ~true).sum())
            fn += int((~pred & true).sum())
    return 2 * tp / max(2 * tp + fp + fn, 1)


def run_ppi(args, seed: int, splits) -> dict:
    torch.manual_seed(seed)
    train, val, test = (DataLoader(s, batch_size=2, shuffle=i == 0) for i, s in enumerate(splits))
    model = build_model(args.model, splits[0].num_features, splits[0].num_classes, args)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    def train_epoch():
        model.train()
        for batch in train:
            opt.zero_grad()
            F.binary_cross_entropy_with_logits(_forward(model, batch), batch.y).backward()
            opt.step()

    return early_stopping(
        args, seed, train_epoch, lambda: _micro_f1(model, val), lambda: _micro_f1(model, test)
    )


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dataset", choices=("cora", "ppi", *OGBN_DATASETS), default="cora")
    p.add_argument("--model", choices=MODELS, default="hsa_hybrid")
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--patience", type=int, default=50)
    p.add_argument("--hidden", type=int, default=64, help="gcn, gps_full: hidden size")
    p.add_argument("--layers", type=int, default=2, help="gps_full: GPSConv layers")
    p.add_argument("--heads", type=int, default=4, help="gps_full, hsa_hybrid: attention heads")
    p.add_argument("--dropout", type=float, default=0.6, help="gps_full dropout")
    p.add_argument("--attn-dropout", type=float, default=0.0, help="hsa_hybrid: on HSA output")
    p.add_argument("--lr", type=float, default=0.01, help="gcn, gps_full (GAT recipe: 0.005)")
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--max-family", type=int, default=64, help="hsa_hybrid: tree family size")
    p.add_argument("--pe-dim", type=int, default=8, help="hsa_hybrid: Laplacian PE size")
    p.add_argument(
        "--tree", choices=("louvain", "lp"), default=None,
        help="hsa_hybrid: tree builder (default: louvain; lp for ogbn-*)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--root", default=None, help="data root (default $HIERGRAPH_DATA)")
    p.add_argument("--synthetic-ppi", default=None, help="write a SYNTHETIC PPI here and use it")
    p.add_argument("--json", default=None, help="merge the result into this JSON file")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    ogbn = args.dataset.startswith("ogbn-")
    args.tree = args.tree or ("lp" if ogbn else "louvain")
    transform = GraphHierarchy(args.tree, max_family=args.max_family, pe_dim=args.pe_dim)
    needs_tree = args.model == "hsa_hybrid"
    t0 = time.perf_counter()
    if args.dataset == "cora" or ogbn:
        if ogbn:
            data, metric = load_ogbn(args.dataset, root=args.root)
            data.edge_index = to_undirected(data.edge_index, num_nodes=data.num_nodes)
        else:
            data = load_planetoid("Cora", root=args.root)[0]
            metric = _accuracy(data.y)
        data = transform(data) if needs_tree else data
        stats = hierarchy_stats(data) if needs_tree else None
        synthetic = False
    else:
        raw = None
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
    runs = []
    for seed in args.seeds:
        if args.dataset == "ppi":
            runs.append(run_ppi(args, seed, splits))
        else:
            runs.append(run_full_batch(args, seed, data, metric))
        print(json.dumps(runs[-1]), flush=True)
    tests = [r["test"] for r in runs]
    result = {
        "dataset": args.dataset + (" (SYNTHETIC)" if synthetic else ""),
        "model": args.model,
        "metric": "micro-F1" if args.dataset == "ppi" else "accuracy" + (" (OGB)" if ogbn else ""),
        "mean": statistics.mean(tests),
        "std": statistics.pstdev(tests),
        "num_seeds": len(tests),
        "sec_per_epoch_median": statistics.median(r["sec_per_epoch"] for r in runs),
        "hierarchy_sec": prep if needs_tree else None,
        "hierarchy_stats": stats,
        "runs": runs,
        "args": vars(args),
        "threads": args.threads,
    }
    print(json.dumps({k: result[k] for k in ("dataset", "model", "mean", "std", "num_seeds")}))
    if args.json:
        path = Path(args.json)
        table = json.loads(path.read_text()) if path.exists() else {}
        table[f"{args.dataset}/{args.model}"] = result
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(table, indent=1))
    return result


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
    main()
