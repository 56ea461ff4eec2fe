"""Structural plans of forests, built once from ``parent``/``slot`` and shared by every op.

:class:`TreeIndex` is the one structure derived from ``parent``: the breadth-first plan
of the bidirectional HSA ops (levels, families, their dense blocks, equal-fanout shapes, and
the embedding of a nearly equal forest in an equal-fanout one,
:class:`~hiergraph.plan.padded_forest.PaddedForest`). The dense blocks and the embedding,
which only some paths read, are built by the first that does
(:meth:`TreeIndex.complete` builds them at once).
:class:`CausalPlan` is a view of it (root paths, prefix counts and left siblings, read
off the index), the structure of strictly causal HSA and the hierarchical KV cache, built
on first use and cached on the index (:attr:`TreeIndex.causal_plan`);
:func:`family_order` is the one child order (by parent, then ``slot``).
A :class:`~hiergraph.data.SignalHierarchy` builds and caches the index
(:meth:`~hiergraph.data.SignalHierarchy.tree_index`), and with it the causal plan
(:meth:`~hiergraph.data.SignalHierarchy.causal_plan`). This package sits below
``hiergraph.data`` and ``hiergraph.ops`` and imports neither.
"""

from hiergraph.plan.causal_plan import CausalPlan
from hiergraph.plan.family_order import family_order
from hiergraph.plan.tree_index import TreeIndex

__all__ = ["CausalPlan", "TreeIndex", "family_order"]
