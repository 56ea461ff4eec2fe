"""Dataset loaders: offline wrappers of PyG's Planetoid and PPI (and a labelled synthetic PPI),
document corpora (IMDB, 20 Newsgroups, BBC News) and multimodal records (Open Clip Art, emoji)."""

from hiergraph.datasets.bbc import BBCNews
from hiergraph.datasets.emoji import GoogleEmoji
from hiergraph.datasets.imdb import IMDB
from hiergraph.datasets.newsgroups import TwentyNewsgroups
from hiergraph.datasets.openclipart import OpenClipArt
from hiergraph.datasets.planetoid import (
    SYNTHETIC_MARKER,
    data_root,
    is_synthetic,
    load_planetoid,
    load_ppi,
    write_synthetic_ppi,
)
from hiergraph.datasets.text import DocumentLoader, TextClassificationDataset

__all__ = [
    "BBCNews",
    "DocumentLoader",
    "GoogleEmoji",
    "IMDB",
    "OpenClipArt",
    "SYNTHETIC_MARKER",
    "TextClassificationDataset",
    "TwentyNewsgroups",
    "data_root",
    "is_synthetic",
    "load_planetoid",
    "load_ppi",
    "write_synthetic_ppi",
]
