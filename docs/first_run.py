"""First run: does the hierarchy help? HSA vs flat attention on generated nested lists.

Every example is a nested list: a document of 4-8 groups of 3-8 token ids, e.g. ::

    [[15, 14, 3, 6, 9], [9, 12, 0, 14, 1, 3], [2, 15, 8, 11], [13, 9, 6]]

Token 0 and token 1 occur once each; the label says whether they are in the *same group*
(here: yes, the second). Both classes have the same tokens, so the model has to know the
groups. Two classifiers with the same parameters train on the same batches for the same
number of steps:

* ``hsa``: one HTE layer with Hierarchical Self-Attention over the tree that
  :func:`hiergraph.data.from_nested` builds from the nested list;
* ``flat``: the same layer on the flattened tree, i.e. softmax attention among all
  tokens with their 1-D positions (the "FSA" baseline of the HSA paper, Sec. 4.1).

Then it times one forward pass of the two attention ops on one long sequence (window
hierarchy over 16,384 tokens): flat attention's cost grows with the square of the
length, HSA's linearly.

A demonstration on generated data, not a benchmark: accuracies depend on the seed and
times on the machine. About 40 s on 2 CPU cores::

    python docs/first_run.py
    python docs/first_run.py --steps 50 --long 2048   # a smoke test: both models near chance
"""

from __future__ import annotations

import argparse
import random
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Batch

from hiergraph.data import from_nested, window_hierarchy
from hiergraph.nn import HierarchicalTransformerEncoder, global_leaf_mean_pool
from hiergraph.ops import hierarchical_attention

VOCAB = 16


def make_example(rng: random.Random) -> tuple[list[list[int]], int]:
    """A document of groups of token ids, and whether tokens 0 and 1 share a group."""
    groups = [
        [rng.randrange(2, VOCAB) for _ in range(rng.randint(3, 8))]
        for _ in range(rng.randint(4, 8))
    ]
    label = rng.random() < 0.5
    a = rng.randrange(len(groups))
    b = a if label else rng.choice([g for g in range(len(groups)) if g != a])
    i = rng.randrange(len(groups[a]))
    groups[a][i] = 0
    j = rng.choice([j for j in range(len(groups[b])) if (b, j) != (a, i)])
    groups[b][j] = 1
    return groups, int(label)


def to_hierarchy(groups: list[list[int]], label: int):
    """Nested token ids -> a signal hierarchy with one-hot leaf features."""
    tokens = [t for group in groups for t in group]
    spec, i = [], 0
    for group in groups:  # leaf ints are row indices of x, in reading order
        spec.append(list(range(i, i + len(group))))
        i += len(group)
    tree = from_nested(spec, x=F.one_hot(torch.tensor(tokens), VOCAB).float())
    tree.y = torch.tensor([label])
    return tree


class Classifier(nn.Module):
    """One HTE layer -> mean over the leaves -> linear read-out (the HSA paper's model)."""

    def __init__(self, attention: str, hidden: int = 32):
        super().__init__()
        self.encoder = HierarchicalTransformerEncoder(
            VOCAB, hidden, num_layers=1, heads=2, pos_channels=16, attention=attention
        )
        self.head = nn.Linear(hidden, 2)

    def forward(self, batch):
        return self.head(global_leaf_mean_pool(self.encoder(batch.x, batch), batch))


def accuracy(model: nn.Module, batches: list) -> float:
    model.eval()
    with torch.no_grad():
        right = sum(int((model(b).argmax(-1) == b.y).sum()) for b in batches)
    model.train()
    return right / sum(b.num_graphs for b in batches)


def train(attention: str, train_set: list, test_batches: list, args) -> dict:
    torch.manual_seed(args.seed)
    model = Classifier(attention)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    order = random.Random(args.seed)
    start = time.process_time()
    for _ in range(args.steps):
        batch = Batch.from_data_list(order.sample(train_set, args.batch_size))
        loss = F.cross_entropy(model(batch), batch.y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    seconds = time.process_time() - start
    return {"test accuracy": accuracy(model, test_batches), "train CPU s": seconds}


def time_ops(length: int, heads: int = 4, dim: int = 64) -> tuple[float, float]:
    """Seconds of one forward pass: HSA over windows (16, 8, 4, ...) vs flat softmax."""
    branching, n = [16], 16
    while n * 4 < length:
        branching.append(8 if len(branching) == 1 else 4)
        n *= branching[-1]
    tree = window_hierarchy(length, tuple(branching))
    q, k, v = torch.randn(3, length, heads, dim).unbind(0)
    hierarchical_attention(q, k, v, tree)  # warm-up: builds the tree's plan once
    start = time.perf_counter()
    hierarchical_attention(q, k, v, tree)
    hsa = time.perf_counter() - start
    qf, kf, vf = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, L, d]
    start = time.perf_counter()
    F.scaled_dot_product_attention(qf, kf, vf)
    return hsa, time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=400, help="training steps per model")
    parser.add_argument("--batch-size", type=int, default=32, help="documents per step")
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate")
    parser.add_argument("--train-size", type=int, default=2000, help="training documents")
    parser.add_argument("--test-size", type=int, default=1000, help="test documents")
    parser.add_argument("--long", type=int, default=16384, help="sequence length of the op timing")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0, help="data and model seed")
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "train_size", "test_size", "long", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.batch_size > args.train_size:
        parser.error(f"--batch-size {args.batch_size} is more than --train-size {args.train_size}")
    torch.set_num_threads(args.threads)

    rng = random.Random(args.seed)
    data = [to_hierarchy(*make_example(rng)) for _ in range(args.train_size + args.test_size)]
    train_set, test_set = data[: args.train_size], data[args.train_size :]
    test_batches = [
        Batch.from_data_list(test_set[i : i + 256]) for i in range(0, len(test_set), 256)
    ]
    example, label = make_example(random.Random(args.seed + 1))
    print(f"an example: {example} -> label {label}")
    tokens = sum(t.num_leaves for t in test_set) / len(test_set)
    print(f"{len(train_set)} training and {len(test_set)} test documents, {tokens:.0f} tokens each")

    results = {}
    for attention in ("hsa", "flat"):
        results[attention] = train(attention, train_set, test_batches, args)
        r = results[attention]
        print(
            f"{attention:>4}: test accuracy {r['test accuracy']:.3f} after {args.steps} steps "
            f"({r['train CPU s']:.1f} CPU s)"
        )

    hsa, flat = time_ops(args.long)
    results["op seconds"] = {"hsa": hsa, "flat": flat}
    print(
        f"one forward pass over {args.long:,} tokens (4 heads x 64): "
        f"HSA {hsa * 1e3:.0f} ms, flat softmax {flat * 1e3:.0f} ms ({flat / hsa:.1f}x)"
    )
    return results


if __name__ == "__main__":
    main()
