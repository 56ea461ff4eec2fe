"""Dataset loaders: offline wrappers of PyG's Planetoid and PPI, and a labelled synthetic PPI."""

from hiergraph.datasets.emoji import GoogleEmoji
from hiergraph.datasets.openclipart import OpenClipArt
from hiergraph.datasets.planetoid import (
    SYNTHETIC_MARKER,
    data_root,
    is_synthetic,
    load_planetoid,
    load_ppi,
    write_synthetic_ppi,
)

__all__ = [
    "GoogleEmoji",
    "OpenClipArt",
    "SYNTHETIC_MARKER",
    "data_root",
    "is_synthetic",
    "load_planetoid",
    "load_ppi",
    "write_synthetic_ppi",
]
