"""hiergraph: attention over hierarchical and relational structure for PyTorch Geometric."""

from hiergraph import data, datasets, loader, masks, nn, ops, runtime, transforms

__version__ = "0.1.0"

__all__ = [
    "data",
    "datasets",
    "loader",
    "masks",
    "nn",
    "ops",
    "runtime",
    "transforms",
    "__version__",
]
