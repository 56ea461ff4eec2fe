r"""A forest embedded in an equal-fanout forest: ragged batches on the reshaped-view path.

A batch of window hierarchies over sequences of different lengths, or of trees whose
families differ a little in size, has no equal fanout, so HSA would run it family block by
family block. Padding every family of depth :math:`d` to the largest, :math:`b_d`, and
lengthening what ends above the last level by chains of only children — a tree whose
leaves all sit at one shallower depth sinks as a whole (a chain below its root), any other
leaf above the last level gets a chain below it — embeds the forest in the equal-fanout
forest of shape ``(B, b_1, …, b_D)``; the added slots are padding leaves
(and empty nodes), which HSA's leaf mask removes from every statistic. Neither change
alters the result:

* an empty node has no leaves: it is no key, its count weight in its parent's energy and
  means is 0, and no output reads it;
* a node :math:`X` whose only child is :math:`C` has :math:`\rho(X) = \rho(C)` and
  :math:`n(X) = n(C)`, so it takes :math:`C`'s place in its family; :math:`C` has no
  sibling key (:math:`\mathrm{lse}(C) = -\infty`), so
  :math:`a(X) = \log(e^{a(C)} + 0) = a(C)` and its gate passes everything down,
  :math:`\mu(C) = 1` (or :math:`a = -\infty` and no mass, without self energies).

The leaves keep their order and every family its child order (padding goes after the last
child), so the sibling masking of ``leaky_causal`` keeps its meaning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hiergraph.plan._to_device import moved
from hiergraph.plan.costs import (
    ACCELERATOR_BLOCK_COST,
    ACCELERATOR_REFERENCE_WIDTH,
    BLOCK_COST,
    PADDING_COST,
    REFERENCE_WIDTH,
)

if TYPE_CHECKING:
    from hiergraph.plan.tree_index import TreeIndex

MAX_PADDING = 4.0
"""On the CPU, a forest that needs more padded leaf slots than this many per leaf does not
run on its embedding."""

ACCELERATOR_PADDING = 16.0
"""Off the CPU, a forest with up to this many padded leaf slots per leaf (and at most
:data:`ACCELERATOR_SLOTS` slots) runs on its embedding."""

ACCELERATOR_SLOTS = 1 << 20
"""Off the CPU, the most padded leaf slots of an embedding with more than
:data:`MAX_PADDING` per leaf. Eager HSA there is launch-bound at these sizes: the embedding
takes a fixed handful of operations per level, the block kernel about a hundred per family
block (32 trees of random windows, 256–512 tokens each, 7.6 padded slots per leaf: 2,359
operations per forward+backward on the block kernel, 450 on the embedding;
``benchmarks/dispatch_count.py``), so the embedding runs while its slots cost less than
the blocks (:data:`~hiergraph.plan.costs.ACCELERATOR_BLOCK_COST`)."""


@dataclass
class PaddedForest:
    """The embedding of a forest in the equal-fanout forest ``shape``.

    Attributes:
        shape: ``(B, b_1, …, b_D)`` of the equal-fanout forest (``B`` trees).
        leaf_slot: ``[L]`` the slot of every leaf (in leaf order) among the
            ``B b_1 ⋯ b_D`` padded leaves, breadth-first.
        node_source: per depth ``d = 1 … D``, ``[B b_1 ⋯ b_d]`` the breadth-first position
            (in the :class:`~hiergraph.plan.TreeIndex`) of the node each padded node stands
            for, ``-1`` for padding: the node itself, or on a chain the leaf at its end
            (its position embedding gives the leaf's self energy on the last level).
        real: ``[B b_1 ⋯ b_D]`` bool, the slot holds a leaf.
        blocks: the number of family blocks the block kernel would run.
        block_slots: what their slots would cost it, in gather slots
            (:attr:`~hiergraph.plan.family_block.FamilyBlock.slot_cost`).
        leaves_lead: every tree's leaves fill the first slots of its padded tree, in leaf
            order (all padding after them: window trees, short ones sunk). Then a strictly
            causal row never sees a padding slot, so the causal op needs no mask.
        sunk: some tree sinks (a chain of only children follows its root), so its root's
            children are not the nodes of depth 1 of the embedding.
    """

    shape: tuple[int, ...]
    leaf_slot: Tensor
    node_source: list[Tensor]
    real: Tensor
    blocks: int
    block_slots: float
    leaves_lead: bool
    sunk: bool

    @property
    def num_slots(self) -> int:
        """Padded leaves, ``B b_1 ⋯ b_D``."""
        return math.prod(self.shape)

    def runs_on(self, device: torch.device, extended: bool = True) -> bool:
        """Whether HSA on ``device`` may run on this embedding: with at most
        :data:`MAX_PADDING` slots per leaf, or, off the CPU and ``extended``, always (it is
        built within :data:`ACCELERATOR_PADDING` and :data:`ACCELERATOR_SLOTS`)."""
        modest = self.num_slots <= MAX_PADDING * self.leaf_slot.numel()
        return modest or (extended and device.type != "cpu")

    def pays_off(
        self,
        heads: int,
        channels: int,
        cost: float = PADDING_COST,
        device: torch.device | None = None,
    ) -> bool:
        r"""Whether HSA with ``heads`` heads of ``channels`` = :math:`d + d_v` channels is
        expected to run faster on the embedding than on the block kernel. Off the CPU
        (``device``), where the block kernel is launch-bound: while its slots cost less than
        :data:`~hiergraph.plan.costs.ACCELERATOR_BLOCK_COST` per block. On the CPU:
        ``cost`` per slot (:data:`~hiergraph.plan.costs.PADDING_COST`, or
        :data:`~hiergraph.plan.costs.KERNEL_PADDING_COST` where the compiled CPU kernel runs
        the embedding) against the block kernel's slots plus
        :data:`~hiergraph.plan.costs.BLOCK_COST` per block (at 4 heads of 64 + 64 channels;
        fewer slots' worth as the work per slot grows)."""
        width = heads * channels
        if device is not None and device.type != "cpu":
            block_cost = ACCELERATOR_BLOCK_COST * ACCELERATOR_REFERENCE_WIDTH / width
            return self.num_slots <= block_cost * self.blocks
        block_cost = BLOCK_COST * REFERENCE_WIDTH / width
        return cost * self.num_slots <= self.block_slots + block_cost * self.blocks

    @classmethod
    def from_tree_index(
        cls, index: TreeIndex, max_padding: float | None = None
    ) -> PaddedForest | None:
        """The embedding of ``index``'s forest, or ``None`` when it has a tree that is a
        single leaf, a depth whose families all have one member, or more padded slots than
        ``max_padding`` per leaf (by default: than any device runs it with,
        :data:`MAX_PADDING` per leaf, or :data:`ACCELERATOR_PADDING` per leaf up to
        :data:`ACCELERATOR_SLOTS` slots). Reads the plan's tensors on the host."""
        levels = index.levels
        if len(levels) < 2 or levels[0].leaf_local.numel():
            return None
        device, depth = index.device, len(levels) - 1
        trees = _trees(levels)
        sink = _sink(levels, trees, depth)
        # the widest family of every depth of the padded forest (a family of level d of
        # tree t sits at depth d + sink[t]; a family's tree is that of its first member)
        fanout = torch.ones(depth + 1, dtype=torch.long, device=device)
        for d in range(1, depth + 1):
            at = d + sink[trees[d][levels[d].family_start]]
            fanout.scatter_reduce_(0, at, levels[d].family_size, "amax")
        fanout = fanout[1:].tolist()
        shape = (levels[0].size, *fanout)
        slots, leaves = math.prod(shape), index.num_leaves
        if max_padding is None:
            accelerator = slots <= min(ACCELERATOR_PADDING * leaves, ACCELERATOR_SLOTS)
            fits = slots <= MAX_PADDING * leaves or accelerator
        else:
            fits = slots <= max_padding * leaves
        if min(fanout) < 2 or not fits:
            return None
        width = torch.tensor([1, *fanout], device=device)  # width[e]: fanout of depth e
        chain = torch.cumprod(width, 0)  # chain[o]: the slots a chain of o only children skips
        # the padded nodes of depths 1 .. D, one buffer: depth e starts at start[e]
        sizes = [math.prod(shape[: e + 1]) for e in range(1, depth + 1)]
        start = torch.tensor([0, 0, *sizes], device=device).cumsum(0)[:-1]
        sources = torch.full((sum(sizes),), -1, device=device)
        leaf_slot = torch.empty(index.num_leaves, dtype=torch.long, device=device)
        position = torch.arange(shape[0], device=device)  # padded position of level 0's nodes
        for d in range(1, depth + 1):
            level, offset = levels[d], sink[trees[d]]
            parent = level.parent_local
            child = torch.arange(level.size, device=device)
            child = child - torch.searchsorted(parent, parent)  # rank among its siblings
            above = position.index_select(0, parent)
            if d == 1:  # a sunk tree's root has a chain of only children before its children
                above = above * chain[offset]
            at = d + offset  # the padded depth of every node of the level
            position = above * width[at] + child
            bfs = level.start + torch.arange(level.size, device=device)
            sources[start[at] + position] = bfs
            leaf_at, leaf_bfs = position[level.leaf_local], bfs[level.leaf_local]
            leaf_depth = at[level.leaf_local]
            for below in range(2, depth + 1):  # chains of only children down to depth D
                deeper = leaf_depth < below
                leaf_at = torch.where(deeper, leaf_at * width[below], leaf_at)
                sources[start[below] + leaf_at[deeper]] = leaf_bfs[deeper]
            leaf_slot[level.leaf_id] = leaf_at
        real = torch.zeros(math.prod(shape), dtype=torch.bool, device=device)
        real.index_fill_(0, leaf_slot, True)
        blocks = [block for level in levels for block in level.blocks]
        block_slots = sum(block.slot_cost for block in blocks)
        node_source = list(sources.split(sizes))
        lead = _leaves_lead(leaf_slot, shape)
        sunk = bool((sink > 0).any())
        return cls(shape, leaf_slot, node_source, real, len(blocks), block_slots, lead, sunk)

    def to(self, device) -> PaddedForest:
        return moved(self, device)


def _trees(levels) -> list[Tensor]:
    """Per level, ``[n_d]`` the tree (root position) of every node."""
    tree = torch.arange(levels[0].size, device=levels[0].parent_local.device)
    out = [tree]
    for level in levels[1:]:
        tree = tree.index_select(0, level.parent_local)
        out.append(tree)
    return out


def _sink(levels, trees: list[Tensor], depth: int) -> Tensor:
    """``[B]`` how many levels each tree sinks below its root: ``depth - D_t`` for a tree
    whose leaves all sit at one depth ``D_t`` (a chain of only children then follows its
    root, and its leaves stay together at the last level), else 0 (its shallow leaves get
    chains below them). ``trees``: :func:`_trees`."""
    device = trees[0].device
    shallow = torch.full((levels[0].size,), depth + 1, device=device)
    deep = torch.zeros(levels[0].size, dtype=torch.long, device=device)
    for d, (level, tree) in enumerate(zip(levels, trees, strict=True)):
        at = tree[level.leaf_local]
        value = torch.full_like(at, d)
        shallow.scatter_reduce_(0, at, value, "amin")
        deep.scatter_reduce_(0, at, value, "amax")
    return torch.where(shallow == deep, depth - deep, 0)


def _leaves_lead(leaf_slot: Tensor, shape: tuple[int, ...]) -> bool:
    """Whether the leaves of every padded tree are its first slots, in leaf order."""
    per_tree = math.prod(shape[1:])
    tree, rank = leaf_slot // per_tree, leaf_slot % per_tree
    num_leaves = leaf_slot.numel()
    order = torch.argsort(tree * num_leaves + torch.arange(num_leaves, device=tree.device))
    grouped = tree[order]  # by tree, then in leaf order
    expected = torch.arange(num_leaves, device=tree.device) - torch.searchsorted(grouped, grouped)
    return bool((rank[order] == expected).all())
