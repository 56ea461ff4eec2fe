"""The structural check of a signal hierarchy: ``parent``, ``slot`` and ``is_leaf`` agree."""

from __future__ import annotations

import torch
from torch import Tensor

from hiergraph._checks import holds_integers
from hiergraph.plan.depth import node_depth
from hiergraph.plan.family_order import family_order

#: How many parent links of a cycle an error message spells out.
_CYCLE_HOPS = 8


def validate_structure(
    parent: Tensor, slot: Tensor, is_leaf: Tensor, *, distinct_slots: bool = True
) -> Tensor:
    r"""Raise unless ``parent``, ``slot`` and ``is_leaf`` describe a forest.

    The convention is the one of a built :class:`~hiergraph.data.SignalHierarchy`
    (or a batch of them): a root is its own parent. The checks, in order:

    * ``parent`` and ``slot`` are integer tensors, ``is_leaf`` a bool tensor,
      all of shape ``[N]`` and on one device;
    * every parent id lies in ``[0, N)``;
    * every node reaches a root by following ``parent`` (no cycles);
    * a node is marked in ``is_leaf`` exactly when it has no children;
    * slots are ``>= 0`` and (with ``distinct_slots``) distinct among the
      children of a node.

    The error names the first node (smallest id) that breaks a rule.

    The values are read on the CPU (tensors on an accelerator are copied to the
    host once). :meth:`SignalHierarchy.tree_index
    <hiergraph.data.SignalHierarchy.tree_index>` runs this check once, when it
    builds the cached plan, not on every forward pass.

    Args:
        parent: ``[N]`` integer parent id of every node (a root is its own parent).
        slot: ``[N]`` integer position of every node among its siblings.
        is_leaf: ``[N]`` bool, ``True`` for the nodes without children.
        distinct_slots: also check that siblings have distinct slots (default ``True``).

    Returns:
        ``[N]`` int64 depth of every node, on the CPU (the cycle check finds it:
        :func:`~hiergraph.plan.depth.node_depth`), for callers that need it too.

    Raises:
        TypeError: a wrong type or dtype.
        ValueError: a wrong shape, device mix, or an inconsistent structure.
    """
    for name, t in (("parent", parent), ("slot", slot), ("is_leaf", is_leaf)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("parent", parent), ("slot", slot)):
        if not holds_integers(t):
            raise TypeError(f"{name} must hold integer node ids/positions, got dtype {t.dtype}")
    if is_leaf.dtype != torch.bool:
        raise TypeError(f"is_leaf must be a bool tensor, got dtype {is_leaf.dtype}")
    if parent.dim() != 1:
        raise ValueError(f"parent must be a 1-D tensor [N], got shape {tuple(parent.shape)}")
    n = parent.numel()
    for name, t in (("slot", slot), ("is_leaf", is_leaf)):
        if t.shape != (n,):
            raise ValueError(
                f"{name} must have shape [{n}] (one entry per node, like parent), "
                f"got {tuple(t.shape)}"
            )
    if not parent.device == slot.device == is_leaf.device:
        raise ValueError(
            f"parent, slot and is_leaf must be on one device, got {parent.device}, "
            f"{slot.device} and {is_leaf.device}"
        )
    if n == 0:
        return torch.zeros(0, dtype=torch.long)

    parent = parent.detach().to("cpu", torch.long)
    slot = slot.detach().to("cpu", torch.long)
    is_leaf = is_leaf.detach().cpu()
    nodes = torch.arange(n, device="cpu")  # (not the default device)

    bad = (parent < 0) | (parent >= n)
    if bool(bad.any()):
        node = _first(bad)
        raise ValueError(
            f"parent ids must lie in [0, {n - 1}] (a root is its own parent): node {node} has "
            f"parent {int(parent[node])}"
        )

    is_root = parent == nodes
    depth, reaches = node_depth(parent)
    stuck = ~reaches
    if bool(stuck.any()):
        node = _first(stuck)
        raise ValueError(
            f"the parent links have a cycle: node {node} never reaches a root "
            f"({_chain(parent, node)})"
        )

    num_children = torch.bincount(parent[~is_root], minlength=n)
    bad = is_leaf & (num_children > 0)
    if bool(bad.any()):
        node = _first(bad)
        raise ValueError(
            f"node {node} is marked as a leaf (is_leaf) but has {int(num_children[node])} "
            f"children, e.g. node {_first((parent == node) & ~is_root)}"
        )
    bad = ~is_leaf & (num_children == 0)
    if bool(bad.any()):
        node = _first(bad)
        raise ValueError(
            f"node {node} is marked as internal (is_leaf is False) but has no children, so no "
            "leaves below it; mark it as a leaf or remove it"
        )

    bad = slot < 0
    if bool(bad.any()):
        node = _first(bad)
        raise ValueError(
            f"slots must be >= 0 (they order the children of a node): node {node} has slot "
            f"{int(slot[node])}"
        )
    child = nodes[~is_root]
    if distinct_slots and child.numel() > 1:
        child = child[family_order(parent[child], slot[child])]
        same = (parent[child[1:]] == parent[child[:-1]]) & (slot[child[1:]] == slot[child[:-1]])
        if bool(same.any()):
            pairs = torch.stack([child[:-1][same], child[1:][same]], 1)
            a, b = pairs[torch.argmin(pairs.min(1).values)].tolist()
            raise ValueError(
                f"nodes {a} and {b} share a slot ({int(slot[a])}) under parent "
                f"{int(parent[a])}; slots must be distinct among siblings"
            )
    return depth


def _first(mask: Tensor) -> int:
    return int(mask.nonzero()[0, 0])


def _chain(parent: Tensor, node: int) -> str:
    """``"a -> b -> ... -> a"``: the parent links from ``node`` until a node repeats."""
    seen, path = set(), [node]
    while node not in seen and len(path) <= _CYCLE_HOPS:
        seen.add(node)
        node = int(parent[node])
        path.append(node)
    return " -> ".join(map(str, path)) + ("" if node in seen else " -> ...")
