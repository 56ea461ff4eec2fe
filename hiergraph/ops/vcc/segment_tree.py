r"""Multi-resolution segment tree over batched sequences (VCC §3.3–3.4, Alg. 1, App. 6.3).

Zeng et al., *VCC: Scaling Transformers to 128K Tokens or More by Prioritizing
Important Tokens* (App. 6.2–6.3). The tree stores a sequence :math:`C` of
:math:`n_c` token rows at several resolutions. Level :math:`0` holds the
tokens; level :math:`\ell \ge 1` holds segments of
:math:`s_\ell = \prod_{j \le \ell} k_j` consecutive tokens (the last segment of a
sequence may be shorter); the top level holds one root per sequence (the
*remainder root*, as in :func:`~hiergraph.data.window_hierarchy`, whose tree has
the same shape). Segment means are

.. math::
    c^{s}_{x} = \frac{1}{|x|}\sum_{i \in x} C_i, \qquad
    c^{\text{parent}} = \frac{\sum_{x \in \text{chd}} |x|\, c_x}{\sum_{x \in \text{chd}} |x|}

(eq. 13/14, with the true segment sizes :math:`|x|` so that short last segments
are exact). The *state* :math:`\mathcal{T}(C)` stores the root means and, for
every other node, :math:`\Delta c_x = c_{\text{parent}(x)} - c_x` (eq. 15).

Everything is flat, PyG style: the tokens of ``B`` sequences are concatenated
(``[N, d]``) and ``ptr`` (``[B + 1]``) marks where each sequence starts; the
nodes of a level are stored sequence by sequence in token order, so children of
one parent are contiguous and bottom-up means are one :func:`segment` call per
level.

* :class:`SegmentTree` — the structure (indices only; reusable across layers).
* :class:`TreeState` — the stored means/deviations, with :func:`build_tree_state`
  and :func:`materialize`.
* :func:`select_segments` — Algorithm 1: VIP-priority refinement from the root
  down with per-level budgets; returns the partition :math:`\mathcal{J}`
  (:class:`Selection`) and its rows :math:`S_c C`.
* :func:`update_tree` — Algorithm 2: write new :math:`\mathcal{J}` rows and
  refresh only their ancestors; deviations below a :math:`\mathcal{J}` leaf are
  untouched, so every token of an unrefined segment receives the same update
  (Claim 6.4).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.utils import segment

from hiergraph._precision import accumulation_dtype
from hiergraph._runs import ramp, run_ptr
from hiergraph.data.windows import check_branching
from hiergraph.ops.rows import take_rows
from hiergraph.ops.runs import broadcast_runs
from hiergraph.ops.topk import top_k_per_group

ScoreFn = Callable[[Tensor, Tensor, Tensor], Tensor]
"""``score_fn(means [M, d], batch [M], count [M]) -> [M]``: larger = refine first."""


def expand_to_children(values: Tensor, ptr: Tensor) -> Tensor:
    r"""Broadcast parent rows ``values`` ``[M, d]`` to their contiguous children,
    ``[ptr[-1], d]``: :func:`~hiergraph.ops.runs.broadcast_runs` (the adjoint of a
    segment sum)."""
    return broadcast_runs(values, ptr.diff())


@dataclass(frozen=True)
class SegmentTree:
    r"""Structure of the segment trees of ``B`` sequences (indices only).

    Level ``l`` (``0 .. num_levels``) has ``M_l`` nodes; node lists are
    sequence-major and in token order. ``num_levels = len(branching) + 1``:
    the top level holds one root per non-empty sequence.

    Attributes:
        branching: window sizes :math:`k_1, \dots, k_m` (bottom-up), each ``>= 2``.
        ptr: ``[B + 1]`` token pointer.
        batch: per level, ``[M_l]`` sequence of each node.
        start: per level, ``[M_l]`` flat index of the first token of each node.
        count: per level, ``[M_l]`` number of tokens below each node (:math:`s`).
        parent: per level ``l < num_levels``, ``[M_l]`` parent index in level ``l + 1``.
        child_ptr: per level ``l >= 1``, ``[M_l + 1]`` CSR pointer of the
            children in level ``l - 1`` (index 0 holds an empty placeholder).
    """

    branching: tuple[int, ...]
    ptr: Tensor
    batch: tuple[Tensor, ...]
    start: tuple[Tensor, ...]
    count: tuple[Tensor, ...]
    parent: tuple[Tensor, ...]
    child_ptr: tuple[Tensor, ...]

    @property
    def num_levels(self) -> int:
        """Index of the root level (the number of levels above the tokens)."""
        return len(self.branching) + 1

    @property
    def num_sequences(self) -> int:
        return self.ptr.numel() - 1

    @property
    def num_tokens(self) -> int:
        return int(self.ptr[-1])

    @classmethod
    def from_ptr(cls, ptr: Tensor, branching: Sequence[int]) -> SegmentTree:
        """Build the tree of every sequence ``ptr[b] .. ptr[b + 1] - 1``.

        Args:
            ptr: ``[B + 1]`` non-decreasing int64 pointer starting at 0
                (sequences may be empty).
            branching: bottom-up window sizes; ``(k,)`` gives the two-resolution
                tree of the paper's experiments (tokens, ``k``-blocks, root);
                ``(k,) * m`` gives a ``k``-ary tree of height ``m + 1``.
        """
        branching = check_branching(branching)
        if not isinstance(ptr, Tensor) or ptr.dim() != 1 or ptr.numel() < 1:
            raise ValueError("ptr must be a 1-D tensor [B + 1] of sequence boundaries")
        if ptr.dtype != torch.long or int(ptr[0]) != 0 or bool((ptr.diff() < 0).any()):
            raise ValueError("ptr must be int64, start at 0 and be non-decreasing")
        device = ptr.device
        lengths = ptr.diff()
        seq = torch.arange(lengths.numel(), device=device)
        level_ptr, batch, start, count, local = [], [], [], [], []
        size = 1
        for level in range(len(branching) + 2):
            if level > len(branching):  # remainder root: one node per non-empty sequence
                per_seq = (lengths > 0).long()
            else:
                size = size * (branching[level - 1] if level > 0 else 1)
                per_seq = torch.div(lengths + size - 1, size, rounding_mode="floor")
            lp = run_ptr(per_seq)
            b = seq.repeat_interleave(per_seq)
            x = torch.arange(b.numel(), device=device) - lp[b]
            seg = size if level <= len(branching) else 0
            first = ptr[b] + x * seg
            level_ptr.append(lp)
            batch.append(b)
            start.append(first)
            count.append(
                torch.minimum(ptr[b + 1] - first, torch.full_like(first, seg))
                if seg
                else lengths[b]
            )
            local.append(x)
        parent, child_ptr = [], [torch.zeros(1, dtype=torch.long, device=device)]
        for level in range(len(branching) + 1):
            b, x = batch[level], local[level]
            up = branching[level] if level < len(branching) else None
            parent.append(
                level_ptr[level + 1][b] + (torch.div(x, up, rounding_mode="floor") if up else 0)
            )
            children = torch.bincount(parent[-1], minlength=batch[level + 1].numel())
            child_ptr.append(run_ptr(children))
        return cls(branching, ptr, *map(tuple, (batch, start, count, parent, child_ptr)))


class TreeState(tuple):
    r"""The stored tree :math:`\mathcal{T}(C)`: ``(root, delta)``.

    * ``root`` — ``[M_L, d]`` root means :math:`c^{n_c}_1` (one per non-empty sequence).
    * ``delta`` — tuple over levels ``0 .. L - 1`` of ``[M_l, d]``
      deviations :math:`\Delta c_x = c_{\text{parent}(x)} - c_x` (eq. 15).
    """

    __slots__ = ()

    def __new__(cls, root: Tensor, delta: Sequence[Tensor]):
        return super().__new__(cls, (root, tuple(delta)))

    @property
    def root(self) -> Tensor:
        return self[0]

    @property
    def delta(self) -> tuple[Tensor, ...]:
        return self[1]


def build_tree_state(x: Tensor, tree: SegmentTree) -> TreeState:
    r"""Bottom-up segment means (eq. 64) and deviations (eq. 15) of the tokens ``x``.

    One :func:`torch_geometric.utils.segment` sum per level; sums are
    accumulated in float32 for half-precision inputs. Cost :math:`O(n_c d)`.

    Args:
        x: ``[N, d]`` token rows, ``N = tree.num_tokens``.
    """
    if x.dim() != 2 or x.size(0) != tree.num_tokens:
        raise ValueError(
            f"x must be [{tree.num_tokens}, d] (the tree's tokens), got {tuple(x.shape)}"
        )
    acc = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    sums, means = acc, [x]
    for level in range(1, tree.num_levels + 1):
        sums = segment(sums, tree.child_ptr[level])
        means.append((sums / tree.count[level].unsqueeze(1).to(sums.dtype)).to(x.dtype))
    delta = [
        expand_to_children(means[lvl + 1], tree.child_ptr[lvl + 1]) - means[lvl]
        for lvl in range(tree.num_levels)
    ]
    return TreeState(means[-1], delta)


def materialize(state: TreeState, tree: SegmentTree) -> Tensor:
    r"""Top-down reconstruction :math:`c_x = c_{\text{parent}(x)} - \Delta c_x` of all
    tokens (eq. 66), ``[N, d]``. Cost :math:`O(n_c d)`."""
    means = state.root
    for level in range(tree.num_levels - 1, -1, -1):
        means = expand_to_children(means, tree.child_ptr[level + 1]) - state.delta[level]
    return means


@dataclass(frozen=True)
class Selection:
    r"""A partition :math:`\mathcal{J}` of every sequence into tree segments (rows of :math:`S_c`).

    Rows are sorted by their first token, so they are sequence-major and in token order.

    Attributes:
        level, node: ``[R]`` tree level and node index of each row.
        batch, start, count: ``[R]`` sequence, first flat token and size :math:`s` of each row.
        ptr: ``[B + 1]`` row pointer per sequence.
        split: per level, the indices of the nodes refined (popped) by Algorithm 1.
        value: ``[R, d]`` the rows :math:`S_c C` (segment means), differentiable.
        num_tokens: :math:`N`, the tokens the rows partition (the tree's).
    """

    level: Tensor
    node: Tensor
    batch: Tensor
    start: Tensor
    count: Tensor
    ptr: Tensor
    split: tuple[Tensor, ...]
    value: Tensor
    num_tokens: int

    @property
    def token_ptr(self) -> Tensor:
        """``[R + 1]`` CSR pointer of the tokens of each row (for :func:`segment`)."""
        return run_ptr(self.count)

    @property
    def token_to_row(self) -> Tensor:
        """``[N]`` row of :math:`\\mathcal{J}` containing each token: the one nonzero of
        each row of :math:`S_c^\\dagger` (Claim 6.3)."""
        rows = torch.arange(self.count.numel(), device=self.count.device)
        return rows.repeat_interleave(self.count, output_size=int(self.count.sum()))


def check_budgets(
    budgets: Sequence[int | None], num_levels: int, has_score: bool
) -> tuple[int | None, ...]:
    """Validate Algorithm 1's per-level ``budgets`` (``num_levels`` entries, root first, each an
    int ``>= 0`` or ``None``); a budget that selects needs a score function."""
    budgets = tuple(budgets)
    if len(budgets) != num_levels:
        raise ValueError(
            f"budgets needs {num_levels} entries (levels {num_levels}..1, root first), "
            f"got {len(budgets)}"
        )
    for h in budgets:
        if h is not None and (isinstance(h, bool) or not isinstance(h, int) or h < 0):
            raise ValueError(f"each budget must be an int >= 0 or None (refine all), got {h!r}")
    if not has_score and any(h not in (None, 0) for h in budgets):
        raise ValueError("score_fn is required when a budget selects some segments")
    return budgets


def check_scores(score, shape: tuple[int, ...], spelled: str) -> None:
    """Raise unless ``score_fn`` returned a tensor of ``shape``, one score per candidate
    (``spelled``: the shape in words), rather than one that broadcasts against them."""
    if not isinstance(score, Tensor) or score.shape != shape:
        got = tuple(score.shape) if isinstance(score, Tensor) else type(score).__name__
        raise ValueError(
            f"score_fn must return one score per candidate segment, {spelled} = "
            f"{tuple(shape)}, got {got}"
        )


def select_segments(
    state: TreeState,
    tree: SegmentTree,
    budgets: Sequence[int | None],
    score_fn: ScoreFn | None = None,
) -> Selection:
    r"""Algorithm 1: build :math:`\mathcal{J}` from the root down by VIP priority.

    Starting from :math:`\mathcal{J} = \{\text{roots}\}`, at each level
    :math:`\ell = L, \dots, 1` the ``budgets`` entry for that level gives how many
    of the level-:math:`\ell` segments in :math:`\mathcal{J}` each sequence
    refines (pops and replaces by its children): the ones with the largest
    ``score_fn`` (the VIP attention mass :math:`\mu^s_x`, eq. 53), or all of them
    for ``None``. Child means are retrieved from the state on the way down,
    :math:`c_{\text{child}} = c_{\text{parent}} - \Delta c_{\text{child}}` (eq. 63),
    so the rows :math:`S_c C` come for free. Scores are computed without
    gradient (the selection is discrete); ``value`` keeps its gradient.

    With ``branching = (k,)`` and ``budgets = (None, h)`` this is the
    two-resolution scheme of the experiments: every sequence keeps
    :math:`n_c/k - h` block means and :math:`h k` exact tokens.

    Args:
        state, tree: the stored tree.
        budgets: ``tree.num_levels`` entries for levels ``L, L - 1, ..., 1`` (root first),
            each an int ``>= 0`` (per sequence) or ``None`` (refine all).
        score_fn: ``(means [M, d], batch [M], count [M]) -> [M]``; required
            unless every budget is ``None`` or ``0``.
    """
    budgets = check_budgets(budgets, tree.num_levels, score_fn is not None)
    device = tree.ptr.device
    node = torch.arange(tree.batch[-1].numel(), device=device)
    mean = state.root
    parts, splits = [], []
    for level, h in zip(range(tree.num_levels, 0, -1), budgets, strict=True):
        batch = tree.batch[level][node]
        if h is None:
            chosen = torch.ones_like(node, dtype=torch.bool)
        elif h == 0:
            chosen = torch.zeros_like(node, dtype=torch.bool)
        else:
            with torch.no_grad():
                score = score_fn(mean.detach(), batch, tree.count[level][node])
            check_scores(score, node.shape, "[M]")
            chosen = top_k_per_group(score, batch, h)
        keep, chosen = (~chosen).nonzero().squeeze(1), chosen.nonzero().squeeze(1)
        parts.append((level, node[keep], take_rows(mean, keep)))
        split = node[chosen]
        splits.append(split)
        first, last = tree.child_ptr[level][split], tree.child_ptr[level][split + 1]
        sizes = last - first
        node = ramp(sizes, first)
        mean = expand_to_children(take_rows(mean, chosen), run_ptr(sizes))
        mean = mean - take_rows(state.delta[level - 1], node)
    parts.append((0, node, mean))

    level = torch.cat([torch.full_like(n, lvl) for lvl, n, _ in parts])
    nodes = torch.cat([n for _, n, _ in parts])
    start = torch.cat([tree.start[lvl][n] for lvl, n, _ in parts])
    order = torch.argsort(start)
    level, nodes, start = level[order], nodes[order], start[order]
    count = torch.cat([tree.count[lvl][n] for lvl, n, _ in parts])[order]
    batch = torch.cat([tree.batch[lvl][n] for lvl, n, _ in parts])[order]
    rows = torch.bincount(batch, minlength=tree.num_sequences)
    return Selection(
        level=level,
        node=nodes,
        batch=batch,
        start=start,
        count=count,
        ptr=run_ptr(rows),
        split=tuple(reversed(splits)),  # split[l - 1] = refined nodes of level l
        value=take_rows(torch.cat([m for _, _, m in parts]), order),
        num_tokens=tree.batch[0].numel(),  # level 0 holds the tokens (no device read)
    )


def update_tree(state: TreeState, tree: SegmentTree, sel: Selection, value: Tensor) -> TreeState:
    r"""Algorithm 2: store new :math:`\mathcal{J}` rows ``value`` (``[R, d]``, e.g.
    :math:`S_c C_{\text{new}}`) and refresh their ancestors, bottom-up.

    At each level, the nodes with a new mean are the :math:`\mathcal{J}` rows of
    that level and the refined nodes recomputed from the level below; a refined
    node's new mean is the size-weighted mean of its children (eq. 14, one
    :func:`segment` sum per level), and every touched node gets
    :math:`\Delta c_x = c_{\text{parent}} - c_x`. Deviations below a
    :math:`\mathcal{J}` leaf are left as they are, so materialising adds the
    same vector to every token of an unrefined segment (Claim 6.4). Touches
    :math:`O(r)` nodes; out-of-place, so it is differentiable. The weighted means are
    taken in ``value``'s dtype, or in float32 (then rounded) for bf16/fp16 ``value``.

    Args:
        state: the stored tree that ``sel`` was selected from.
        tree: its :class:`SegmentTree`.
        sel: the partition :math:`\mathcal{J}` from :func:`select_segments`.
        value: ``[R, d]`` new rows, one per row of ``sel`` and of ``sel.value``'s shape.

    Returns:
        The updated :class:`TreeState`; ``state`` is left as it is.
    """
    if value.shape != sel.value.shape:
        raise ValueError(
            f"value must have the selection's shape {tuple(sel.value.shape)}, "
            f"got {tuple(value.shape)}"
        )
    leaf = (sel.level == 0).nonzero().squeeze(1)
    nodes, vals = sel.node[leaf], take_rows(value, leaf)
    # size-weighted means of half rows: counts and sums in float32, means rounded once
    work = accumulation_dtype(value.dtype)
    delta = list(state.delta)
    for level in range(tree.num_levels):
        # the touched nodes are exactly the children of the refined nodes one level up:
        # sorted, they form contiguous runs, one per refined parent
        split = sel.split[level]
        first = tree.child_ptr[level + 1][split]
        sizes = tree.child_ptr[level + 1][split + 1] - first
        order = torch.argsort(nodes)
        nodes, vals = nodes[order], take_rows(vals, order)
        count = tree.count[level].index_select(0, nodes).unsqueeze(1).to(work)
        ptr = run_ptr(sizes)
        parent_vals = segment(vals.to(work) * count, ptr)
        parent_vals = parent_vals / tree.count[level + 1][split].unsqueeze(1).to(work)
        parent_vals = parent_vals.to(vals.dtype)
        expanded = expand_to_children(parent_vals, ptr)
        delta[level] = delta[level].index_copy(0, nodes, expanded - vals)
        leaf = (sel.level == level + 1).nonzero().squeeze(1)
        nodes = torch.cat([sel.node[leaf], split])
        vals = torch.cat([take_rows(value, leaf), parent_vals])
    root = state.root.index_copy(0, nodes, vals)
    return TreeState(root, delta)


def two_resolution_budgets(h: int) -> tuple[None, int]:
    """Budgets of the two-resolution scheme (``branching = (k,)``): all blocks, ``h`` refined."""
    return (None, h)


def full_tree_branching(max_length: int, k: int) -> tuple[int, ...]:
    """``(k,) * m`` with the smallest ``m`` such that the top window level has one node
    for sequences of up to ``max_length`` tokens (a ``k``-ary tree, Alg. 1's setting)."""
    m = max(1, math.ceil(math.log(max(max_length, 2)) / math.log(k) - 1e-9))
    return (k,) * m
