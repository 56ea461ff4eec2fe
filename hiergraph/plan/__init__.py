"""Structural plans of forests, built once from ``parent``/``slot`` and shared by every op.

:class:`TreeIndex` is the breadth-first plan of the bidirectional HSA ops (levels,
families, size buckets, equal-fanout shapes); :class:`CausalPlan` holds the root paths
and prefix counts of strictly causal HSA and the hierarchical KV cache;
:func:`family_order` is the one child order (by parent, then ``slot``) they all use.
A :class:`~hiergraph.data.SignalHierarchy` builds and caches both
(:meth:`~hiergraph.data.SignalHierarchy.tree_index`,
:meth:`~hiergraph.data.SignalHierarchy.causal_plan`). This package sits below
``hiergraph.data`` and ``hiergraph.ops`` and imports neither.
"""

from hiergraph.plan.causal_plan import CausalPlan
from hiergraph.plan.family_order import family_order
from hiergraph.plan.tree_index import TreeIndex

__all__ = ["CausalPlan", "TreeIndex", "family_order"]
