"""Data-parallel training with PyTorch's own engine: ``torch.distributed`` + DDP + torchrun.

Two tasks, one training loop:

* ``--task hte`` (default): a Hierarchical Transformer Encoder classifies
  **synthetic** random trees (ragged window hierarchies of 16..``--tree-leaves``
  Gaussian leaves; the label is the feature channel with the largest mean over
  the leaves). A demonstration task for the distributed machinery, not a
  benchmark of the model.
* ``--task node``: a 2-layer GCN on Cora (Planetoid public split). Every rank
  holds the whole graph; the *training nodes* are sharded across ranks.

What to expect (default epochs: 3 for ``hte``, 100 for ``node``): the HTE task reaches a test
accuracy of about 0.6-0.75 in a few seconds; the GCN about 0.80 on Cora's test nodes in
25 s on one process (a GCN's usual 0.81).

Batches come from PyG ``DataLoader`` s over a ``DistributedSampler`` (``--batch-size``
trees or nodes per rank; for trees a :class:`~hiergraph.loader.HierarchyLoader`, which
builds each batch's tree index at collation so it moves to the device with the batch), or,
for trees, from a
:class:`~hiergraph.loader.DistributedLeafBudgetBatchSampler` (``--leaf-budget``
leaves per rank and step). Backend: ``gloo`` on CPU, ``nccl`` on GPUs (default:
nccl when CUDA is available).

    python examples/ddp_train.py --help
    python examples/ddp_train.py                                           # one process
    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --epochs 4
    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --leaf-budget 4096
    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --task node \\
        --raw-dir /path/to/datasets/Cora/raw

Checkpoints (``--checkpoint PATH``) are written by rank 0 after every epoch;
``--resume`` continues from one up to ``--epochs`` (a checkpoint that has all of them
already is reported and left alone; one past them is refused), with the checkpoint's
learning rate unless ``--lr`` is given. Seeding depends only on
``(--seed, epoch, rank)`` and the sampling order only on ``(--seed, epoch)``, so a
resumed run reproduces the uninterrupted one, and a run on W processes with
``--batch-size B`` takes the same optimisation steps as one process with
``--batch-size W*B`` (DDP averages the ranks' mean-loss gradients;
``tests/test_distributed.py`` checks both).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F
from _cli import (
    LEARNING_RATE,
    SEED,
    OptionError,
    add_threads_option,
    at_least,
    example_parser,
    from_options,
    output_file,
    refuse_inapplicable,
    run,
    set_threads,
)
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler
from torch_geometric.nn import GCN

from hiergraph.data import random_window_hierarchy
from hiergraph.distributed import (
    cleanup_distributed,
    init_distributed,
    load_checkpoint,
    main_process_first,
    save_checkpoint,
    seed_everything,
)
from hiergraph.loader import DistributedLeafBudgetBatchSampler, HierarchyLoader, leaf_counts
from hiergraph.nn import HierarchicalTransformerEncoder, global_leaf_mean_pool
from hiergraph.runtime import progress

DTYPES = {"float32": torch.float32, "float64": torch.float64}
CHANNELS = 8  # leaf features of the synthetic trees
MIN_LEAVES = 16  # the synthetic trees' smallest leaf count
#: Adam's learning rate of a run started without --lr.
DEFAULT_LR = 3e-3
#: Epochs of a run without --epochs, per task.
EPOCHS = {"hte": 3, "node": 100}


# ------------------------------------------------------------------------------ HTE task


def synthetic_trees(num: int, max_leaves: int, channels: int, classes: int, seed: int) -> list:
    """``num`` **synthetic** ragged trees with :data:`MIN_LEAVES`..``max_leaves`` leaves
    (same on every rank).

    Leaf features are standard normal; the label is the feature channel (of
    the first ``classes``) with the largest mean over the tree's leaves.
    """
    gen = torch.Generator().manual_seed(seed)
    trees = []
    for _ in range(num):
        n = int(torch.randint(MIN_LEAVES, max(max_leaves, MIN_LEAVES) + 1, (), generator=gen))
        x = torch.randn(n, channels, generator=gen)
        tree = random_window_hierarchy(n, (4, 4, 4), x=x, generator=gen)
        tree.y = x[:, :classes].mean(0).argmax().view(1)
        trees.append(tree)
    return trees


class TreeClassifier(nn.Module):
    """HTE encoder, mean over each tree's leaves, linear head: ``Batch`` → ``[trees, classes]``."""

    def __init__(self, in_channels: int, hidden: int, classes: int, layers: int, heads: int):
        super().__init__()
        self.encoder = HierarchicalTransformerEncoder(  # (window trees: 1-D grids only)
            in_channels, hidden, num_layers=layers, heads=heads, pos_channels=16, domains=["1d"]
        )
        self.head = nn.Linear(hidden, classes)

    def forward(self, batch) -> Tensor:
        return self.head(global_leaf_mean_pool(self.encoder(batch.x, batch), batch))


def tree_task(args, ctx, dtype):
    """Model, per-rank training loader, step and evaluation functions of the HTE task."""
    sizes = (args.tree_leaves, CHANNELS, args.classes)
    train = synthetic_trees(args.num_trees, *sizes, seed=args.seed)
    test = synthetic_trees(args.num_trees // 4, *sizes, seed=~args.seed)  # a disjoint stream
    with from_options():
        model = TreeClassifier(CHANNELS, args.hidden, args.classes, args.layers, args.heads)
    if args.leaf_budget:
        sampler = DistributedLeafBudgetBatchSampler(
            leaf_counts(train), args.leaf_budget, ctx.world_size, ctx.rank, seed=args.seed
        )
        loader = HierarchyLoader(train, batch_sampler=sampler)
    else:
        sampler = distributed_sampler(train, ctx, args.seed)
        loader = HierarchyLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    def loss_fn(model, batch):
        batch = batch.to(ctx.device)
        return F.cross_entropy(model(cast(batch, dtype)), batch.y)

    @torch.no_grad()
    def evaluate(model):
        correct = 0
        for batch in HierarchyLoader(test, batch_size=args.batch_size):
            batch = batch.to(ctx.device)
            correct += int((model(cast(batch, dtype)).argmax(-1) == batch.y).sum())
        return {"test_acc": correct / len(test)}

    return model, loader, sampler, loss_fn, evaluate


def cast(batch, dtype):
    batch.x = batch.x.to(dtype)
    return batch


# ----------------------------------------------------------------------------- node task


def node_task(args, ctx, dtype):
    """Model, per-rank loader of training-node ids, step and evaluation of GCN on Cora."""
    import torch_geometric.transforms as T

    from hiergraph.datasets.planetoid import load_planetoid

    with main_process_first(ctx):  # rank 0 writes processed/ once, the others then read it
        dataset = load_planetoid("Cora", args.root, args.raw_dir, transform=T.NormalizeFeatures())
    data = dataset[0].to(ctx.device)
    data.x = data.x.to(dtype)
    with from_options():
        model = GCN(
            dataset.num_features, args.hidden, num_layers=2, out_channels=dataset.num_classes
        )
    train_ids = data.train_mask.nonzero().view(-1).cpu()
    sampler = distributed_sampler(train_ids, ctx, args.seed)
    loader = torch.utils.data.DataLoader(
        train_ids, batch_size=args.batch_size, sampler=sampler, drop_last=True
    )

    def loss_fn(model, ids):
        ids = ids.to(ctx.device)
        out = model(data.x, data.edge_index)
        return F.cross_entropy(out[ids], data.y[ids])

    @torch.no_grad()
    def evaluate(model):
        pred = model(data.x, data.edge_index).argmax(-1)
        return {
            f"{split}_acc": float((pred[mask] == data.y[mask]).float().mean())
            for split, mask in (("val", data.val_mask), ("test", data.test_mask))
        }

    return model, loader, sampler, loss_fn, evaluate


def distributed_sampler(dataset, ctx, seed: int) -> DistributedSampler:
    """Shuffled shards of equal size (``drop_last``): rank r takes every W-th index."""
    return DistributedSampler(
        dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=seed, drop_last=True
    )


# ------------------------------------------------------------------------------ training


def train(args) -> dict:
    """Train on this process's rank (see :func:`train_rank`); the process group is destroyed
    however that ends."""
    # torchrun sets OMP_NUM_THREADS=1 per process, so each rank then runs one thread
    set_threads(args)
    ctx = init_distributed(args.backend)
    try:
        return train_rank(args, ctx)
    finally:
        cleanup_distributed()


def train_rank(args, ctx) -> dict:
    """``{"history": one record per epoch trained, "world_size": W}``; rank 0 prints each
    record as a JSON line. The train loss of an epoch is the mean over its steps and ranks.

    Refused (:class:`OptionError`): sizes that leave a rank no training step in an epoch,
    and a ``--resume`` checkpoint past ``--epochs``. A checkpoint that has trained exactly
    ``--epochs`` trains nothing: rank 0 says so on stderr."""
    dtype = DTYPES[args.dtype]
    seed_everything(args.seed)  # identical initialisation on every rank
    model, loader, sampler, loss_fn, evaluate = (tree_task if args.task == "hte" else node_task)(
        args, ctx, dtype
    )
    if not len(loader):  # (a leaf budget packs every tree into some batch)
        items = "trees" if args.task == "hte" else "nodes"
        raise OptionError(
            f"no training step: each of {ctx.world_size} process(es) gets {len(sampler)} "
            f"training {items}, less than one batch of --batch-size {args.batch_size}"
        )
    model = model.to(ctx.device, dtype)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr or DEFAULT_LR)
    start_epoch, step = 0, 0
    if args.resume:
        with from_options():  # a checkpoint of other settings, or no checkpoint at all
            state = load_checkpoint(args.checkpoint, model, optimizer, map_location=ctx.device)
        resumed_lr = optimizer.param_groups[0]["lr"]
        if args.lr is not None and args.lr != resumed_lr:  # (the checkpoint's replaced it)
            for group in optimizer.param_groups:
                group["lr"] = args.lr
            if ctx.is_main:
                print(f"--lr {args.lr} replaces the checkpoint's {resumed_lr}", file=sys.stderr)
        epoch, step = state.get("epoch"), state.get("step")
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (epoch, step)):
            raise OptionError(  # (a KeyError or TypeError traceback)
                f"--resume: {args.checkpoint} records no epoch and step of this script "
                "(a checkpoint written by other code?)"
            )
        start_epoch = epoch + 1
        if start_epoch > args.epochs:
            raise OptionError(
                f"--resume: {args.checkpoint} has trained {start_epoch} epochs, more than "
                f"--epochs {args.epochs}"
            )
        if start_epoch == args.epochs and ctx.is_main:
            print(
                f"{args.checkpoint} has trained all --epochs {args.epochs} epochs: nothing to "
                "train (a larger --epochs continues it)",
                file=sys.stderr,
            )
    if ctx.distributed:
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids)

    history = []
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        seed_everything(args.seed, epoch, ctx.rank)
        model.train()
        total = torch.zeros((), dtype=torch.float64, device=ctx.device)
        steps = 0
        bar = progress(loader, desc=f"epoch {epoch}", leave=False) if ctx.is_main else loader
        for batch in bar:
            optimizer.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            optimizer.step()
            total += loss.detach()
            steps += 1
        step += steps
        if ctx.distributed:  # one collective per epoch, for logging only
            torch.distributed.all_reduce(total)
        model.eval()
        record = {
            "epoch": epoch,
            "step": step,
            "train_loss": float(total) / (steps * ctx.world_size),  # the same steps on every rank
            **evaluate(model),
        }
        history.append(record)
        if ctx.is_main:
            print(json.dumps(record), flush=True)
        if args.checkpoint:
            save_checkpoint(args.checkpoint, model, optimizer, ctx, epoch=epoch, step=step)
    return {"history": history, "world_size": ctx.world_size}


def parse_args(argv=None) -> argparse.Namespace:
    parser = example_parser(__doc__)
    parser.add_argument("--task", choices=("hte", "node"), default="hte")
    parser.add_argument(
        "--epochs", type=at_least(1), default=None, help="(default: hte 3, node 100)"
    )
    parser.add_argument("--batch-size", type=at_least(1), default=16, help="trees/nodes per rank")
    parser.add_argument(
        "--leaf-budget",
        type=at_least(0),
        default=0,
        help="hte: pack trees up to this many leaves per rank and step instead of --batch-size",
    )
    parser.add_argument(
        "--lr",
        type=LEARNING_RATE,
        default=None,
        help=f"(default: {DEFAULT_LR}; with --resume: the checkpoint's)",
    )
    parser.add_argument("--seed", type=SEED, default=0)
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None)
    parser.add_argument(
        "--checkpoint", type=output_file, default=None, help="checkpoint file (rank 0 writes)"
    )
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--hidden", type=at_least(1), default=32)
    parser.add_argument("--layers", type=at_least(1), default=2, help="hte layers")
    parser.add_argument("--heads", type=at_least(1), default=4, help="hte heads")
    parser.add_argument(
        "--num-trees",
        type=at_least(4),
        default=512,
        help="hte: synthetic training trees (and a quarter as many test trees)",
    )
    parser.add_argument(
        "--tree-leaves",
        type=at_least(MIN_LEAVES),
        default=256,
        help=f"hte: max leaves per tree (each has {MIN_LEAVES} at least)",
    )
    parser.add_argument(
        "--classes",
        type=at_least(2, at_most=CHANNELS),
        default=4,
        help=f"hte: classes (the first of the {CHANNELS} feature channels)",
    )
    parser.add_argument("--root", default=None, help="node: data root")
    parser.add_argument("--raw-dir", default=None, help="node: folder with Cora's raw files")
    add_threads_option(
        parser,
        help="torch CPU threads per process (default: at most 2, no more than the idle cores)",
    )
    args = parser.parse_args(argv)
    if args.resume and not args.checkpoint:
        parser.error("--resume needs --checkpoint")
    hte = args.task == "hte"
    if args.epochs is None:  # (3 epochs left the GCN at 0.32 test accuracy)
        args.epochs = EPOCHS[args.task]
    refuse_inapplicable(parser, argv, [
        (("leaf_budget", "layers", "heads", "num_trees", "tree_leaves", "classes"), hte,
         "to --task hte"),
        (("root", "raw_dir"), not hte, "to --task node"),
    ])  # fmt: skip
    return args


if __name__ == "__main__":
    run(lambda: train(parse_args()))
