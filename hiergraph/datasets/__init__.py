"""Dataset loaders: PyG's Planetoid and PPI (and a labelled synthetic PPI), document corpora
(IMDB, 20 Newsgroups, BBC News) and multimodal records (Open Clip Art, emoji).

Missing raw files are taken from ``raw_dir=`` / ``$HIERGRAPH_RAW`` or downloaded from the
official sources; everything is kept under :func:`data_root` (``~/.cache/hiergraph`` by
default). See :mod:`hiergraph.datasets.locate` and :mod:`hiergraph.datasets.download`.
"""

from hiergraph.datasets.bbc import BBCNews
from hiergraph.datasets.emoji import GoogleEmoji
from hiergraph.datasets.errors import CorruptFileError, DownloadError
from hiergraph.datasets.imdb import IMDB
from hiergraph.datasets.locate import cache_dir, data_root
from hiergraph.datasets.newsgroups import TwentyNewsgroups
from hiergraph.datasets.openclipart import OpenClipArt
from hiergraph.datasets.planetoid import load_planetoid
from hiergraph.datasets.ppi import SYNTHETIC_MARKER, is_synthetic, load_ppi, write_synthetic_ppi
from hiergraph.datasets.text import DocumentLoader, TextClassificationDataset

__all__ = [
    "BBCNews",
    "CorruptFileError",
    "DocumentLoader",
    "DownloadError",
    "GoogleEmoji",
    "IMDB",
    "OpenClipArt",
    "SYNTHETIC_MARKER",
    "TextClassificationDataset",
    "TwentyNewsgroups",
    "cache_dir",
    "data_root",
    "is_synthetic",
    "load_planetoid",
    "load_ppi",
    "write_synthetic_ppi",
]
