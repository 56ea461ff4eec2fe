"""PPI multi-label node classification with GAT, swapping only the attention score.

The inductive GAT recipe the cone-attention paper trained with (Tseng et al. 2023,
Table 1): 20/2/2 graphs, 3 layers with heads [4, 4, 6] x 256 hidden (the last
layer averages its 6 heads into 121 logits), a linear skip connection around
every layer, ELU, no dropout, Adam lr 5e-3, BCE-with-logits loss, 2 graphs per
batch, early stopping on validation micro-F1. Reports test micro-F1 at the best
validation epoch.

Budgets (neither has been timed on the real PPI files; the times below are estimates, and on
the synthetic stand-in below a run takes seconds):

* default (quick): seed 0, 5 epochs: a smoke run of the full-size model (a few
  minutes on 2 CPU cores, far from converged);
* ``--paper``: 10 seeds of at most 200 epochs with patience 100 (pytorch-GAT's PPI
  budget): many hours on CPU, a GPU run (``--device``, default ``cuda`` when present).

``--seeds``, ``--epochs`` and ``--patience`` given explicitly override the budget.

Data: ``--root`` (default ``$HIERGRAPH_DATA``, else ``~/.cache/hiergraph``) with
``PPI/raw`` holding PyG's raw PPI files (``--raw-dir`` or ``$HIERGRAPH_RAW`` to link
them from, else downloaded). The tests run this script on a small SYNTHETIC stand-in
written by ``hiergraph.datasets.planetoid.write_synthetic_ppi`` (random graphs and
labels), and every line the script prints then says so. Examples::

    python examples/ppi_cone_gat.py --attention penumbral --root /path/to/data
    python examples/ppi_cone_gat.py --synthetic <folder> --epochs 5 --hidden 16
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from _cli import (
    LEARNING_RATE,
    add_runtime_options,
    at_least,
    example_parser,
    get_device,
    refuse_inapplicable,
    run,
    set_threads,
)
from cora_cone_gat import ATTENTIONS, make_conv  # the shared GAT/ConeConv factory
from torch_geometric.loader import DataLoader

from hiergraph.datasets.planetoid import is_synthetic, load_ppi, write_synthetic_ppi
from hiergraph.runtime import apply_budget, progress

QUICK = {"seeds": 1, "epochs": 5, "patience": 100}
PAPER = {"seeds": 10, "epochs": 200, "patience": 100}


class DeepGAT(torch.nn.Module):
    """Attention layers with linear skips: ``x <- ELU(conv(x) + lin(x))``, last without ELU."""

    def __init__(self, attention, in_channels, num_labels, hidden=256, heads=(4, 4, 6)):
        super().__init__()
        last = len(heads) - 1
        ins = [in_channels] + [hidden * h for h in heads[:-1]]
        self.convs, self.skips = torch.nn.ModuleList(), torch.nn.ModuleList()
        for i, (c_in, h) in enumerate(zip(ins, heads, strict=True)):
            c_out, concat = (num_labels, False) if i == last else (hidden, True)
            self.convs.append(make_conv(attention, c_in, c_out, heads=h, concat=concat))
            self.skips.append(torch.nn.Linear(c_in, c_out * h if concat else c_out))

    def forward(self, x, edge_index):
        for i, (conv, skip) in enumerate(zip(self.convs, self.skips, strict=True)):
            x = conv(x, edge_index) + skip(x)
            if i < len(self.convs) - 1:
                x = F.elu(x)
        return x


@torch.no_grad()
def micro_f1(model, loader, device) -> float:
    r"""Micro-averaged F1 over all nodes and labels, prediction = logit > 0."""
    model.eval()
    tp = fp = fn = 0
    for data in loader:
        data = data.to(device)
        pred = model(data.x, data.edge_index) > 0
        true = data.y > 0.5
        tp += (pred & true).sum().item()
        fp += (pred & ~true).sum().item()
        fn += (~pred & true).sum().item()
    return 2 * tp / max(2 * tp + fp + fn, 1)


def run_seed(splits, attention: str, seed: int, args) -> float:
    """Train one model; returns the test micro-F1 at the best validation epoch."""
    torch.manual_seed(seed)
    train, val, test = splits
    train_loader = DataLoader(train, batch_size=args.batch_size, shuffle=True)
    val_loader, test_loader = DataLoader(val, batch_size=2), DataLoader(test, batch_size=2)
    model = DeepGAT(attention, train.num_features, train.num_classes, hidden=args.hidden)
    model.to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    best_val, test_at_best, since_best = -1.0, 0.0, 0
    bar = progress(range(args.epochs), desc=f"seed {seed}", leave=False)
    for _ in bar:
        model.train()
        for data in train_loader:
            data = data.to(args.device)
            optimizer.zero_grad()
            out = model(data.x, data.edge_index)
            F.binary_cross_entropy_with_logits(out, data.y).backward()
            optimizer.step()
        val_f1 = micro_f1(model, val_loader, args.device)
        if val_f1 > best_val:
            test_f1 = micro_f1(model, test_loader, args.device)
            best_val, test_at_best, since_best = val_f1, test_f1, 0
        else:
            since_best += 1
            if since_best >= args.patience:
                break
        bar.set_postfix(val=f"{best_val:.3f}", test=f"{test_at_best:.3f}", refresh=False)
    return test_at_best


def parse_args(argv=None):
    parser = example_parser(__doc__)
    parser.add_argument("--attention", choices=ATTENTIONS, default="penumbral")
    parser.add_argument(
        "--paper", action="store_true", help="10 seeds, 200 epochs, patience 100 (hours on CPU)"
    )
    parser.add_argument("--seeds", type=at_least(1), default=None, help="seeds (quick: 1)")
    parser.add_argument("--root", default=None, help="data root (default: $HIERGRAPH_DATA)")
    parser.add_argument("--raw-dir", default=None, help="folder to link raw PPI files from")
    parser.add_argument("--epochs", type=at_least(1), default=None, help="(quick: 5)")
    parser.add_argument("--patience", type=at_least(0), default=None, help="(quick: 100)")
    parser.add_argument("--hidden", type=at_least(1), default=256, help="hidden size per head")
    parser.add_argument("--batch-size", type=at_least(1), default=2, help="graphs per batch")
    parser.add_argument("--lr", type=LEARNING_RATE, default=5e-3)
    add_runtime_options(parser)
    parser.add_argument(
        "--synthetic",
        default=None,
        metavar="DIR",
        help="write a small SYNTHETIC PPI stand-in into DIR/PPI/raw and train on it "
        "(smoke runs only; not the real dataset)",
    )
    args = parser.parse_args(argv)
    real = args.synthetic is None  # the stand-in is written and read in its own folder
    refuse_inapplicable(parser, argv, [(("root", "raw_dir"), real, "without --synthetic")])
    apply_budget(args, QUICK, PAPER)  # explicit options win
    return args


def main(argv=None) -> list[float]:
    args = parse_args(argv)
    set_threads(args)
    get_device(args)  # checked here; run_seed reads args.device
    root, raw_dir = args.root, args.raw_dir
    if args.synthetic is not None:
        root = args.synthetic
        raw_dir = write_synthetic_ppi(Path(root) / "PPI" / "raw", nodes_per_graph=40)
    try:
        splits = load_ppi(root, raw_dir)
    except FileNotFoundError as error:  # the loader's message, and this script's smoke run
        hint = "\n(No PPI files at hand? --synthetic <folder> runs on a generated stand-in.)"
        raise FileNotFoundError(f"{error}{hint}") from None
    name = "SYNTHETIC PPI stand-in (not the real dataset)" if is_synthetic(splits[0]) else "PPI"
    sizes = "/".join(str(len(split)) for split in splits)
    print(f"{name}: {sizes} train/val/test graphs")
    scores = [
        run_seed(splits, args.attention, seed, args)
        for seed in progress(range(args.seeds), desc=args.attention)
    ]
    std = statistics.stdev(scores) if len(scores) > 1 else 0.0
    print(
        f"{name} {args.attention}: test micro-F1 {statistics.mean(scores):.4f} ± {std:.4f} "
        f"over {len(scores)} seed{'s' * (len(scores) > 1)}: "
        f"{' '.join(f'{s:.3f}' for s in scores)}"
    )
    return scores


if __name__ == "__main__":
    run(main)
