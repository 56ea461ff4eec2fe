"""Build a :class:`SignalHierarchy` from nested Python objects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from hiergraph._checks import as_int
from hiergraph.data.domain import Domain
from hiergraph.data.signal_hierarchy import SignalHierarchy, as_long


@dataclass
class Family:
    """An internal node whose children form a family on an explicit domain.

    Args:
        children: the child specs (ints, lists, dicts or further ``Family``).
        domain: the domain of the children (``'1d'``, ``'2d'``, ``'set'``,
            ``'kv'``, ``'graph'`` or a :class:`Domain`).
        pos: optional raw positions, one per child: ints (1-D grid, key ids,
            graph node ids) or ``(row, col)`` pairs (2-D grid). Default: the
            child index for ordered domains, 0 for sets.
        node_type: the type of this internal node (default 0).
    """

    children: Sequence[Any]
    domain: Domain | str | int = Domain.GRID1D
    pos: Sequence[Any] | None = None
    node_type: int = 0
    _domain: Domain = field(init=False, repr=False)

    def __post_init__(self):
        self._domain = Domain.parse(self.domain)
        if self.pos is not None and len(self.pos) != len(self.children):
            raise ValueError(
                f"Family has {len(self.children)} children but {len(self.pos)} positions"
            )


def from_nested(
    spec: Any,
    x: Tensor | None = None,
    *,
    leaf_type: Tensor | Sequence[int] | None = None,
    keys: Mapping[str, int] | None = None,
    default_domain: Domain | str = Domain.GRID1D,
) -> SignalHierarchy:
    """Build a signal hierarchy from a nested Python structure.

    * an ``int`` is a leaf: the row of ``x`` it carries;
    * a ``list``/``tuple`` is an internal node whose children lie on
      ``default_domain`` (a 1-D grid by default) at positions 0, 1, …;
    * a ``dict`` is a key–value family: its keys are key ids (ints), or
      strings looked up in ``keys``;
    * a :class:`Family` gives the domain and positions explicitly.

    Example::

        # document -> 2 sentences -> tokens; x holds 5 token vectors
        h = from_nested([[0, 1, 2], [3, 4]], x=torch.randn(5, 16))
        # token ids per sentence: the leaves are rows 0 .. 4, x the ids' embeddings
        doc = [[17, 4, 250], [9, 31]]
        ids = torch.tensor([t for sentence in doc for t in sentence])
        h = from_nested([[0, 1, 2], [3, 4]], x=torch.nn.Embedding(1000, 16)(ids))
        # a record with a 2-D image grid and a text field
        h = from_nested({"image": Family([0, 1, 2, 3], "2d", pos=[(0, 0), (0, 1), (1, 0), (1, 1)]),
                         "title": [4, 5]}, x=x, keys={"image": 0, "title": 1})

    Args:
        spec: the nested structure.
        x: ``[L, F]`` leaf features; every row must be used by exactly one leaf.
            If omitted, the leaf ints must be exactly ``0 .. L-1``.
        leaf_type: optional ``[L]`` node type of each leaf row (modality).
        keys: name → key id for string keys of dict families.
        default_domain: the domain of plain lists.

    Raises:
        ValueError: an empty family (an internal node with no leaves below
            it), a leaf index out of range or repeated, rows of ``x`` that no
            leaf uses, non-finite features, an unknown key, two keys of one dict
            with the same key id, a cyclic spec (a list, dict or ``Family`` inside
            itself).

    The walk is iterative: specs of any depth work (no recursion limit).
    """
    if isinstance(spec, Tensor):
        raise TypeError(
            "spec must be nested ints, lists, tuples, dicts or Family objects, got a tensor "
            "(pass spec.tolist())"
        )
    if x is not None and not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x is not None and x.dim() < 1:
        raise ValueError(f"x must be [L, F] leaf features, got shape {tuple(x.shape)}")
    builder = _Builder(Domain.parse(default_domain), keys)
    builder.visit(spec, parent=-1, slot=0, domain=Domain.NONE, pos=(0, 0), depth=0)
    num_leaves = len(builder.leaf_rows)
    rows = torch.tensor(builder.leaf_rows, dtype=torch.long)
    limit = x.size(0) if x is not None else num_leaves
    if int(rows.min()) < 0 or int(rows.max()) >= limit:
        bad = rows[(rows < 0) | (rows >= limit)]
        rows_of = (
            "rows of x" if x is not None else "leaves (without x, the leaf ints must be 0 .. L-1)"
        )
        raise ValueError(
            f"leaf index {int(bad[0])} is out of range for {limit} {rows_of}: a leaf int is "
            "the row of x that the leaf carries, not a token id"
        )
    counts = torch.bincount(rows, minlength=limit)
    if bool((counts > 1).any()):
        dup = (counts > 1).nonzero().view(-1)
        raise ValueError(f"leaf index {dup[:5].tolist()} is used by more than one leaf")
    if x is not None and num_leaves != x.size(0):
        unused = (counts == 0).nonzero().view(-1)
        raise ValueError(
            f"x has {x.size(0)} rows but the spec has {num_leaves} leaves; rows "
            f"{unused[:5].tolist()} are not used by any leaf"
        )

    # Node ids: leaf with row r -> r; internal nodes follow in visiting order.
    kinds = builder.nodes
    is_leaf = torch.tensor([k["row"] is not None for k in kinds])
    new_id = torch.empty(len(kinds), dtype=torch.long)
    new_id[is_leaf] = rows
    new_id[~is_leaf] = torch.arange(num_leaves, len(kinds))

    def column(key: str) -> Tensor:
        out = torch.empty(len(kinds), dtype=torch.long)
        out[new_id] = torch.tensor([k[key] for k in kinds], dtype=torch.long)
        return out

    old_parent = torch.tensor([k["parent"] for k in kinds], dtype=torch.long)
    parent = torch.empty(len(kinds), dtype=torch.long)
    parent[new_id] = torch.where(old_parent >= 0, new_id[old_parent.clamp(min=0)], new_id)
    pos = torch.empty(len(kinds), 2, dtype=torch.long)
    pos[new_id] = torch.tensor([k["pos"] for k in kinds], dtype=torch.long)
    node_type = column("node_type")
    if leaf_type is not None:
        leaf_type = as_long(leaf_type, "leaf_type")
        if leaf_type.shape != (num_leaves,):
            raise ValueError(
                f"leaf_type must have shape [{num_leaves}], got {tuple(leaf_type.shape)}"
            )
        node_type[:num_leaves] = leaf_type
    return SignalHierarchy._assemble(
        parent=parent,
        is_leaf=is_leaf[torch.argsort(new_id)],
        depth=column("depth"),
        slot=column("slot"),
        node_type=node_type,
        domain=column("domain"),
        pos=pos,
        x=x,
    )


class _Builder:
    """Depth-first walk that records one dict per node."""

    def __init__(self, default_domain: Domain, keys: Mapping[str, int] | None):
        self.default_domain = default_domain
        self.keys = keys
        self.nodes: list[dict] = []
        self.leaf_rows: list[int] = []

    def visit(self, spec, parent, slot, domain, pos, depth) -> None:
        """Record ``spec`` and everything below it, depth first in pre-order.

        Iterative (an explicit stack), so any depth works; a container that
        is its own ancestor (a self-referential spec) raises ``ValueError``.
        """
        stack = [(spec, parent, slot, domain, pos, depth)]
        top = depth
        # the containers from the top node to the current node's parent (held, so that
        # their ids stay unique while they are on the path)
        path: list[Any] = []
        on_path: set[int] = set()
        while stack:
            spec, parent, slot, domain, pos, depth = stack.pop()
            while len(path) > depth - top:  # leave the subtrees finished since
                on_path.discard(id(path.pop()))
            node = {
                "parent": parent,
                "slot": slot,
                "domain": int(domain),
                "pos": pos,
                "depth": depth,
            }
            node_id = len(self.nodes)
            self.nodes.append(node)
            if isinstance(spec, (bool, str, bytes)) or not isinstance(
                spec, (int, Sequence, Mapping, Family)
            ):
                if isinstance(spec, bool) or not hasattr(spec, "__index__"):
                    raise TypeError(
                        f"a nested spec holds ints (leaves), lists, dicts or Family objects; "
                        f"got {type(spec).__name__}"
                    )
                spec = as_int(spec, "a leaf (its feature row)")
            if isinstance(spec, int):
                node.update(row=spec, node_type=0)
                self.leaf_rows.append(spec)
                continue
            if id(spec) in on_path:
                ancestor = top + next(i for i, a in enumerate(path) if a is spec)
                raise ValueError(
                    f"the nested spec is cyclic: the {type(spec).__name__} at depth {depth} is "
                    f"the same object as its ancestor at depth {ancestor}; a hierarchy must be "
                    "a tree (build each level from new lists, dicts or Family objects)"
                )
            node_type = as_int(spec.node_type, "node_type") if isinstance(spec, Family) else 0
            node.update(row=None, node_type=node_type)
            children, child_domain, child_pos = self._family(spec)
            if len(children) == 0:
                raise ValueError(
                    f"an internal node at depth {depth} has no children, so no leaves below "
                    "it; remove the empty family"
                )
            if len(child_pos) != len(children):  # a Family changed after it was made
                raise ValueError(
                    f"an internal node at depth {depth} has {len(children)} children but "
                    f"{len(child_pos)} positions"
                )
            path.append(spec)
            on_path.add(id(spec))
            # pushed last child first, so that children are visited in order
            for i in range(len(children) - 1, -1, -1):
                stack.append((children[i], node_id, i, child_domain, child_pos[i], depth + 1))

    def _family(self, spec):
        if isinstance(spec, Family):
            children, domain = list(spec.children), spec._domain
            raw = spec.pos
        elif isinstance(spec, Mapping):
            children, domain = list(spec.values()), Domain.KEY_VALUE
            raw = [self._key_id(k) for k in spec]
            _check_distinct_keys(spec, raw)
        else:
            children, domain, raw = list(spec), self.default_domain, None
        if raw is None:
            raw = [0 if domain == Domain.SET else i for i in range(len(children))]
        return children, domain, [_pair(p) for p in raw]

    def _key_id(self, key) -> int:
        if isinstance(key, int) and not isinstance(key, bool):
            return key
        if self.keys is None or key not in self.keys:
            raise ValueError(
                f"unknown key {key!r} in a key-value family; pass keys={{name: id, ...}} "
                "(shared by all trees you batch together) or use int keys"
            )
        return as_int(self.keys[key], f"the id of key {key!r}")


def _check_distinct_keys(family: Mapping, ids: list[int]) -> None:
    """Raise if two keys of a dict family have one key id (the siblings could not be told
    apart: a key-value family's position is its key id)."""
    first: dict[int, Any] = {}
    for key, key_id in zip(family, ids, strict=True):
        if key_id in first:
            raise ValueError(
                f"keys {first[key_id]!r} and {key!r} of a key-value family both have key id "
                f"{key_id}; give each key its own id in keys="
            )
        first[key_id] = key


def _pair(p) -> tuple[int, int]:
    if isinstance(p, Sequence):
        if len(p) != 2:
            raise ValueError(f"a 2-D position must be a (row, col) pair, got {p!r}")
        return as_int(p[0], "a position"), as_int(p[1], "a position")
    return as_int(p, "a position"), 0
