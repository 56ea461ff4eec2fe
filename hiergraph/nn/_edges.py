r"""How the message-passing layers take their edges, and the structure they derive from them.

:class:`EdgeInput` is the one edge-input handling of :class:`~hiergraph.nn.MaskedAttentionConv`
and :class:`~hiergraph.nn.ConeConv`: a sparse adjacency ``adj_t[target, source]`` becomes an
``edge_index`` in its stored order, and a :class:`GraphCache` holds what the layer derives
from the graph (that its ids are in range, a recognised band, the target-sorted CSR of the
edge kernels, an ``edge_index`` with self loops), so that a training loop over one graph
checks and derives it once.

The cache is keyed on the identity of the edge tensor (or of the adjacency it comes from),
the in-place versions of its index tensors (:func:`~hiergraph.ops.edge_index.edge_versions`)
and the node counts. Another tensor, a write into it (``edge_index[0, 3] = 5`` bumps its
version; a write through ``.data``, ``.numpy()`` or DLPack does not, and is not seen) or
other node counts derive the structure again. It holds a weak reference to that
tensor and the structure of that one graph only: the structure of a graph is dropped when
the layer sees another one, or when the graph's tensor is freed (unless the structure holds
that tensor itself, as an already sorted ``edge_index`` in the CSR does: then until the next
graph). Looking a graph up reads no tensor values (no host sync on an accelerator).

Nothing is cached for inference tensors (they keep no version counter), while
``torch.inference_mode`` is on (the structure would be inference tensors, unusable by a later
training step) or while ``torch.compile`` traces the layer: the ids are then checked on
every call. A copied or unpickled layer starts with an empty cache.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import torch
from torch import Tensor
from torch_geometric.typing import SparseTensor

from hiergraph.ops import edge_index as edge_ops
from hiergraph.ops.edge_index import adjacency_to_edge_index, edge_versions, is_adjacency

T = TypeVar("T")


def _caching() -> bool:
    """Whether derived structure may be stored now (see the module docstring)."""
    return not torch.is_inference_mode_enabled() and not torch.compiler.is_compiling()


class GraphStructures:
    """The structures derived from one graph, by name: built on first use, then reused.

    A stored tensor (or ``SparseTensor``) that was written in place since it was built (a
    layer may hand it to its caller, e.g. an ``edge_index`` with self loops returned with
    the attention weights) is built again.
    """

    def __init__(self, store: bool = True) -> None:
        self._store = store
        self._items: dict[str, tuple[Any, tuple[int, ...] | None]] = {}

    def get(self, name: str, build: Callable[[], T]) -> T:
        """The structure ``name`` of this graph: ``build()`` the first time, stored for
        the next calls on the same graph."""
        item = self._items.get(name)
        if item is not None and (item[1] is None or edge_versions(item[0]) == item[1]):
            return item[0]
        value = build()
        if self._store and _caching():
            guard = edge_versions(value)
            self._items[name] = (value, guard)
        return value

    def __len__(self) -> int:
        return len(self._items)


class GraphCache:
    """The :class:`GraphStructures` of the last graph a layer saw (see the module docstring).

    ``cache(source, num_src, num_dst)`` returns the structures of the graph whose edges are
    ``source`` (an ``edge_index``, or the sparse adjacency it was read from) over those node
    counts: the stored ones while the same unmodified ``source`` comes back with the same
    counts, else new, empty ones (which replace the stored ones).
    """

    def __init__(self) -> None:
        self.ref: weakref.ref | None = None
        self.key: tuple | None = None
        self.structures: GraphStructures | None = None

    def __call__(self, source, num_src: int, num_dst: int) -> GraphStructures:
        versions = edge_versions(source)
        if versions is None or not _caching():
            return GraphStructures(store=False)
        key = (*versions, num_src, num_dst)
        if self.ref is not None and self.ref() is source and self.key == key:
            return self.structures
        self.clear()
        try:
            ref = weakref.ref(source, _forget(self))
        except TypeError:  # an object without weak references: derived on every call
            return GraphStructures(store=False)
        self.ref, self.key, self.structures = ref, key, GraphStructures()
        return self.structures

    def clear(self) -> None:
        """Forget the stored graph and its structures."""
        self.ref, self.key, self.structures = None, None, None

    def __reduce__(self):
        return GraphCache, ()


def _forget(cache: GraphCache) -> Callable[[weakref.ref], None]:
    """The weak-reference callback that drops ``cache``'s structures when their graph dies
    (holding ``cache`` weakly: the graph never keeps a layer alive)."""
    cache_ref = weakref.ref(cache)

    def forget(dead: weakref.ref) -> None:
        cache = cache_ref()
        if cache is not None and cache.ref is dead:
            cache.clear()

    return forget


class Edges(NamedTuple):
    """A layer's edges, as :class:`EdgeInput` hands them over."""

    #: ``[2, E]`` ids (row 0 = source = key, row 1 = target = query), or the
    #: ``SparseTensor`` itself for a layer that keeps it
    edge_index: Tensor | SparseTensor
    #: the sparse adjacency the edges came from, or ``None`` for an ``edge_index``
    adjacency: Tensor | SparseTensor | None
    #: the adjacency's stored values ``[E, ...]`` in edge order, or ``None``
    values: Tensor | None
    #: the structures derived from this graph (cached per graph)
    structures: GraphStructures


class EdgeInput:
    """The edge input of a message-passing layer: ``edge_index`` or sparse adjacency in,
    checked ids and the per-graph structure cache out.

    Args:
        alternative: the other accepted inputs, named in the ``TypeError`` of a bad
            ``edge_index`` (e.g. ``"a sparse adjacency"``).
        keep_sparse_tensor: hand a ``SparseTensor`` over as it is (the layer passes it to
            PyG's ``propagate``; its ids are not checked), instead of as an ``edge_index``.
    """

    def __init__(self, alternative: str, keep_sparse_tensor: bool = False) -> None:
        self.alternative = alternative
        self.keep_sparse_tensor = keep_sparse_tensor
        self.cache = GraphCache()

    def __call__(
        self,
        edge_index: Tensor | SparseTensor,
        num_src: int,
        num_dst: int,
        *,
        validate: bool = True,
        device: torch.device | None = None,
    ) -> Edges:
        """Unpack and check ``edge_index`` for ``num_src`` sources and ``num_dst`` targets.

        An adjacency ``adj_t [num_dst, num_src]`` becomes its ``edge_index`` in stored order
        (:func:`~hiergraph.ops.edge_index.adjacency_to_edge_index`). The type, shape and
        ``device`` (the node features', if given) are checked every call, the id range
        (``validate``) once per graph, as one of its cached structures (a failed check is
        not remembered).
        """
        where = edge_index.device() if isinstance(edge_index, SparseTensor) else None
        where = edge_index.device if isinstance(edge_index, Tensor) else where
        if device is not None and where is not None and where != device:
            raise ValueError(
                f"the edges are on {where} but x is on {device}; move them with "
                "edge_index.to(x.device)"
            )
        adj = edge_index if is_adjacency(edge_index) else None
        values = None
        if adj is not None and not (self.keep_sparse_tensor and isinstance(adj, SparseTensor)):
            edge_index, values = adjacency_to_edge_index(adj, num_src, num_dst)
        checked = not isinstance(edge_index, SparseTensor)  # a kept one goes to PyG as it is
        if checked:
            edge_ops.check_edge_index(edge_index, num_src, num_dst, alternative=self.alternative,
                                      check_range=False)  # fmt: skip
        structures = self.cache(edge_index if adj is None else adj, num_src, num_dst)
        if checked and validate and edge_index.numel():
            check = edge_ops.check_edge_index
            structures.get("ids in range", lambda: check(edge_index, num_src, num_dst))
        return Edges(edge_index, adj, values, structures)

    def __reduce__(self):
        return EdgeInput, (self.alternative, self.keep_sparse_tensor)
