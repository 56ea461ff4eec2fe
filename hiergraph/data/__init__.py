"""Signal hierarchies as PyG data, and their builders."""

from hiergraph.data.domain import Domain
from hiergraph.data.nested import Family, from_nested
from hiergraph.data.signal_hierarchy import SignalHierarchy
from hiergraph.data.windows import window_hierarchy

__all__ = ["Domain", "Family", "SignalHierarchy", "from_nested", "window_hierarchy"]
