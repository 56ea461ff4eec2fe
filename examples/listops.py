"""ListOps (Long Range Arena style): flat vs H-matrix vs HSA-window encoders, equal CPU budget.

A ListOps example is a nested prefix expression over the digits 0-9, e.g.
``[MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]`` (= 8); the label is its value
(10 classes). Operators: MAX, MIN, MED (lower median) and SM (sum modulo 10).
Solving it needs the tree structure of the whole sequence, up to 2K tokens.

Every encoder has the same width, depth, heads and parameter count, differs only
in its attention, and trains for the same wall-clock budget:

    python examples/listops.py            # 35 s per encoder, 100-500 tokens: ~2.5 minutes
    python examples/listops.py --paper    # 10 minutes per encoder, 500-2,000 tokens: ~35 min
    python examples/listops.py --quick    # a tiny model on short expressions: < 1 minute

What to expect: the default and ``--quick`` budgets are far too short to learn ListOps (the
Long Range Arena trains for hours on 96,000 expressions); every encoder ends near the
majority-class accuracy the script prints with the data (about 0.15-0.2), and such a run
compares how many steps each encoder takes in the same time, not what it learns.

Budgets: the default trains each encoder for 35 s on 2,000 expressions of 100-500
tokens and tests on 300; ``--paper`` uses the Long Range Arena's lengths (500-2,000
tokens; 4,000 training and 500 test expressions, far fewer than LRA's 96,000) and 600 s
per encoder. Flags given explicitly override either budget; ``--quick`` shrinks the model
and the data for smoke tests; ``--device`` picks where the encoders train (default: cuda if
any).

To add an encoder, add one entry to ``ENCODERS``: a function of the parsed
arguments returning a module that maps ``(tokens [B, L], padding_mask [B, L])``
to hidden states ``[B, L, dim]``.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from _cli import (
    LEARNING_RATE,
    SEED,
    OptionError,
    above,
    add_runtime_options,
    at_least,
    example_parser,
    from_options,
    get_device,
    output_file,
    run,
    set_threads,
)
from torch import Tensor, nn

from hiergraph.data.windows import window_forest
from hiergraph.nn.hierarchical_attention import HierarchicalSelfAttention
from hiergraph.nn.hmatrix_attention import HMatrixAttention
from hiergraph.nn.htransformer1d import HTransformer1D
from hiergraph.runtime import apply_budget, progress

MODEL = {"dim": 64, "depth": 2, "heads": 4, "block_size": 16, "batch_size": 16}
QUICK = {"budget_seconds": 35.0, "min_len": 100, "max_len": 500, "train_size": 2000,
         "test_size": 300, **MODEL}  # fmt: skip
PAPER = {"budget_seconds": 600.0, "min_len": 500, "max_len": 2000, "train_size": 4000,
         "test_size": 500, **MODEL}  # fmt: skip
#: ``--quick``: a smoke run of under a minute (options given explicitly still win)
TINY = {"budget_seconds": 5.0, "min_len": 20, "max_len": 120, "train_size": 1000,
        "test_size": 200, "dim": 32, "depth": 1, "heads": 2, "block_size": 8,
        "batch_size": 32}  # fmt: skip

# ------------------------------------------------------------------------------------- data

PAD, CLOSE = 0, 15
DIGITS = list(range(1, 11))  # token of digit d is d + 1
OPERATORS = {
    11: ("MAX", max),
    12: ("MIN", min),
    13: ("MED", lambda xs: sorted(xs)[(len(xs) - 1) // 2]),
    14: ("SM", lambda xs: sum(xs) % 10),
}
VOCAB = 16
#: rejected trees in a row after which :func:`listops` gives up on a length range
MAX_REJECTED = 10_000


def _expression(rng: random.Random, depth: int, budget: list[int], max_depth: int, max_args: int):
    """Random expression tree → (tokens, value); ``budget[0]`` tokens left, then only digits."""
    if depth >= max_depth or budget[0] <= 2 or (depth > 0 and rng.random() < 0.3):
        budget[0] -= 1
        digit = rng.randrange(10)
        return [digit + 1], digit
    op = rng.choice(list(OPERATORS))
    budget[0] -= 2  # operator and closing bracket
    tokens, values = [op], []
    for _ in range(rng.randint(2, max_args)):
        sub_tokens, sub_value = _expression(rng, depth + 1, budget, max_depth, max_args)
        tokens += sub_tokens
        values.append(sub_value)
    return tokens + [CLOSE], OPERATORS[op][1](values)


def listops(num: int, min_len: int, max_len: int, seed: int) -> list[tuple[list[int], int]]:
    """``num`` (tokens, label) pairs with ``min_len <= len(tokens) <= max_len``.

    Each tree is grown towards a target length drawn uniformly from the range
    (after the budget runs out, open operators get digit arguments only);
    trees outside the range are rejected. Narrow ranges are hit rarely or never (2-12
    tokens: a target under 13 makes a single digit; most single lengths): after
    :data:`MAX_REJECTED` rejections in a row, an :class:`OptionError` says so.
    """
    rng = random.Random(seed)
    data, rejected = [], 0
    while len(data) < num:
        budget = [rng.randint(min_len, max_len) - 10]
        tokens, value = _expression(rng, 0, budget, max_depth=10, max_args=10)
        if min_len <= len(tokens) <= max_len:
            data.append((tokens, value))
            rejected = 0
        elif (rejected := rejected + 1) == MAX_REJECTED:
            raise OptionError(
                f"no expression of {min_len}-{max_len} tokens in {MAX_REJECTED:,} tries: "
                "widen --min-len..--max-len"
            )
    return data


def render(tokens: list[int]) -> str:
    names = {op: f"[{name}" for op, (name, _) in OPERATORS.items()} | {CLOSE: "]"}
    return " ".join(names.get(t, str(t - 1)) for t in tokens)


def collate(batch: list[tuple[list[int], int]]) -> tuple[Tensor, Tensor, Tensor]:
    """→ tokens ``[B, L]`` (PAD-filled), padding mask ``[B, L]`` (True = pad), labels ``[B]``."""
    length = max(len(tokens) for tokens, _ in batch)
    tokens = torch.full((len(batch), length), PAD, dtype=torch.long)
    for row, (seq, _) in enumerate(batch):
        tokens[row, : len(seq)] = torch.tensor(seq)
    return tokens, tokens == PAD, torch.tensor([label for _, label in batch])


# ------------------------------------------------------------------------------------- models


class FlatAttention(HMatrixAttention):
    """Same projections as :class:`HMatrixAttention`, exact softmax attention (SDPA)."""

    def attend(self, q, k, v, key_padding_mask):
        mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class HSAWindowAttention(nn.Module):
    """Hierarchical self-attention (HSA) over a hopping-window hierarchy of every sequence.

    Same call signature as :class:`HMatrixAttention`; the windows group 4
    tokens, then 4 windows, and so on (``branching``), over each sequence's
    valid tokens (padding sits at the end); the trees of a batch are built as
    one forest (:func:`~hiergraph.data.windows.window_forest`).
    """

    def __init__(self, dim: int, heads: int, branching: tuple[int, ...] = (4, 4, 4, 4, 4)):
        super().__init__()
        self.attn = HierarchicalSelfAttention(dim, dim, heads, include_self=True)
        self.branching = branching

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        valid = (
            torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
            if key_padding_mask is None
            else ~key_padding_mask
        )
        out = torch.zeros_like(x)
        out[valid] = self.attn(x[valid], window_forest(valid.sum(1), self.branching))
        return out


def _transformer(args, attention=None) -> nn.Module:
    return HTransformer1D(VOCAB, args.dim, args.depth, args.heads, block_size=args.block_size,
                          lm_head=False, attention=attention)  # fmt: skip


ENCODERS = {
    "flat": lambda args: _transformer(args, attention=FlatAttention),
    "hmatrix": lambda args: _transformer(args),
    "hsa-window": lambda args: _transformer(args, attention=HSAWindowAttention),
}


class Classifier(nn.Module):
    """Encoder → masked mean over tokens → linear map to the 10 classes."""

    def __init__(self, encoder: nn.Module, dim: int):
        super().__init__()
        self.encoder, self.head = encoder, nn.Linear(dim, 10)

    def forward(self, tokens: Tensor, padding_mask: Tensor) -> Tensor:
        hidden = self.encoder(tokens, padding_mask)
        keep = (~padding_mask).unsqueeze(-1).to(hidden.dtype)
        return self.head((hidden * keep).sum(1) / keep.sum(1))


# ------------------------------------------------------------------------------------- training


@torch.no_grad()
def accuracy(model: nn.Module, data, batch_size: int, device: torch.device) -> float:
    model.eval()
    correct = 0
    for start in range(0, len(data), batch_size):
        batch = collate(data[start : start + batch_size])
        tokens, mask, labels = (t.to(device) for t in batch)
        correct += (model(tokens, mask).argmax(-1) == labels).sum().item()
    model.train()
    return correct / len(data)


def build(name: str, args) -> Classifier:
    """The seeded classifier with encoder ``name`` (every encoder starts from the same seed)."""
    torch.manual_seed(args.seed)
    return Classifier(ENCODERS[name](args), args.dim)


def train(name: str, args, train_data, test_data, device: torch.device) -> dict:
    """Train encoder ``name`` for ``args.budget_seconds`` (at least one step, however
    small the budget) and test it."""
    model = build(name, args).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    rng = random.Random(args.seed)
    steps, start = 0, time.perf_counter()
    bar = progress(total=round(args.budget_seconds), desc=name, unit="s", leave=False)
    while steps == 0 or time.perf_counter() - start < args.budget_seconds:
        batch = collate(rng.sample(train_data, args.batch_size))
        tokens, mask, labels = (t.to(device) for t in batch)
        loss = F.cross_entropy(model(tokens, mask), labels)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        steps += 1
        bar.update(min(round(time.perf_counter() - start), bar.total) - bar.n)
    bar.close()
    seconds = time.perf_counter() - start
    return {
        "encoder": name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "steps": steps,
        "train_seconds": round(seconds, 1),
        "seconds_per_step": round(seconds / steps, 3),
        "last_loss": round(loss.item(), 3),
        "test_accuracy": accuracy(model, test_data, args.batch_size, device),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = example_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny lengths/model; < 1 minute")
    parser.add_argument(
        "--paper",
        action="store_true",
        help="LRA lengths (500-2,000 tokens), 600 s per encoder (~35 min)",
    )
    parser.add_argument(
        "--budget-seconds", type=above(0), default=None, help="training time per encoder (35)"
    )
    parser.add_argument("--min-len", type=at_least(1), default=None, help="(100)")
    parser.add_argument("--max-len", type=at_least(1), default=None, help="(500)")
    parser.add_argument("--train-size", type=at_least(1), default=None, help="(2000)")
    parser.add_argument("--test-size", type=at_least(1), default=None, help="(300)")
    parser.add_argument("--dim", type=at_least(1), default=None, help="(64)")
    parser.add_argument("--depth", type=at_least(1), default=None, help="(2)")
    parser.add_argument("--heads", type=at_least(1), default=None, help="(4)")
    parser.add_argument(
        "--block-size", type=at_least(2), default=None, help="Nr of the H-matrix encoder (16)"
    )
    parser.add_argument("--batch-size", type=at_least(1), default=None, help="(16)")
    parser.add_argument("--lr", type=LEARNING_RATE, default=1e-3)
    parser.add_argument("--encoders", nargs="+", default=list(ENCODERS), choices=list(ENCODERS))
    parser.add_argument("--seed", type=SEED, default=0)
    parser.add_argument("--out", type=output_file, default=None, help="JSON file for the results")
    add_runtime_options(parser)
    args = parser.parse_args(argv)
    if args.quick and args.paper:
        parser.error("--quick and --paper are exclusive")
    if args.quick:
        apply_budget(args, TINY, TINY)
    apply_budget(args, QUICK, PAPER)  # explicit options win
    if args.min_len > args.max_len:
        parser.error(f"--min-len {args.min_len} is more than --max-len {args.max_len}")
    if args.batch_size > args.train_size:  # a step samples a batch without replacement
        parser.error(f"--batch-size {args.batch_size} is more than --train-size {args.train_size}")
    with from_options():  # the library refuses impossible sizes now, not after an encoder's run
        for name in args.encoders:
            build(name, args)
    set_threads(args)
    device = get_device(args)

    start = time.perf_counter()
    train_data = listops(args.train_size, args.min_len, args.max_len, seed=args.seed)
    test_data = listops(args.test_size, args.min_len, args.max_len, seed=args.seed + 1)
    lengths = [len(tokens) for tokens, _ in train_data]
    counts = torch.bincount(torch.tensor([label for _, label in test_data]), minlength=10)
    majority = counts.max().item() / len(test_data)
    print(f"example: {render(min(train_data, key=lambda x: len(x[0]))[0])}")
    print(f"data: {len(train_data)} train / {len(test_data)} test, lengths {min(lengths)}-"
          f"{max(lengths)} (mean {sum(lengths) / len(lengths):.0f}), generated in "
          f"{time.perf_counter() - start:.1f} s; majority-class test accuracy "
          f"{majority:.3f}")  # fmt: skip
    results = []
    for name in args.encoders:
        results.append(train(name, args, train_data, test_data, device))
        print(json.dumps(results[-1]), flush=True)
    if all(r["test_accuracy"] <= majority + 0.05 for r in results):
        print("note: no encoder beat the majority class by more than 0.05: this budget does not "
              "learn ListOps (see the module docstring); compare the steps taken")  # fmt: skip
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return results


if __name__ == "__main__":
    run(main)
