"""Hopping-window hierarchies over a sequence (as the fixed ones of Amizadeh et al., Sec. 4.3),
and the binary window tree of H-matrix attention (Zhu & Soricut, *H-Transformer-1D*) with
its integer layout."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from numbers import Integral
from typing import NamedTuple

import torch
from torch import Tensor

from hiergraph._checks import as_int, check_int, described
from hiergraph._runs import ramp
from hiergraph.data.signal_hierarchy import SignalHierarchy, as_long


def window_hierarchy(
    n: int,
    branching: Sequence[int] = (2, 4, 8, 16),
    x: Tensor | None = None,
    lifted: Tensor | None = None,
) -> SignalHierarchy:
    r"""Non-overlapping hopping windows over ``n`` tokens, built bottom-up.

    Level 1 groups the tokens into windows of ``branching[0]``, level 2 groups
    those windows into windows of ``branching[1]``, and so on; the last window
    of a level may be partial. After the tuple is used up, one root takes all
    remaining nodes (the *remainder root*). Building stops early once a level
    has a single node, which becomes the root. Every family is a 1-D grid and
    a child's position is its index in its window.

    For ``n = 10, branching = (2, 4)``: 5 windows of 2 tokens, 2 windows of
    (4, 1) windows, and a root over those 2.

    Args:
        n: number of tokens (leaves), ``n >= 1``.
        branching: bottom-up window sizes, each ``>= 2``.
        x: optional ``[n, F]`` token features.
        lifted: optional ``[n]`` bool, tokens hung directly under the root instead of
            windowed (see :func:`window_forest`).

    The tree is built on the device of ``x`` / ``lifted`` (PyTorch's default device
    without them), as in :func:`window_forest`.
    """
    n, branching = _check(n, branching)
    return window_forest([n], branching, lifted=lifted, x=x)


def window_forest(
    lengths: Sequence[int] | Tensor,
    branching: Sequence[int] = (2, 4, 8, 16),
    *,
    lifted: Tensor | None = None,
    x: Tensor | None = None,
) -> SignalHierarchy:
    r"""The window hierarchies of many sequences as one forest, built with tensor ops.

    Tree ``b`` is :func:`window_hierarchy` ``(lengths[b], branching)``. With
    ``lifted``, the marked tokens of a sequence are not windowed: windows are
    built over its other tokens, and every lifted token hangs directly under the
    root as a leaf (its slot: its rank among the sequence's lifted tokens, before
    the windows' top nodes; when the other tokens form a single window or a single
    token, the root is one flat family over all tokens, in order). Leaf ``i`` is
    token ``i`` of the concatenated sequences either way.

    Every level is cut for all sequences at once (a handful of tensor ops per
    level instead of one tree per sequence and PyG collation). Internal nodes are
    numbered level by level over all sequences, so the forest equals
    ``Batch.from_data_list`` of the single trees up to the numbering of internal
    nodes, which no hierarchical op depends on.

    Args:
        lengths: ``[B]`` tokens per sequence, each ``>= 1``.
        branching: bottom-up window sizes, each ``>= 2``.
        lifted: optional ``[sum(lengths)]`` bool; at most ``n - 1`` of a sequence's
            ``n`` tokens.
        x: optional ``[sum(lengths), F]`` token features.

    Returns:
        a :class:`SignalHierarchy` whose ``batch`` (``[N]``, derived) is the sequence of
        every node, on the device of the tensor inputs (``x``, ``lifted``, ``lengths``; they
        must share it), or on PyTorch's default device when all are absent or Python ints.
    """
    device = _input_device(lengths, lifted, x)
    lengths = as_long(lengths, "lengths", device).flatten()
    if lengths.numel() == 0 or bool((lengths < 1).any()):
        raise ValueError(f"lengths must be a non-empty list of ints >= 1, got {lengths.tolist()}")
    branching = check_branching(branching)
    num, total = lengths.numel(), int(lengths.sum())
    seq = torch.arange(num, device=device).repeat_interleave(lengths, output_size=total)
    num_lifted = torch.zeros_like(lengths)
    if lifted is not None:
        if not isinstance(lifted, Tensor):  # (an AttributeError)
            raise TypeError(
                f"lifted must be a [{total}] bool tensor or None, got {described(lifted)}"
            )
        if lifted.dtype != torch.bool or lifted.shape != (total,):
            raise ValueError(f"lifted must be a [{total}] bool tensor, got {lifted.dtype} "
                             f"{tuple(lifted.shape)}")  # fmt: skip
        num_lifted = torch.bincount(seq[lifted], minlength=num)
        if bool((num_lifted >= lengths).any()):
            raise ValueError("at most n - 1 of a sequence's n tokens can be lifted")
        lifted = lifted if bool(lifted.any()) else None

    # bottom-up: cut the current nodes of every sequence with more than one into windows
    items = torch.arange(total, device=device) if lifted is None else (~lifted).nonzero().view(-1)
    item_seq = seq if lifted is None else seq[items]
    count = lengths - num_lifted  # current nodes per sequence
    root = torch.empty(num, dtype=torch.long, device=device)
    height = torch.zeros(num, dtype=torch.long, device=device)
    records, next_id = [], total  # (children, their sequence, parents, slots) per level
    for level in itertools.count():
        if bool((count == 1).any()):  # a sequence down to one node: that node is its root
            done = count[item_seq] == 1
            root[item_seq[done]] = items[done]
            items, item_seq = items[~done], item_seq[~done]
        active = count > 1
        if not bool(active.any()):
            break
        live = count * active
        local = torch.arange(items.numel(), device=device) - (live.cumsum(0) - live)[item_seq]
        # window sizes per sequence; after the tuple, one root over what is left
        width = torch.full_like(count, branching[level]) if level < len(branching) else count
        width = width.clamp(min=1)
        window = local // width[item_seq]
        windows = torch.where(active, -(-count // width), 0)
        parents = next_id + (windows.cumsum(0) - windows)[item_seq] + window
        records.append((items, item_seq, parents, local - window * width[item_seq]))
        height += active
        items = next_id + torch.arange(int(windows.sum()), device=device)
        item_seq = torch.arange(num, device=device).repeat_interleave(windows)
        next_id, count = next_id + int(windows.sum()), windows

    # lifted tokens: one flat root family over all tokens, or leaves left of the top windows
    flat = (num_lifted > 0) & (height <= 1)
    if lifted is not None:
        new_roots = (flat & (height == 0)).nonzero().view(-1)  # the root was the only token
        root[new_roots] = next_id + torch.arange(new_roots.numel(), device=device)
        next_id += new_roots.numel()
    parent = torch.arange(next_id, device=device)
    node_seq = torch.empty(next_id, dtype=torch.long, device=device)
    slot, depth = torch.zeros_like(parent), torch.zeros_like(parent)
    node_seq[:total], node_seq[root] = seq, torch.arange(num, device=device)
    for children, child_seq, parents, slots in reversed(records):  # top-down
        parent[children], slot[children], node_seq[parents] = parents, slots, child_seq
        depth[children] = depth[parents] + 1
    parent[root], slot[root], depth[root] = root, 0, 0
    if lifted is not None:
        deep = (num_lifted > 0) & ~flat
        top = (parent == root[node_seq]) & (parent != torch.arange(next_id, device=device))
        top &= deep[node_seq]
        slot[top] += num_lifted[node_seq[top]]
        hub = lifted.nonzero().view(-1)
        rank = torch.arange(hub.numel(), device=device)
        rank -= (num_lifted.cumsum(0) - num_lifted)[seq[hub]]
        parent[hub], slot[hub], depth[hub] = root[seq[hub]], rank, 1
        tokens = flat[seq].nonzero().view(-1)
        position = tokens - (lengths.cumsum(0) - lengths)[seq[tokens]]
        parent[tokens], slot[tokens], depth[tokens] = root[seq[tokens]], position, 1

    return SignalHierarchy._assemble_grid1d(
        parent=parent, depth=depth, slot=slot, num_leaves=total, x=x
    )


def _input_device(*inputs) -> torch.device | None:
    """The device shared by the tensors among ``inputs`` (``None`` without any tensor)."""
    devices = {t.device for t in inputs if isinstance(t, Tensor)}
    if len(devices) > 1:
        raise ValueError(
            f"lengths, lifted and x must be on one device, got {sorted(map(str, devices))}"
        )
    return devices.pop() if devices else None


def random_window_hierarchy(
    n: int,
    branching: Sequence[int] = (16, 8, 4, 2),
    x: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> SignalHierarchy:
    """Like :func:`window_hierarchy`, but every window's size is drawn uniformly from
    ``[1, 2 b - 1]`` (mean ``b``): a ragged hierarchy with the same mean branching. (Its
    default ``branching`` starts with windows of 16 tokens, unlike
    :func:`window_hierarchy`'s.)

    A synthetic structure for tests and benchmarks.

    Args:
        n: number of tokens (leaves), ``n >= 1``.
        branching: bottom-up mean window sizes ``b``, each ``>= 2``.
        x: optional ``[n, F]`` token features.
        generator: optional :class:`torch.Generator` for the window sizes (default:
            PyTorch's global one).
    """
    n, branching = _check(n, branching)

    def sizes(level: int, count: int) -> Tensor:
        b = branching[level]
        draws = torch.randint(1, 2 * b, (count,), generator=generator)
        ends = torch.cumsum(draws, 0)
        k = int(torch.searchsorted(ends, torch.tensor(count))) + 1
        out = draws[:k].clone()
        out[-1] -= int(ends[k - 1]) - count
        return out

    return _hopping(n, len(branching), sizes, x)


class HMatrixLayout(NamedTuple):
    """Shape of the H-matrix hierarchy for a sequence of ``length`` tokens.

    Attributes:
        block_size: the effective :math:`N_r`. It equals the requested block
            size unless ``length <= 2 * block_size``, where it becomes
            ``ceil(length / 2)`` (one level: exact softmax attention).
        num_levels: :math:`M`, the number of levels ``0 .. M-1``.
        padded_length: :math:`L' = N_r 2^M \\ge` ``length``.
    """

    block_size: int
    num_levels: int
    padded_length: int


def hmatrix_layout(length: int, block_size: int) -> HMatrixLayout:
    """Padded length, number of levels and effective block size (see :class:`HMatrixLayout`).

    Computed by integer comparisons of ``length``: under ``torch.compile`` with a symbolic
    length they become guards (a length range per level count), so the padded layout of
    :func:`~hiergraph.ops.hmatrix_attention` keeps static sizes.

    Args:
        length: number of tokens, ``length >= 1``.
        block_size: the requested block size :math:`N_r`, an even int ``>= 2``.
    """
    check_int(length, "length")
    block_size = check_block_size(block_size)  # (0 never reached the length)
    if length <= 2 * block_size:
        nr = -(-length // 2)
        return HMatrixLayout(nr, 1, 2 * nr)
    num_levels = 2  # the fewest with block_size * 2**num_levels >= length
    while block_size << num_levels < length:
        num_levels += 1
    return HMatrixLayout(block_size, num_levels, block_size << num_levels)


def hmatrix_window_hierarchy(length: int, block_size: int) -> SignalHierarchy:
    r"""The coarsening levels of :func:`~hiergraph.ops.hmatrix_attention` as a window hierarchy.

    Binary hopping windows over the :math:`L'` padded tokens
    (:func:`~hiergraph.data.window_hierarchy` with branching ``(2,) * (M-1)``)
    plus one root: the nodes :math:`l` levels above the leaves (each covering
    :math:`2^l` tokens) are the level-:math:`l` coarse tokens, so
    :func:`~hiergraph.nn.coarsen_leaves` with ``reduce="mean"`` applied
    :math:`l` times turns token queries/keys into :math:`\tilde q^{(l)},
    \tilde k^{(l)}` (``"sum"``: values into :math:`\tilde v^{(l)}`). The same
    tree drives :func:`~hiergraph.ops.hierarchical_attention`, which ties and
    normalises its blocks differently (:mod:`hiergraph.ops.hmatrix`).

    Args:
        length: number of tokens, ``length >= 1``; the tree has :math:`L' \ge` ``length``
            leaves (:func:`hmatrix_layout`).
        block_size: the requested block size :math:`N_r`, an even int ``>= 2``.
    """
    check_block_size(block_size)
    _, num_levels, padded = hmatrix_layout(length, block_size)
    return window_hierarchy(padded, (2,) * (num_levels - 1))


def _check(n, branching) -> tuple[int, tuple[int, ...]]:
    """``n`` as an int (a NumPy integer or a one-integer tensor too; positive) and
    ``branching`` (:func:`check_branching`)."""
    n = as_int(n, "n")
    check_int(n, "n")
    return n, check_branching(branching)


def check_branching(branching) -> tuple[int, ...]:
    """``branching`` as a tuple of window sizes, each an int ``>= 2`` (NumPy's too; else
    ``ValueError``, ``TypeError`` for a single number or a size that is no int)."""
    if not isinstance(branching, Iterable) or isinstance(branching, str | bytes):
        raise TypeError(
            f"branching must be a sequence of window sizes, e.g. (2, 4), got {branching!r}"
        )
    branching = tuple(as_int(b, "each branching factor") for b in branching)  # (NumPy's too)
    if any(b < 2 for b in branching):
        raise ValueError(f"branching factors must be ints >= 2, got {branching}")
    return branching


def check_block_size(block_size) -> int:
    """``block_size`` as an H-matrix block size :math:`N_r`: an even int ``>= 2`` (NumPy's
    too; returned as a Python int), else ``TypeError`` / ``ValueError``."""
    if isinstance(block_size, bool) or not isinstance(block_size, Integral):
        raise TypeError(f"block_size must be an int, got {type(block_size).__name__}")
    if block_size < 2 or block_size % 2:
        raise ValueError(
            f"block_size must be an even int >= 2 (the overlap correction splits blocks "
            f"in halves), got {block_size}"
        )
    return int(block_size)


def _hopping(
    n: int, num_levels: int, sizes: Callable[[int, int], Tensor], x: Tensor | None
) -> SignalHierarchy:
    """Stack window levels bottom-up; ``sizes(level, count)`` cuts ``count`` nodes into windows."""
    parents, slots, counts = [], [], [n]
    level_size, offset = n, 0  # nodes of the current level are offset .. offset + level_size - 1
    for level in range(num_levels + 1):
        if level_size == 1:
            break
        widths = sizes(level, level_size) if level < num_levels else torch.tensor([level_size])
        window = torch.arange(widths.numel()).repeat_interleave(widths)
        parents.append(offset + level_size + window)
        slots.append(ramp(widths))
        offset, level_size = offset + level_size, widths.numel()
        counts.append(level_size)
    num_nodes = offset + 1
    parent = torch.cat([*parents, torch.tensor([num_nodes - 1])])
    slot = torch.cat([*slots, torch.tensor([0])])
    # level l (bottom-up, leaves = 0) sits at depth len(counts) - 1 - l
    depth = torch.arange(len(counts) - 1, -1, -1).repeat_interleave(torch.tensor(counts))
    return SignalHierarchy._assemble_grid1d(
        parent=parent, depth=depth, slot=slot, num_leaves=n, x=x
    )
