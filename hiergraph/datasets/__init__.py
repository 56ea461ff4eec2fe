"""Dataset loaders: offline wrappers of PyG's Planetoid and PPI, and a labelled synthetic PPI."""

from hiergraph.datasets.planetoid import (
    SYNTHETIC_MARKER,
    data_root,
    is_synthetic,
    load_planetoid,
    load_ppi,
    write_synthetic_ppi,
)

__all__ = [
    "SYNTHETIC_MARKER",
    "data_root",
    "is_synthetic",
    "load_planetoid",
    "load_ppi",
    "write_synthetic_ppi",
]
