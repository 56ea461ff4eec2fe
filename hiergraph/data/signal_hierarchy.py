"""Signal hierarchies (trees of nested signals) as PyG ``Data`` objects."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from hiergraph._checks import described, holds_integers
from hiergraph._runs import rank_within
from hiergraph._versions import guard_holds, version_guard
from hiergraph.data.domain import Domain
from hiergraph.plan.causal_plan import CausalPlan
from hiergraph.plan.family_order import family_order
from hiergraph.plan.tree_index import TreeIndex, describe_non_hierarchy
from hiergraph.plan.validation import validate_structure


class SignalHierarchy(Data):
    r"""A signal hierarchy (Def. 2.2 of Amizadeh et al., *Hierarchical
    Self-Attention*): a tree whose leaves carry vectors and whose families of
    siblings live on a domain of their own.

    *Every* tree node, leaf or internal, is a graph node. Nodes are numbered
    **leaves first**: nodes ``0 .. num_leaves - 1`` are the leaves, and leaf
    ``i`` carries feature row ``x[i]`` (this is the *leaf order* used by all
    attention ops); internal nodes follow.

    Attributes (``N`` tree nodes, ``L`` leaves):

    * ``x`` — ``[L, F]`` leaf features (optional: structure-only hierarchies
      such as :func:`~hiergraph.data.window_hierarchy` have none).
    * ``edge_index`` — ``[2, N - 1]`` tree edges, child :math:`\to` parent,
      ordered by parent and then by child order.
    * ``parent`` — ``[N]`` parent of every node; a root is its own parent (so
      that PyG batching can shift it like any other index).
    * ``is_leaf`` — ``[N]`` bool; ``depth`` — ``[N]`` (roots have depth 0).
    * ``slot`` — ``[N]`` position of a node in its parent's child list (the
      child order; it defines "left" for causal attention).
    * ``node_type`` — ``[N]`` node/modality type (per-type input projections).
    * ``domain`` — ``[N]`` :class:`~hiergraph.data.Domain` of the family the
      node belongs to, i.e. of its parent (``Domain.NONE`` for roots).
    * ``pos`` — ``[N, 2]`` raw position of the node within that domain.

    Batching is plain PyG batching: ``Batch.from_data_list(trees)`` (or a
    :class:`~torch_geometric.loader.DataLoader`) concatenates trees into one
    forest. Roots have no family, so different trees never attend to each
    other: a batched attention result equals the per-tree results exactly.
    Forests (:func:`~hiergraph.data.window_forest`) batch with single trees
    alike: a hierarchy's :attr:`batch` (tree of every node) is derived from
    its structure, not stored.

    Build hierarchies with :meth:`from_parent`,
    :func:`~hiergraph.data.from_nested` or
    :func:`~hiergraph.data.window_hierarchy` rather than by hand; they
    validate the structure.

    Saving: PyG's ``InMemoryDataset.save``/``load`` keep a list of hierarchies, read back
    with ``torch.load(weights_only=True)`` (importing :mod:`hiergraph.data` allow-lists
    this class, as PyG does its own). A pickled hierarchy (a ``DataLoader`` worker's batch)
    carries its built :meth:`tree_index`, which such a read refuses: a plan is trusted
    without checks, so it is loaded only from a trusted file (``weights_only=False``).
    """

    def __inc__(self, key: str, value: Any, *args, **kwargs) -> Any:
        if key == "parent":
            return self.num_nodes
        return super().__inc__(key, value, *args, **kwargs)

    # ------------------------------------------------------------------ views
    @property
    def batch(self) -> Tensor | None:
        """``[N]`` tree id of every node, the trees numbered in leaf order (zeros for a single
        tree; ``None`` before the structure is set).

        Derived from the structure (:meth:`tree_index`), not stored, so that a PyG batch
        collates forests and single trees alike (``Batch.from_data_list``, a
        ``DataLoader``); the batch's own ``batch``, which PyG sets, numbers its elements. A
        ``batch`` that is set is returned as it is (pooling refuses one that numbers the
        trees otherwise: :func:`~hiergraph.data.restructure.tree_of_nodes`)."""
        if "batch" in self._store:
            return self._store["batch"]
        if "parent" not in self._store:
            return None
        from hiergraph.data.restructure import tree_of_nodes  # it reads this property

        return tree_of_nodes(self)

    @batch.setter
    def batch(self, value: Tensor | None) -> None:
        self._store.batch = value

    @property
    def num_leaves(self) -> int:
        """Number of leaves (summed over the trees of a batch)."""
        return int(self.is_leaf.sum())

    @property
    def num_trees(self) -> int:
        """Number of trees (roots) in this hierarchy or batch."""
        return int((self.parent == torch.arange(self.num_nodes, device=self.parent.device)).sum())

    def tree_index(self) -> TreeIndex:
        """The :class:`~hiergraph.plan.TreeIndex` of this hierarchy (cached), complete.

        It is the structural plan all attention ops share (level layout,
        families, their dense blocks); it is computed once and reused across layers
        and heads. The cache is invalidated if ``parent``, ``slot`` or ``is_leaf`` is
        modified in place or replaced. The ops themselves build the plan without the parts
        that only some paths read (:meth:`~hiergraph.plan.TreeIndex.complete`), which their
        path builds on first use; this method builds them too, so that a model compiled
        after it traces as one graph.

        Building the plan first checks the structure with
        :func:`~hiergraph.data.validate_structure` (integer ``parent`` and
        ``slot`` and bool ``is_leaf`` of one length, ``parent`` in range, no
        cycles, ``is_leaf`` true exactly for the nodes without children,
        non-negative slots) and that a stored ``depth`` follows ``parent``: a
        hand-built or edited hierarchy that breaks a rule raises a
        ``ValueError`` or ``TypeError`` naming the first node at fault. The
        check runs once per plan, not per forward pass, and is skipped for the
        unchanged output of this package's builders (consistent by
        construction; e.g. the tree that ``hubs`` rebuilds in every forward
        pass of :class:`~hiergraph.nn.HierarchicalSelfAttention`).
        """
        return self._lazy_tree_index().complete()

    def _lazy_tree_index(self) -> TreeIndex:
        """The cached :meth:`tree_index`, or a new one whose parts that only some paths read
        are left to be built on first use: what the ops read (``TreeIndex.of``)."""
        index = self._cached_tree_index()
        if index is None:
            if torch.compiler.is_compiling():
                raise RuntimeError(
                    "the plan of this hierarchy is built on the host and cannot be traced: "
                    "call hierarchy.tree_index() once before torch.compile traces the model"
                )
            depth = self._validate()
            index = TreeIndex.from_hierarchy(self, validate=False, depth=depth)
            self._cache_tree_index(index)
        return index

    def causal_plan(self) -> CausalPlan:
        """The :class:`~hiergraph.plan.CausalPlan` of this hierarchy, the structure of strictly
        causal HSA and of the hierarchical KV cache: a view of :meth:`tree_index`, built on
        first use and cached with it (so rebuilt only when ``parent``, ``slot`` or ``is_leaf``
        changes)."""
        return self.tree_index().causal_plan

    def _validate(self) -> Tensor | None:
        """The structure check that precedes building a plan (see :meth:`tree_index`): the
        nodes' depths it found, or ``None`` where the structure is a builder's, unchanged
        (not checked)."""
        missing = [key for key in ("parent", "slot", "is_leaf") if key not in self]
        if missing:
            raise ValueError(
                f"a SignalHierarchy needs parent, slot and is_leaf to plan attention; "
                f"missing: {', '.join(missing)} (build it with SignalHierarchy.from_parent "
                "or from_nested)"
            )
        if not self._built_unchanged():
            # sibling slots that tie are left to the plan's sort, as before
            depth = validate_structure(self.parent, self.slot, self.is_leaf, distinct_slots=False)
            if "depth" in self:
                _check_stored_depth(self.depth, depth)
            return depth
        return None

    def _cached_tree_index(self):
        """The cached tree index if ``parent``, ``slot`` and ``is_leaf`` are unchanged since it
        was built.

        The cache remembers the three tensors and their in-place versions: it goes
        stale when any is replaced or written in place.
        """
        cached = self.__dict__.get("_tree_index_cache")
        if cached is None:
            return None
        guard, index = cached
        return index if guard_holds(guard, self.parent, self.slot, self.is_leaf) else None

    def _structure(self) -> tuple | None:
        """The :func:`~hiergraph._versions.version_guard` of ``parent``, ``slot`` and
        ``is_leaf`` (``None`` for inference tensors: such a hierarchy is checked every time)."""
        return version_guard(self.parent, self.slot, self.is_leaf)

    def _built_unchanged(self) -> bool:
        """Whether ``parent``, ``slot`` and ``is_leaf`` are a builder's tensors, unwritten."""
        built = self.__dict__.get("_built_structure")
        return guard_holds(built, self.parent, self.slot, self.is_leaf)

    def _cache_tree_index(self, index) -> None:
        """Keep ``index`` until ``parent``, ``slot`` or ``is_leaf`` is replaced or written in
        place (not kept for inference tensors, whose writes cannot be followed)."""
        guard = self._structure()
        self.__dict__["_tree_index_cache"] = None if guard is None else (guard, index)

    def apply(self, func, *args: str):
        """PyG's :meth:`~torch_geometric.data.Data.apply`, keeping a built :meth:`tree_index`.

        ``to(device)``, ``cuda()``, ``pin_memory()`` and the like go through
        ``apply``: an index built before (say in a ``DataLoader`` worker, on the
        CPU) moves along with the structure tensors (``TreeIndex.to``) instead of
        being rebuilt from them, with host work, in the training loop; on the device
        it is on already, it stays as it is, with the parts it built on first use.
        """
        index = self._cached_tree_index()
        super().apply(func, *args)
        if index is not None:
            device = self.parent.device
            self._cache_tree_index(index if index.device == device else index.to(device))
        return self

    def to(self, device, *args: str, non_blocking: bool = False):
        """PyG's :meth:`~torch_geometric.data.Data.to`, keeping the builders' mark: a
        builder's structure moved to another device is still consistent by construction,
        so :meth:`tree_index` builds its plan there without re-checking it (a check on an
        accelerator reads values back to the host)."""
        built = self._built_unchanged()
        super().to(device, *args, non_blocking=non_blocking)
        if built:
            self.__dict__["_built_structure"] = self._structure()
        return self

    def __reduce_ex__(self, protocol):
        # A valid cached index is pickled with the batch (a DataLoader worker hands batches
        # over by pickling) and re-attached to the unpickled tensors in __setstate__.
        # The builders' mark is not pickled: an unpickled hierarchy without an index is checked.
        reduced = list(super().__reduce_ex__(protocol))
        state = reduced[2]
        if isinstance(state, dict) and {"_tree_index_cache", "_built_structure"} & state.keys():
            state = reduced[2] = dict(state)  # Data's state is its live __dict__
            state.pop("_built_structure", None)
            if "_tree_index_cache" in state:
                index = self._cached_tree_index()
                state["_tree_index_cache"] = None if index is None else ("pickled", index)
        return tuple(reduced)

    def __setstate__(self, mapping: dict[str, Any]) -> None:
        mapping = dict(mapping)
        mapping.pop("_built_structure", None)
        cached = mapping.pop("_tree_index_cache", None)
        super().__setstate__(mapping)
        if isinstance(cached, tuple) and len(cached) == 2 and cached[0] == "pickled":
            if isinstance(cached[1], TreeIndex):  # (anything else a file says is dropped)
                self._cache_tree_index(cached[1])

    # ---------------------------------------------------------- constructors
    @classmethod
    def from_parent(
        cls,
        parent: Tensor | list[int],
        *,
        x: Tensor | None = None,
        is_leaf: Tensor | None = None,
        slot: Tensor | None = None,
        node_type: Tensor | None = None,
        domain: Tensor | None = None,
        pos: Tensor | None = None,
    ) -> SignalHierarchy:
        r"""Build a single tree from a parent vector.

        Args:
            parent: ``[N]`` parent of every node, ``-1`` for the (single) root.
            x: ``[L, F]`` leaf features, one row per leaf. Leaves are taken in
                increasing node id: the leaf with the smallest id gets ``x[0]``.
            is_leaf: optional ``[N]`` bool. Leaves are the nodes without
                children; if given, it is checked against that (an internal
                node must have a leaf below it).
            slot: optional ``[N]`` child order within each family (default:
                increasing node id among siblings): distinct non-negative ints
                among siblings, gaps allowed (only their order matters).
            node_type, domain, pos: optional ``[N]``, ``[N]``, ``[N, 2]``
                per-node attributes (see the class docstring); default zeros,
                with ``domain`` defaulting to ``Domain.GRID1D`` for non-roots
                and ``pos`` to ``(slot, 0)``. Every ``domain`` value must be a
                :class:`~hiergraph.data.Domain` value; it is overwritten with
                ``Domain.NONE`` at the root.

        The nodes are renumbered leaves first (keeping the relative order of
        leaves and of internal nodes); every per-node argument is permuted
        accordingly.

        Raises:
            ValueError: on a cycle, zero or several roots, a parent id out of
                range, an ``is_leaf`` that contradicts the structure, a
                negative slot or two siblings sharing a slot, a ``domain``
                value that is not a :class:`~hiergraph.data.Domain`, or
                ``x`` rows that do not match the leaves / are not finite.
        """
        parent = as_long(parent, "parent")
        if parent.dim() != 1 or parent.numel() == 0:
            raise ValueError(
                f"parent must be a non-empty 1-D tensor, got shape {tuple(parent.shape)}"
            )
        n = parent.numel()
        bad = ((parent < -1) | (parent >= n)).nonzero().view(-1)
        if bad.numel():
            node = int(bad[0])
            raise ValueError(
                f"parent ids must lie in [-1, {n - 1}] (-1 marks the root): node {node} has "
                f"parent {int(parent[node])}"
            )
        roots = (parent == -1).nonzero().view(-1)
        if roots.numel() != 1:
            raise ValueError(
                f"a SignalHierarchy is one tree and needs exactly one root (parent == -1), "
                f"found {roots.numel()}; batch several trees with Batch.from_data_list"
            )
        nodes = torch.arange(n, device=parent.device)
        own = (parent == nodes).nonzero().view(-1)
        if own.numel():
            raise ValueError(
                f"the parent links have a cycle: node {int(own[0])} is its own parent "
                "(mark the root with -1)"
            )
        num_children = torch.bincount(parent[parent >= 0], minlength=n)
        leaf = num_children == 0
        if is_leaf is not None:
            is_leaf = torch.as_tensor(is_leaf, dtype=torch.bool, device=parent.device)
        if slot is None:
            slot = rank_within(parent + 1, n + 1)  # among siblings by node id (a root: 0)
        else:
            slot = as_long(slot, "slot")
        # cycles, is_leaf against the children, slots (the check tree_index() runs)
        depth = validate_structure(
            torch.where(parent >= 0, parent, nodes), slot, leaf if is_leaf is None else is_leaf
        ).to(parent.device)
        if domain is None:
            domain = torch.full((n,), int(Domain.GRID1D), dtype=torch.long, device=parent.device)
        domain = as_long(domain, "domain")
        _check_len(domain, n, "domain")
        valid = torch.tensor([int(d) for d in Domain], device=domain.device)
        bad = ~torch.isin(domain, valid)
        if bool(bad.any()):
            raise ValueError(
                f"domain values must be hiergraph.data.Domain members "
                f"({', '.join(f'{d.name}={int(d)}' for d in Domain)}), got "
                f"{domain[bad][:5].tolist()} at node(s) {bad.nonzero().view(-1)[:5].tolist()}"
            )
        domain = domain.masked_fill(parent == -1, int(Domain.NONE))
        if pos is None:
            pos = torch.stack([slot, torch.zeros_like(slot)], dim=1)
        pos = as_long(pos, "pos")
        if pos.shape != (n, 2):
            raise ValueError(f"pos must have shape [{n}, 2], got {tuple(pos.shape)}")
        node_type = (
            torch.zeros(n, dtype=torch.long, device=parent.device)
            if node_type is None
            else as_long(node_type, "node_type")
        )
        _check_len(node_type, n, "node_type")

        # Renumber leaves first: perm[new] = old.
        perm = torch.cat([leaf.nonzero().view(-1), (~leaf).nonzero().view(-1)])
        new_id = torch.empty_like(perm)
        new_id[perm] = nodes
        old_parent = parent[perm]
        new_parent = torch.where(old_parent >= 0, new_id[old_parent.clamp(min=0)], nodes)
        return cls._assemble(
            parent=new_parent,
            is_leaf=leaf[perm],
            depth=depth[perm],
            slot=slot[perm],
            node_type=node_type[perm],
            domain=domain[perm],
            pos=pos[perm],
            x=x,
        )

    @classmethod
    def _assemble_grid1d(cls, *, parent, depth, slot, num_leaves, x):
        """A forest whose families are all 1-D grids (positions ``(slot, 0)``), from
        leaves-first ``parent`` (a root is its own parent), ``depth`` and ``slot``."""
        n = parent.numel()
        is_leaf = torch.zeros(n, dtype=torch.bool, device=parent.device)
        is_leaf[:num_leaves] = True
        is_root = parent == torch.arange(n, device=parent.device)
        return cls._assemble(
            parent=parent,
            is_leaf=is_leaf,
            depth=depth,
            slot=slot,
            node_type=torch.zeros_like(parent),
            domain=torch.where(is_root, int(Domain.NONE), int(Domain.GRID1D)),
            pos=torch.stack([slot, torch.zeros_like(slot)], dim=1),
            x=x,
        )

    @classmethod
    def _assemble(cls, *, parent, is_leaf, depth, slot, node_type, domain, pos, x):
        """Create the object from leaves-first attributes and validate ``x`` and slots
        (``slot`` must be ``>= 0``; distinct among siblings is checked here)."""
        n = parent.numel()
        num_leaves = int(is_leaf.sum())
        if x is not None:
            if not isinstance(x, Tensor):
                raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
            if x.is_complex():  # (no layer takes them, and they skipped the finiteness check)
                raise TypeError(f"x must be real (floating-point or integer), got {x.dtype}")
            if x.dim() < 1:
                raise ValueError(
                    f"x must hold one feature row per leaf, [{num_leaves}, ...], got a 0-d tensor"
                )
            if x.size(0) != num_leaves:
                raise ValueError(
                    f"x has {x.size(0)} rows but the tree has {num_leaves} leaves; give exactly "
                    "one feature row per leaf"
                )
            if x.is_floating_point() and not torch.isfinite(x).all():
                rows = (~torch.isfinite(x.reshape(num_leaves, -1))).any(1).nonzero().view(-1)
                raise ValueError(f"x has non-finite values (NaN/Inf) in row(s) {rows[:5].tolist()}")
        nodes = torch.arange(n, device=parent.device)
        child = nodes[parent != nodes]
        child = child[family_order(parent[child], slot[child])]
        same_parent = parent[child[1:]] == parent[child[:-1]]
        if bool((same_parent & (slot[child[1:]] == slot[child[:-1]])).any()):
            raise ValueError("two children of the same parent share a slot; slots must be distinct")
        data = cls(
            x=x,
            edge_index=torch.stack([child, parent[child]]),
            parent=parent,
            is_leaf=is_leaf,
            depth=depth,
            slot=slot,
            node_type=node_type,
            domain=domain,
            pos=pos,
        )
        data.num_nodes = n
        # consistent by construction: tree_index() skips validate_structure while unchanged
        data.__dict__["_built_structure"] = data._structure()
        return data

    def __repr__(self) -> str:  # PyG's repr plus the tree summary
        base = super().__repr__()
        if "parent" not in self:
            return base
        return (
            f"{base[:-1]}, trees={self.num_trees}, leaves={self.num_leaves}, "
            f"max_depth={int(self.depth.max())})"
        )


def as_hierarchy(value: Any, name: str = "hierarchy") -> Any:
    """The signal hierarchy that ``value`` stands for, as the layers and pooling functions
    take it: a :class:`SignalHierarchy` or a PyG batch of them as it is, and a graph with a
    community tree (a :class:`~hiergraph.transforms.HierarchicalGraph` or a batch of them)
    as its tree, :meth:`~hiergraph.transforms.HierarchicalGraph.hierarchy` (cached by the
    graph: its plan is built once).

    Raises:
        TypeError: for anything else, e.g. a ``batch`` vector (the trees cannot be read
            from it) or a graph without a community tree.
    """
    if callable(getattr(value, "tree_index", None)):
        return value
    if callable(getattr(value, "hierarchy", None)) and "tree_parent" in value:
        return value.hierarchy()
    raise TypeError(
        f"{name} must be a SignalHierarchy, a batch of them, or a graph with its community "
        f"tree (GraphHierarchy), got {describe_non_hierarchy(value)}"
    )


def as_long(value: Any, name: str, device=None) -> Tensor:
    """``value`` as a LongTensor, refused unless it holds integers (not floats, complex
    numbers or bools); a tensor stays on its device, anything else goes to ``device``
    (default: PyTorch's default device)."""
    t = torch.as_tensor(value, device=value.device if isinstance(value, Tensor) else device)
    if t.numel() and not holds_integers(t):
        raise TypeError(f"{name} must hold integers, got dtype {t.dtype}")  # ([] reads as float)
    return t.long()


def _check_stored_depth(stored: Tensor, depth: Tensor) -> None:
    """Raise unless the stored ``depth`` is the one ``parent`` gives (``depth``, CPU): an
    edited ``parent`` leaves it stale, and what reads it (pooling, lifting, sibling edges)
    would work on another tree."""
    if not isinstance(stored, Tensor) or stored.shape != depth.shape:
        raise ValueError(
            f"depth must be a [{depth.numel()}] tensor (one per node), got {described(stored)}"
        )
    stale = stored.detach().cpu() != depth
    if bool(stale.any()):
        node = int(stale.nonzero()[0, 0])
        raise ValueError(
            f"depth does not follow parent: node {node} has depth {int(stored[node])} but "
            f"parent puts it at depth {int(depth[node])}; after editing parent, rebuild the "
            "hierarchy (SignalHierarchy.from_parent) or set depth to match"
        )


def _check_len(t: Tensor, n: int, name: str) -> None:
    if t.dim() != 1 or t.numel() != n:
        raise ValueError(f"{name} must have shape [{n}], got {tuple(t.shape)}")
