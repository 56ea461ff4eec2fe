"""Signal hierarchies as PyG data, and their builders."""

import torch

from hiergraph.data.document import (
    SimpleTokenizer,
    TokenizedDocument,
    Truncation,
    document_hierarchy,
    forest_from_lengths,
    hierarchy_from_lengths,
    tokenize_document,
    tokenize_documents,
)
from hiergraph.data.domain import Domain
from hiergraph.data.graph_pe import laplacian_pe
from hiergraph.data.multimodal import (
    ImageField,
    MultimodalSchema,
    SequenceField,
    VectorField,
    image_patches,
    multimodal_hierarchy,
)
from hiergraph.data.nested import Family, from_nested
from hiergraph.data.restructure import coarsen_hierarchy, flatten_hierarchy, lift_leaves
from hiergraph.data.signal_hierarchy import SignalHierarchy
from hiergraph.data.windows import (
    hmatrix_window_hierarchy,
    random_window_hierarchy,
    window_forest,
    window_hierarchy,
)
from hiergraph.plan.validation import validate_structure

__all__ = [
    "Domain",
    "Family",
    "ImageField",
    "MultimodalSchema",
    "SequenceField",
    "SignalHierarchy",
    "SimpleTokenizer",
    "TokenizedDocument",
    "Truncation",
    "VectorField",
    "coarsen_hierarchy",
    "document_hierarchy",
    "flatten_hierarchy",
    "forest_from_lengths",
    "from_nested",
    "hierarchy_from_lengths",
    "hmatrix_window_hierarchy",
    "lift_leaves",
    "image_patches",
    "laplacian_pe",
    "multimodal_hierarchy",
    "random_window_hierarchy",
    "tokenize_document",
    "tokenize_documents",
    "validate_structure",
    "window_forest",
    "window_hierarchy",
]

# ``torch.load(weights_only=True)``, PyTorch's default, reads saved hierarchies (as PyG
# allow-lists its own data classes); not their cached plans (see SignalHierarchy).
torch.serialization.add_safe_globals([SignalHierarchy])
