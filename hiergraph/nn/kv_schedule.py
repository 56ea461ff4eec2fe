r"""The ``(close, open)`` events that grow a signal hierarchy leaf by leaf in a KV cache.

A decoder appends tokens in leaf (depth-first) order. Before each token it says how many
open internal nodes it completes (``close``) and how many new ones it starts below the
innermost that remains (``open``): the arguments of
:meth:`~hiergraph.nn.HierarchicalKVCache.append`. :func:`append_schedule` reads these
events off a tree (``[L, 2]`` for ``L`` leaves), :func:`from_schedule` builds the tree back
from them, and :func:`check_one_tree` refuses what no cache decodes (a batch of trees, a
leaf that is its own root).
"""

from __future__ import annotations

import torch
from torch import Tensor

from hiergraph._checks import holds_integers
from hiergraph.data.signal_hierarchy import SignalHierarchy
from hiergraph.plan import CausalPlan


def append_schedule(hierarchy) -> Tensor:
    r"""The ``(close, open)`` arguments that grow ``hierarchy`` leaf by leaf in a cache.

    For leaves :math:`i-1, i` of depths :math:`m_{i-1}, m_i` whose lowest
    common ancestor has depth :math:`t`: ``close`` :math:`= m_{i-1}-1-t` open
    internal nodes are completed and ``open`` :math:`= m_i-1-t` new internal
    nodes are started (the first leaf opens :math:`m_0-1` nodes below the root).

    Args:
        hierarchy: one :class:`~hiergraph.data.SignalHierarchy` (leaves in
            depth-first order, every leaf below the root), or its
            :class:`~hiergraph.plan.CausalPlan`.

    Returns:
        ``[L, 2]`` long tensor of ``(close, open)`` per leaf.
    """
    plan = CausalPlan.of(hierarchy)
    check_one_tree(plan)
    depth, anc = plan.leaf_depth, plan.ancestors
    same = (anc[1:] == anc[:-1]) & (anc[1:] >= 0)
    lca = torch.cumprod(same.long(), 1).sum(1) - 1
    close = torch.cat([depth.new_zeros(1), depth[:-1] - 1 - lca])
    open_ = torch.cat([depth[:1] - 1, depth[1:] - 1 - lca])
    return torch.stack([close, open_], 1)


def from_schedule(schedule) -> SignalHierarchy:
    """The tree that a sequence of ``(close, open)`` appends builds (inverse of
    :func:`append_schedule`); leaves in append order.

    Args:
        schedule: ``[L, 2]`` integer tensor or list of ``(close, open)`` pairs, ``L >= 1``.
    """
    events = torch.as_tensor(schedule)
    if events.dim() != 2 or events.size(1) != 2 or not events.numel():
        raise ValueError(
            f"schedule must be [L, 2] (close, open) pairs, L >= 1, got shape {tuple(events.shape)}"
        )  # (a [] schedule made a tree of one leaf, 1-D ones failed to unpack)
    if not holds_integers(events):
        raise TypeError(f"schedule must hold integers, got {events.dtype}")
    parent, slot, num_children, stack = [-1], [0], [0], [0]
    for i, (close, open_) in enumerate(events.tolist()):
        if close < 0 or open_ < 0 or (i == 0 and close) or close > len(stack) - 1:
            raise ValueError(f"invalid (close, open) = ({close}, {open_}) at token {i}")
        if i:
            del stack[len(stack) - close :]
        for _ in range(open_ + 1):
            node = len(parent)
            parent.append(stack[-1])
            slot.append(num_children[stack[-1]])
            num_children[stack[-1]] += 1
            num_children.append(0)
            stack.append(node)
        stack.pop()  # the leaf is never open
    return SignalHierarchy.from_parent(torch.tensor(parent), slot=torch.tensor(slot))


def check_one_tree(plan: CausalPlan) -> None:
    """Raise a ``ValueError`` unless ``plan`` is one tree with every leaf below its root: what
    a cache decodes (:func:`append_schedule`,
    :meth:`~hiergraph.nn.HierarchicalKVCache.prefill`)."""
    if plan.num_leaves and int(plan.leaf_depth.min()) < 1:
        raise ValueError("a cache needs every leaf below a root; a one-leaf tree has none")
    if plan.num_leaves and bool((plan.ancestors[:, 0] != plan.ancestors[0, 0]).any()):
        raise ValueError("a cache decodes one tree; decode the trees of a batch separately")
