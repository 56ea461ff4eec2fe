"""Downloads against a local HTTP server (127.0.0.1, no external network), into the default
cache root."""

from __future__ import annotations

import hashlib
import io
import os
import re
import socket
import zipfile
from pathlib import Path

import pytest

from hiergraph.datasets import download as dl
from hiergraph.datasets import planetoid as hp
from hiergraph.datasets import ppi
from hiergraph.datasets.bbc import BBCNews
from hiergraph.datasets.download import (
    OFFLINE_ENV,
    REMOTE_FILES,
    DownloadError,
    RemoteFile,
    fetch,
    sha256_of,
)
from hiergraph.datasets.imdb import IMDB
from hiergraph.datasets.newsgroups import TwentyNewsgroups
from tests.datasets.fixtures import (
    Server,
    imdb_files,
    write_tar,
    write_tiny_planetoid,
)

NAME = "aclImdb_v1.tar.gz"


@pytest.fixture
def online(monkeypatch):
    """Downloads allowed (the package conftest switches them off), no proxy for 127.0.0.1."""
    monkeypatch.delenv(OFFLINE_ENV, raising=False)
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.delenv("HIERGRAPH_RAW", raising=False)
    monkeypatch.delenv("HIERGRAPH_DATA", raising=False)


@pytest.fixture
def server(tmp_path):
    (tmp_path / "www").mkdir()
    with Server(tmp_path / "www") as s:
        yield s


@pytest.fixture
def archive(server):
    """The official-layout IMDB archive, served; returns its bytes."""
    path = write_tar(server.folder / NAME, imdb_files())
    return path.read_bytes()


def serve_imdb(monkeypatch, server, sha256, urls=None):
    """Point the IMDB download at ``urls`` (default: the archive on ``server``)."""
    remote = RemoteFile(NAME, tuple(urls or [f"{server.url}/{NAME}"]), sha256)
    monkeypatch.setitem(REMOTE_FILES, "IMDB", remote)
    return remote


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ default root
def test_first_use_downloads_into_the_user_cache(online, monkeypatch, server, archive, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    serve_imdb(monkeypatch, server, hashlib.sha256(archive).hexdigest())
    ds = IMDB(tokenizer="simple")
    raw = tmp_path / "xdg" / "hiergraph" / "IMDB" / "raw"
    assert len(ds) == 18 and (raw / NAME).read_bytes() == archive
    assert leftovers(raw) == [NAME]  # no temporary file left
    assert server.requests == [f"/{NAME}"]
    again = IMDB(split="test", tokenizer="simple")  # from the cache: no second request
    assert len(again) == 8 and len(server.requests) == 1


# ------------------------------------------------------------- download failures
def test_checksum_mismatch_leaves_nothing(online, monkeypatch, server, archive, tmp_path):
    serve_imdb(monkeypatch, server, "0" * 64)
    with pytest.raises(DownloadError) as info:
        IMDB(tmp_path / "imdb", tokenizer="simple")
    message = str(info.value)
    assert "0" * 64 in message and hashlib.sha256(archive).hexdigest() in message
    assert f"{server.url}/{NAME}" in message and "not the official file" in message
    assert "raw_dir=" in message and not info.value.unreachable
    assert leftovers(tmp_path / "imdb" / "raw") == []


def test_cut_connection_leaves_nothing(online, monkeypatch, server, archive, tmp_path):
    serve_imdb(monkeypatch, server, hashlib.sha256(archive).hexdigest())
    server.cut[NAME] = len(archive) // 2  # Content-Length says more than is sent
    cut = f"cut after {len(archive) // 2} of {len(archive)} bytes"
    with pytest.raises(DownloadError, match=cut):
        IMDB(tmp_path / "imdb", tokenizer="simple")
    assert leftovers(tmp_path / "imdb" / "raw") == []
    # without a checksum the cut is still caught
    with pytest.raises(DownloadError, match="cut after"):
        fetch(RemoteFile(NAME, (f"{server.url}/{NAME}",), None), tmp_path / "plain" / NAME)
    assert leftovers(tmp_path / "plain") == []


def test_a_killed_downloads_partial_file_is_removed_by_the_next(online, server, tmp_path):
    """(SIGKILL during a download left its temporary file for good.)"""
    import os
    import time

    (tmp_path / "www" / "data.bin").write_bytes(b"payload")
    dest = tmp_path / "raw" / "data.bin"
    dest.parent.mkdir()
    dead, live = dest.parent / ".data.bin.0a1b.tmp", dest.parent / ".data.bin.2c3d.tmp"
    dead.write_bytes(b"partial"), live.write_bytes(b"partial")
    old = time.time() - 3600
    os.utime(dead, (old, old))  # untouched for an hour: its process is gone
    fetch(RemoteFile("data.bin", (f"{server.url}/data.bin",), None), dest)
    assert dest.read_bytes() == b"payload" and not dead.exists() and live.exists()


def test_a_trickling_server_is_given_up(online, monkeypatch, server, archive, tmp_path):
    """A server that sends a few bytes now and then (each read within the socket timeout)
    is given up once a window of SLOW_SECONDS brings fewer than MIN_RATE bytes a second;
    nothing is left behind."""
    serve_imdb(monkeypatch, server, hashlib.sha256(archive).hexdigest())
    server.trickle[NAME] = (64, 0.02)  # about 3 KB/s
    monkeypatch.setattr(dl, "SLOW_SECONDS", 0.2)
    monkeypatch.setattr(dl, "MIN_RATE", 10_000)
    with pytest.raises(DownloadError, match=r"stalled: \d+ bytes in the last \d+ s \(less than"):
        fetch(RemoteFile(NAME, (f"{server.url}/{NAME}",), None), tmp_path / "plain" / NAME)
    assert leftovers(tmp_path / "plain") == []
    monkeypatch.setattr(dl, "MIN_RATE", 100)  # the same server, fast enough
    server.trickle[NAME] = (len(archive) // 4 + 1, 0.02)
    fetch(RemoteFile(NAME, (f"{server.url}/{NAME}",), None), tmp_path / "plain" / NAME)
    assert (tmp_path / "plain" / NAME).read_bytes() == archive


@pytest.mark.parametrize("name", ["bbc-fulltext.zip", NAME])
@pytest.mark.parametrize(
    "body",
    [b"<html>moved</html>", b"", b"<html>" + b"PK\x05\x06" + bytes(18) + b"</html>"],
    ids=["html", "empty", "html with an end-of-directory marker"],
)
def test_an_archive_without_checksum_is_checked_before_it_is_kept(online, server, tmp_path,
                                                                  name, body):  # fmt: skip
    """A file with no known SHA-256 (the BBC archive) that is not the archive its name says
    is refused and not kept (it was renamed into place, and every later run took it as
    the complete download); a real archive passes."""
    (server.folder / name).write_bytes(body)
    remote = RemoteFile(name, (f"{server.url}/{name}",), None)
    with pytest.raises(DownloadError, match=f"is not the archive its name {re.escape(name)}"):
        fetch(remote, tmp_path / "raw" / name)
    assert leftovers(tmp_path / "raw") == []
    if name.endswith(".zip"):
        with zipfile.ZipFile(server.folder / name, "w") as z:
            z.writestr("bbc/tech/001.txt", "a headline")
    else:
        write_tar(server.folder / name, imdb_files())
    kept = fetch(remote, tmp_path / "raw" / name)
    assert kept.read_bytes() == (server.folder / name).read_bytes()


def test_truncated_file_fails_the_checksum(online, monkeypatch, server, archive, tmp_path):
    serve_imdb(monkeypatch, server, hashlib.sha256(archive).hexdigest())
    (server.folder / NAME).write_bytes(archive[:-100])  # served in full, but cut at the source
    with pytest.raises(DownloadError, match="truncated, damaged or not the official file"):
        IMDB(tmp_path / "imdb", tokenizer="simple")
    assert leftovers(tmp_path / "imdb" / "raw") == []


def test_mirrors_are_tried_in_order(online, monkeypatch, server, archive, tmp_path):
    sha = hashlib.sha256(archive).hexdigest()
    serve_imdb(monkeypatch, server, sha, [f"{server.url}/gone.tar.gz", f"{server.url}/{NAME}"])
    assert len(IMDB(tmp_path / "imdb", tokenizer="simple")) == 18
    assert server.requests == ["/gone.tar.gz", f"/{NAME}"]  # a 404, then the mirror


def test_unreachable_server_falls_back_to_preplaced_files(online, monkeypatch, archive, tmp_path):
    serve_imdb(monkeypatch, None, None, [f"http://127.0.0.1:{closed_port()}/{NAME}"])
    with pytest.raises(FileNotFoundError) as info:
        IMDB(tmp_path / "imdb", tokenizer="simple")
    message = str(info.value)
    assert "Downloading it failed (offline?)" in message and NAME in message
    assert str(tmp_path / "imdb" / "raw") in message and "HIERGRAPH_RAW" in message
    assert isinstance(info.value.__cause__, DownloadError) and info.value.__cause__.unreachable
    assert leftovers(tmp_path / "imdb" / "raw") == []
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    (shelf / NAME).write_bytes(archive)
    monkeypatch.setenv("HIERGRAPH_RAW", str(shelf))
    assert len(IMDB(tmp_path / "imdb", tokenizer="simple")) == 18


def test_offline_switch_and_preplaced_files_make_no_request(
    online, monkeypatch, server, archive, tmp_path
):
    serve_imdb(monkeypatch, server, hashlib.sha256(archive).hexdigest())
    monkeypatch.setenv(OFFLINE_ENV, "1")
    with pytest.raises(FileNotFoundError, match=rf"switched off \(\${OFFLINE_ENV}\)"):
        IMDB(tmp_path / "imdb", tokenizer="simple")
    monkeypatch.setenv(OFFLINE_ENV, "0")  # "0" means downloads are allowed
    assert len(IMDB(tmp_path / "a", tokenizer="simple", raw_dir=server.folder)) == 18
    assert server.requests == []  # the pre-placed archive was used
    assert len(IMDB(tmp_path / "b", tokenizer="simple")) == 18
    assert server.requests == [f"/{NAME}"]


def test_planetoid_downloads_pyg_files_with_checksums(online, monkeypatch, server, tmp_path):
    write_tiny_planetoid(server.folder / "planetoid", trusted=False)
    monkeypatch.setattr(hp.Planetoid, "url", f"{server.url}/planetoid")
    # the tiny synthetic files are not the official ones: the pinned checksums reject them
    with pytest.raises(DownloadError, match="expected 23cfa55d"):
        hp.load_planetoid("Cora", root=tmp_path / "data")
    assert leftovers(tmp_path / "data" / "Cora" / "raw") == []
    for f in hp.planetoid_raw_files("Cora"):
        monkeypatch.setitem(dl.PLANETOID_SHA256, f, sha256_of(server.folder / "planetoid" / f))
    data = hp.load_planetoid("Cora", root=tmp_path / "data")[0]
    assert data.num_nodes == 560 and int(data.test_mask.sum()) == 20
    assert leftovers(tmp_path / "data" / "Cora" / "raw") == sorted(hp.planetoid_raw_files("Cora"))


def test_ppi_downloads_and_unpacks_pyg_zip(online, monkeypatch, server, tmp_path):
    raw = ppi.write_synthetic_ppi(tmp_path / "ppi_src", graphs=(2, 1, 1), nodes_per_graph=8)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for f in ppi.ppi_raw_files():
            z.write(raw / f, f)
    (server.folder / "ppi.zip").write_bytes(buffer.getvalue())
    monkeypatch.setattr(ppi.PPI, "url", f"{server.url}/ppi.zip")
    train, val, test = ppi.load_ppi(root=tmp_path / "data")
    assert (len(train), len(val), len(test)) == (2, 1, 1)
    assert leftovers(tmp_path / "data" / "PPI" / "raw") == sorted(ppi.ppi_raw_files())
    assert not (tmp_path / "data" / "PPI" / "ppi.zip").exists()


def test_offline_planetoid_message(monkeypatch, tmp_path):
    monkeypatch.delenv("HIERGRAPH_RAW", raising=False)
    with pytest.raises(FileNotFoundError, match=r"(?s)switched off .*Fix: put the files into"):
        hp.load_planetoid("PubMed", root=tmp_path)


@pytest.mark.parametrize("cls", [IMDB, TwentyNewsgroups, BBCNews])
def test_remote_files_are_well_formed(cls):
    remote = REMOTE_FILES[cls.name]
    assert remote.filename in cls.sources  # found in root/raw on the next run
    assert remote.urls and all(re.match(r"https?://", u) for u in remote.urls)
    assert remote.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", remote.sha256)
    assert cls is BBCNews or remote.sha256 is not None
    for sha in dl.PLANETOID_SHA256.values():
        assert re.fullmatch(r"[0-9a-f]{64}", sha)


def test_pinned_planetoid_checksums_match_real_files():
    real = os.environ.get("HIERGRAPH_RAW")
    folders = [Path(real) / n / "raw" for n in ("Cora", "CiteSeer")] if real else []
    folders = [f for f in folders if f.is_dir()]
    if not folders:
        pytest.skip("needs the real Planetoid raw files in $HIERGRAPH_RAW")
    for folder in folders:
        for path in folder.iterdir():
            assert sha256_of(path) == dl.PLANETOID_SHA256[path.name], path.name
