"""Which relational mask fits the task? A tiny sequence task on CPU.

Task: read a sequence of digits and predict, at every position ``t``, the
largest of the last ``p + 1`` digits, ``max(x[t-p .. t])``. The model is one
:class:`hiergraph.nn.MaskedAttentionConv` layer over digit embeddings, with no
positional encoding, followed by a linear read-out. Only the mask changes:

* ``causal_window`` - ``window_mask(n, p, causal=True)``: each query sees
  exactly the digits the target depends on (the relational bias matches);
* ``window`` - the bidirectional window ``|i - j| <= p`` (sees the future too);
* ``causal`` - everything up to ``t``; ``full`` - everything;
* ``random`` - a random mask with the same number of edges as the causal window.

Without positions, attention is a function of the *set* of attended digits
(Mijangos et al., Sec. 3.1, Thm. 5), so only the masks whose neighbourhoods are the
right set can solve the task. Sequences of different lengths are batched as one
PyG ``Batch`` (``hiergraph.masks.sequence_batch``); the window masks take the
banded fast path, the others the general edge path.

Usage::

    python examples/masked_attention.py                 # 20-60 s on 2 cores
    python examples/masked_attention.py --steps 100 --masks causal_window causal
    python examples/masked_attention.py --device cuda   # on a GPU (default: cuda if any)

The task is small and self-contained (no paper protocol to reproduce, so no
``--paper``); ``--steps`` sets the training length.
"""

from __future__ import annotations

import time

import torch
from _cli import (
    LEARNING_RATE,
    SEED,
    add_runtime_options,
    at_least,
    example_parser,
    get_device,
    run,
    set_threads,
)
from torch import nn
from tqdm import tqdm

from hiergraph.masks import (
    causal_mask,
    full_mask,
    random_mask,
    sequence_batch,
    window_mask,
)
from hiergraph.nn.masked_attention_conv import MaskedAttentionConv
from hiergraph.runtime import progress


def mask_builders(p: int) -> dict:
    """Mask name -> builder ``(n, generator) -> edge_index``."""

    def random_like(n: int, generator: torch.Generator) -> torch.Tensor:
        seed = int(torch.randint(2**31, (), generator=generator))
        return random_mask(n, window_mask(n, p, causal=True).size(1), seed=seed)

    return {
        "causal_window": lambda n, generator: window_mask(n, p, causal=True),
        "window": lambda n, generator: window_mask(n, p),
        "causal": lambda n, generator: causal_mask(n),
        "full": lambda n, generator: full_mask(n),
        "random": random_like,
    }


class MaxOfWindow(nn.Module):
    """Embedding -> masked attention -> ReLU -> linear read-out (10 classes)."""

    def __init__(self, hidden: int = 32, heads: int = 2):
        super().__init__()
        self.embed = nn.Embedding(10, hidden)
        self.attention = MaskedAttentionConv(hidden, hidden // heads, heads=heads)
        self.readout = nn.Linear(hidden, 10)

    def forward(self, tokens: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.readout(torch.relu(self.attention(self.embed(tokens), edge_index)))


def make_batch(builder, num_sequences: int, p: int, generator: torch.Generator):
    """Random digit sequences of lengths 16..48 and their ``max of window`` labels."""
    lengths = torch.randint(16, 49, (num_sequences,), generator=generator).tolist()
    tokens = torch.randint(0, 10, (sum(lengths),), generator=generator)
    batch = sequence_batch(lengths, builder, x=tokens, generator=generator)
    starts = batch.ptr[batch.batch]
    labels = torch.stack(
        [batch.x[(torch.arange(len(tokens)) - s).clamp_min(starts)] for s in range(p + 1)]
    ).amax(dim=0)
    return batch, labels


def train(name: str, builder, args, device: torch.device) -> tuple[float, float]:
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    model = MaxOfWindow().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start = time.perf_counter()
    for _ in progress(range(args.steps), desc=name, leave=False):
        batch, labels = make_batch(builder, args.batch_size, args.p, generator)
        batch, labels = batch.to(device), labels.to(device)
        loss = nn.functional.cross_entropy(model(batch.x, batch.edge_index), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        batch, labels = make_batch(builder, 256, args.p, torch.Generator().manual_seed(10**6))
        batch, labels = batch.to(device), labels.to(device)
        accuracy = (model(batch.x, batch.edge_index).argmax(-1) == labels).float().mean()
    return float(accuracy), time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Trains one model per mask; returns each mask's test accuracy."""
    parser = example_parser(__doc__)
    parser.add_argument(
        "--p", type=at_least(0), default=2, help="the task looks at the last p+1 digits"
    )
    parser.add_argument("--steps", type=at_least(1), default=300, help="training steps per mask")
    parser.add_argument("--batch-size", type=at_least(1), default=32, help="sequences per step")
    parser.add_argument("--lr", type=LEARNING_RATE, default=1e-2)
    parser.add_argument("--seed", type=SEED, default=0)
    add_runtime_options(parser)
    builders = mask_builders(2)
    parser.add_argument("--masks", nargs="+", default=list(builders), choices=list(builders))
    args = parser.parse_args(argv)
    set_threads(args)
    device = get_device(args)
    builders = mask_builders(args.p)
    print(f"max of the last {args.p + 1} digits, {args.steps} steps per mask")
    results = {}
    for name in args.masks:
        results[name], seconds = train(name, builders[name], args, device)
        tqdm.write(f"{name:>14}: test accuracy {results[name]:.3f}  ({seconds:.1f} s)")
    return results


if __name__ == "__main__":
    run(main)
