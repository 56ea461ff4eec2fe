"""hiergraph: attention over hierarchical and relational structure for PyTorch Geometric."""

from hiergraph import data, nn, ops

__version__ = "0.1.0"

__all__ = ["data", "nn", "ops", "__version__"]
