"""Archive robustness: members filtered by name before reading, a size cap, and errors on
damaged files (archives, Planetoid pickles, processed caches) that name the file."""

from __future__ import annotations

import codecs
import io
import pickle
import tarfile
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from hiergraph.datasets import planetoid as hp
from hiergraph.datasets.archives import decode, iter_raw_files
from hiergraph.datasets.bbc import BBCNews
from hiergraph.datasets.download import CorruptFileError
from hiergraph.datasets.imdb import IMDB
from hiergraph.datasets.newsgroups import TwentyNewsgroups
from tests.datasets.fixtures import imdb_files, trust_planetoid, write_tar, write_tiny_planetoid

HUGE = 128 << 20  # bytes of an unused member: reading it would show in the peak


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv("HIERGRAPH_RAW", raising=False)
    monkeypatch.delenv("HIERGRAPH_DATA", raising=False)


def test_unused_huge_member_is_never_read(tmp_path):
    # the official IMDB archive holds 50,000 unlabelled reviews in train/unsup/ that the
    # loader does not use; here one such member of 128 MiB comes first in the archive
    archive = write_tar(
        tmp_path / "aclImdb_v1.tar.gz",
        imdb_files(),
        huge={"aclImdb/train/unsup/0_0.txt": HUGE, "aclImdb/imdbEr.txt": HUGE},
    )
    assert archive.stat().st_size < 2 << 20
    reader = IMDB.__new__(IMDB)  # read_raw needs no constructed dataset
    tracemalloc.start()
    try:
        docs = reader.read_raw(archive)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert {s: len(d) for s, d in docs.items()} == {"train": 18, "val": 2, "test": 8}
    assert peak < 16 << 20, f"peak {peak / 2**20:.0f} MiB: an unused member was read"


@pytest.mark.parametrize("layout", ["tar", "zip", "folder"])
def test_wanted_member_over_the_cap_names_archive_and_member(tmp_path, layout):
    files = {f"bbc/tech/{i:03d}.txt": f"tech headline {i}\n\nText." for i in range(1, 4)}
    big = "bbc/tech/004.txt"
    files[big] = "x" * 5000
    if layout == "tar":
        source = write_tar(tmp_path / "bbc.tar.gz", files)
    elif layout == "zip":
        source = tmp_path / "bbc-fulltext.zip"
        with zipfile.ZipFile(source, "w") as z:
            for name, text in files.items():
                z.writestr(name, text)
    else:
        source = tmp_path / "bbc_folder"
        for name, text in files.items():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_text(text)
    with pytest.raises(CorruptFileError) as info:
        list(iter_raw_files(source, lambda n: n.endswith(".txt"), 4096, "BBC articles"))
    message = str(info.value)
    assert str(source) in message and big in message and "4,096" in message
    assert "BBC articles" in message and info.value.path == source
    # under the cap every wanted file is read, and an unwanted big one is skipped
    read = dict(iter_raw_files(source, lambda n: n != big, 4096))
    assert sorted(read) == sorted(n for n in files if n != big)


def test_dataset_cap_is_a_class_attribute(tmp_path, monkeypatch):
    files = imdb_files()
    files["aclImdb/train/pos/99_9.txt"] = "word " * 3000
    write_tar(tmp_path / "aclImdb_v1.tar.gz", files)
    monkeypatch.setattr(IMDB, "max_member_bytes", 10_000)
    with pytest.raises(CorruptFileError, match=r"aclImdb/train/pos/99_9\.txt.*IMDB reviews"):
        IMDB(tmp_path / "imdb", tokenizer="simple", raw_dir=tmp_path)


def _truncate(path: Path, fraction: float) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])
    return path


@pytest.mark.parametrize("fraction", [0.02, 0.5, 0.97])
def test_truncated_tar_gz_names_the_file(tmp_path, fraction):
    files = {f"20news-bydate-train/sci.space/{i}": f"Subject: s{i}\n\nspace {i}" for i in range(50)}
    files |= {f"20news-bydate-test/sci.space/{i}": f"Subject: t\n\nspace {i}" for i in range(10)}
    archive = _truncate(write_tar(tmp_path / "20news-bydate.tar.gz", files), fraction)
    with pytest.raises(CorruptFileError) as info:
        TwentyNewsgroups(tmp_path / "ng", tokenizer="simple", raw_dir=tmp_path)
    message = str(info.value)
    assert str(archive) in message and "truncated or damaged" in message
    assert "20 Newsgroups posts" in message  # what was expected
    assert isinstance(info.value.__cause__, (EOFError, tarfile.TarError, OSError))


def test_garbage_and_bad_zip_name_the_file(tmp_path):
    garbage = tmp_path / "g" / "aclImdb_v1.tar.gz"
    garbage.parent.mkdir()
    garbage.write_bytes(b"<html>not found</html>" * 10)
    with pytest.raises(CorruptFileError, match="aclImdb_v1.tar.gz is not a readable tar"):
        IMDB(tmp_path / "imdb", tokenizer="simple", raw_dir=garbage.parent)
    bad_zip = tmp_path / "z" / "bbc-fulltext.zip"
    bad_zip.parent.mkdir()
    with zipfile.ZipFile(bad_zip, "w") as z:
        for c in BBCNews.classes:
            for i in range(1, 11):
                z.writestr(f"bbc/{c}/{i:03d}.txt", f"{c} news {i}\n\nBody {i}." * 20)
    _truncate(bad_zip, 0.6)  # the central directory is gone
    with pytest.raises(CorruptFileError) as info:
        BBCNews(tmp_path / "bbc", tokenizer="simple", raw_dir=bad_zip.parent)
    assert str(bad_zip) in str(info.value) and "zip archive" in str(info.value)
    assert isinstance(info.value.__cause__, zipfile.BadZipFile)


def test_damaged_zip_member_names_the_file(tmp_path):
    source = tmp_path / "bbc-fulltext.zip"
    with zipfile.ZipFile(source, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("bbc/tech/001.txt", "tech headline\n\n" + "words " * 2000)
    data = bytearray(source.read_bytes())
    data[100:140] = bytes(40)  # inside the compressed data of the member
    source.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="bbc-fulltext.zip is not a readable zip"):
        list(iter_raw_files(source, None, 1 << 20, "BBC articles"))


def test_tar_links_are_read_or_refused_not_dropped(tmp_path):
    """A hard link (GNU tar's second name of a file) is read; a symbolic one is refused
    (both were dropped without a word)."""
    source = tmp_path / "articles.tar.gz"
    with tarfile.open(source, "w:gz") as tar:
        data = b"tech headline\n\nwords words"
        info = tarfile.TarInfo("bbc/tech/001.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("bbc/tech/002.txt")
        link.type, link.linkname = tarfile.LNKTYPE, "bbc/tech/001.txt"
        tar.addfile(link)
    assert dict(iter_raw_files(source, None, 1 << 20)) == {
        "bbc/tech/001.txt": data, "bbc/tech/002.txt": data
    }  # fmt: skip
    with tarfile.open(source, "w:gz") as tar:
        link = tarfile.TarInfo("bbc/tech/003.txt")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    with pytest.raises(CorruptFileError, match="003.txt is a symbolic link inside the archive"):
        list(iter_raw_files(source, None, 1 << 20, "BBC articles"))


def test_an_archive_that_is_a_fifo_is_named_as_such(tmp_path):
    """(It was reported as missing.)"""
    import os

    os.mkfifo(tmp_path / "bbc-fulltext.zip")
    with pytest.raises(CorruptFileError, match="BBC articles is not a regular file"):
        list(iter_raw_files(tmp_path / "bbc-fulltext.zip", None, 1 << 20, "BBC articles"))


def test_zip_members_python_cannot_read_name_the_file(tmp_path):
    """(An encrypted member raised RuntimeError, an unknown compression method
    NotImplementedError, naming nothing.)"""
    source = tmp_path / "bbc-fulltext.zip"
    with zipfile.ZipFile(source, "w") as z:
        z.writestr("bbc/tech/001.txt", "tech headline\n\nwords")
    data = bytearray(source.read_bytes())
    for at in (8, data.rindex(b"PK\x01\x02") + 10):  # the local and central headers
        data[at : at + 2] = (99).to_bytes(2, "little")  # compression method 99 (AES)
    source.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="bbc-fulltext.zip is not a readable zip"):
        list(iter_raw_files(source, None, 1 << 20, "BBC articles"))


def test_corrupt_planetoid_pickle_names_the_file(tmp_path):
    raw = write_tiny_planetoid(tmp_path / "src")
    data = hp.load_planetoid("Cora", root=tmp_path / "ok", raw_dir=raw)[0]
    assert data.num_nodes == 560 and int(data.train_mask.sum()) == 40
    _truncate(raw / "ind.cora.graph", 0.5)
    with pytest.raises(CorruptFileError) as info:
        hp.load_planetoid("Cora", root=tmp_path / "bad", raw_dir=raw)
    message = str(info.value)  # (the source the link in <root>/Cora/raw points to)
    assert str(raw / "ind.cora.graph") in message and "differs from the official" in message
    trust_planetoid(raw)  # (as if it were the official file: read, and found damaged)
    with pytest.raises(CorruptFileError) as info:
        hp.load_planetoid("Cora", root=tmp_path / "bad", raw_dir=raw)
    assert str(raw / "ind.cora.graph") in str(info.value)
    assert "adjacency lists" in str(info.value)
    assert isinstance(info.value.__cause__, (EOFError, pickle.UnpicklingError))
    trust_planetoid(write_tiny_planetoid(tmp_path / "src2"))
    (tmp_path / "src2" / "ind.cora.test.index").write_text("12\nnot a number\n")
    trust_planetoid(tmp_path / "src2")
    with pytest.raises(CorruptFileError, match=r"ind\.cora\.test\.index.*one test node index"):
        hp.load_planetoid("Cora", root=tmp_path / "bad2", raw_dir=tmp_path / "src2")


def test_planetoid_pickles_that_are_not_the_official_files_are_not_read(tmp_path):
    """A pickle runs code when read: files whose SHA-256 is not the official one's are
    refused before PyG (or the loader's own diagnosis) reads them."""
    raw = write_tiny_planetoid(tmp_path / "src")
    ran = tmp_path / "ran"

    class Planted:
        def __reduce__(self):
            return (Path.touch, (ran,))

    (raw / "ind.cora.x").write_bytes(pickle.dumps(Planted(), protocol=2))
    with pytest.raises(CorruptFileError, match=r"ind\.cora\.x: its SHA-256 differs .* not read"):
        hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw)
    assert not ran.exists()
    assert not any((tmp_path / "data" / "Cora" / "processed").glob("*.pt"))
    own = write_tiny_planetoid(tmp_path / "own", seed=1, trusted=False)  # a user's own files
    with pytest.raises(CorruptFileError, match="pass trust_raw_files=True"):
        hp.load_planetoid("Cora", root=tmp_path / "own_data", raw_dir=own)
    data = hp.load_planetoid("Cora", root=tmp_path / "own_data", raw_dir=own, trust_raw_files=True)
    assert data[0].num_nodes == 560


def test_raw_files_that_read_but_do_not_fit_name_the_folder(tmp_path):
    """Every file parses, but a test index points past the features: the error names the
    raw folder (a bare IndexError from inside PyG before), with PyG's error as its cause."""
    raw = write_tiny_planetoid(tmp_path / "src")
    (raw / "ind.cora.test.index").write_text("99999\n")
    trust_planetoid(raw)
    with pytest.raises(CorruptFileError, match="could not build Cora from these raw files") as info:
        hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw)
    assert str(tmp_path / "data" / "Cora" / "raw") in str(info.value)
    assert isinstance(info.value.__cause__, IndexError)
    assert not any((tmp_path / "data" / "Cora" / "processed").glob("*.pt"))  # no cache left


@pytest.mark.parametrize(
    "edit, problem",
    [
        ("edge", r"the graph has node ids 0\.\.1000000 for 560 nodes"),
        ("negative-edge", r"the graph has node ids -1\.\.559 for 560 nodes"),
        ("no-test", "ind.cora.test.index lists no test node"),
        ("negative-test", r"ind.cora.test.index holds a negative node id \(-3\)"),
    ],
)
def test_raw_files_that_build_but_are_no_graph_are_refused(tmp_path, edit, problem):
    """(They loaded: an edge to a node that does not exist, no test node, or a negative test
    id that PyG wraps to the last nodes.)"""
    raw = write_tiny_planetoid(tmp_path / "src")
    if edit.endswith("edge"):
        graph = pickle.loads((raw / "ind.cora.graph").read_bytes())
        if edit == "edge":
            graph[0] = [1_000_000]
        else:
            graph[-1], graph[5] = [5], [*graph[5], -1]
        (raw / "ind.cora.graph").write_bytes(pickle.dumps(graph, protocol=2))
    else:
        ids = [] if edit == "no-test" else [-3, *range(541, 560)]
        (raw / "ind.cora.test.index").write_text("".join(f"{i}\n" for i in ids))
    trust_planetoid(raw)  # (as if these were the official files)
    with pytest.raises(CorruptFileError, match=f"read but do not fit together: {problem}"):
        hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw)


def test_corrupt_ppi_file_names_the_file(tmp_path):
    raw = hp.write_synthetic_ppi(tmp_path / "src", graphs=(2, 1, 1), nodes_per_graph=8)
    (raw / "valid_graph.json").write_text('{"nodes": [')
    with pytest.raises(CorruptFileError, match=r"valid_graph\.json.*node-link graph in JSON"):
        hp.load_ppi(root=tmp_path / "data", raw_dir=raw)


def test_damaged_processed_cache_names_the_file(tmp_path):
    write_tar(tmp_path / "aclImdb_v1.tar.gz", imdb_files())
    IMDB(tmp_path / "imdb", tokenizer="simple", raw_dir=tmp_path)
    cache = tmp_path / "imdb" / "processed" / "simple_train.pt"
    _truncate(cache, 0.5)
    with pytest.raises(CorruptFileError, match="force_reload=True") as info:
        IMDB(tmp_path / "imdb", tokenizer="simple", raw_dir=tmp_path)
    assert info.value.path == cache and not isinstance(info.value.__cause__, CorruptFileError)
    rebuilt = IMDB(tmp_path / "imdb", tokenizer="simple", raw_dir=tmp_path, force_reload=True)
    assert len(rebuilt) == 18
    # no temporary files are left next to the cache
    assert sorted(p.name for p in cache.parent.iterdir() if p.name.startswith(".")) == [".lock"]


@pytest.mark.parametrize(
    "content",
    ["[1, 2]", '{"classes": []}', '{"tokenizer": "simple", "empty": {}}', "{not json"],
    ids=["a list", "no classes", "classes missing", "not JSON"],
)
def test_edited_cache_metadata_names_the_file(tmp_path, content):
    """The JSON beside the splits must be the object the cache wrote (it loaded with no
    class names before)."""
    write_tar(tmp_path / "aclImdb_v1.tar.gz", imdb_files())
    IMDB(tmp_path / "imdb", tokenizer="simple", raw_dir=tmp_path)
    meta = next((tmp_path / "imdb" / "processed").glob("*.json"))
    meta.write_text(content)
    with pytest.raises(CorruptFileError, match="force_reload=True") as info:
        IMDB(tmp_path / "imdb", tokenizer="simple", raw_dir=tmp_path)
    assert info.value.path == meta
    rebuilt = IMDB(tmp_path / "imdb", tokenizer="simple", raw_dir=tmp_path, force_reload=True)
    assert len(rebuilt.meta["classes"]) == 2


def test_a_member_held_twice_is_refused(tmp_path):
    """(A second copy of a review was read as one more document.)"""
    archive = tmp_path / "aclImdb_v1.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for _ in range(2):
            info = tarfile.TarInfo("aclImdb/train/pos/0_7.txt")
            info.size = 4
            tar.addfile(info, io.BytesIO(b"good"))
    with pytest.raises(CorruptFileError, match="holds 'aclImdb/train/pos/0_7.txt' twice"):
        list(iter_raw_files(archive))
    with zipfile.ZipFile(tmp_path / "twice.zip", "w") as z:
        z.writestr("a.txt", "x")
        with pytest.warns(UserWarning, match="Duplicate name"):
            z.writestr("a.txt", "y")
    with pytest.raises(CorruptFileError, match="holds 'a.txt' twice"):
        list(iter_raw_files(tmp_path / "twice.zip"))


def test_a_folder_file_that_links_out_of_the_folder_is_refused(tmp_path):
    """(A symlink to a file elsewhere, e.g. /etc/passwd, became a training review.)"""
    outside = tmp_path / "secret.txt"
    outside.write_text("not a review")
    folder = tmp_path / "aclImdb" / "train" / "pos"
    folder.mkdir(parents=True)
    (folder / "0_7.txt").write_text("a review")
    (folder / "1_7.txt").symlink_to(tmp_path / "aclImdb" / "train" / "pos" / "0_7.txt")
    assert [name for name, _ in iter_raw_files(tmp_path / "aclImdb")] == [
        "train/pos/0_7.txt",
        "train/pos/1_7.txt",
    ]  # fmt: skip  (a link inside the folder is read)
    (folder / "2_7.txt").symlink_to(outside)
    with pytest.raises(ValueError, match="'train/pos/2_7.txt'.*outside the raw folder"):
        list(iter_raw_files(tmp_path / "aclImdb"))


def test_utf16_with_its_byte_order_mark_is_decoded():
    """(It was read as Latin-1: every other character a NUL.)"""
    text = "Ein schöner Film — très bien"
    boms = {"utf-16": b"", "utf-16-le": codecs.BOM_UTF16_LE, "utf-16-be": codecs.BOM_UTF16_BE}
    for encoding, bom in boms.items():  # ("utf-16" writes its own mark)
        assert decode(bom + text.encode(encoding)) == text
    assert decode(text.encode("utf-8")) == text and decode("café".encode("latin-1")) == "café"
    # a byte-order mark over bytes that are not UTF-16 (an odd length, a lone surrogate):
    # read as Latin-1, as other undecodable text (a bare UnicodeDecodeError before)
    for damaged in (codecs.BOM_UTF16_LE + b"a\x00b", codecs.BOM_UTF16_LE + b"\x00\xd8a\x00"):
        assert decode(damaged) == damaged.decode("latin-1")


MASK_KEYS = ("train_mask", "val_mask", "test_mask")


def test_geom_gcn_split_reads_the_checked_raw_folder(tmp_path):
    """PyG reads the geom-gcn split's raw files from ``<Name>/geom-gcn/raw``: files planted
    there were unpickled unchecked, and pre-placed files never served (PyG downloaded them
    itself, offline or not). Every split now reads ``<Name>/raw``, the files checked."""
    raw = write_tiny_planetoid(tmp_path / "src")
    rng = np.random.default_rng(0)
    for i in range(10):
        part = rng.integers(0, 3, 560)  # (0/1 integers, as in the geom-gcn files)
        masks = {key: (part == j).astype(np.uint8) for j, key in enumerate(MASK_KEYS)}
        np.savez(raw / f"cora_split_0.6_0.2_{i}.npz", **masks)
    ran = tmp_path / "ran"

    class Planted:
        def __reduce__(self):
            return (Path.touch, (ran,))

    planted = tmp_path / "data" / "Cora" / "geom-gcn" / "raw"
    planted.mkdir(parents=True)
    for path in raw.iterdir():
        (planted / path.name).write_bytes(path.read_bytes())
    (planted / "ind.cora.x").write_bytes(pickle.dumps(Planted(), protocol=2))
    data = hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw, split="geom-gcn")[0]
    assert data.train_mask.shape == (560, 10) and not ran.exists()
    assert data.train_mask.dtype == torch.bool  # (PyG kept the files' uint8)
    public = hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw)[0]
    assert public.train_mask.shape == (560,)  # (its own cache)


def test_copies_that_differ_in_line_endings_only_are_one_document(tmp_path):
    from hiergraph.datasets.archives import FirstCopies

    copies = FirstCopies(tmp_path)
    assert copies.first(("train", 0, 1), "a/1", "line one\nline two", "document 1")
    assert not copies.first(("train", 0, 1), "b/1", "line one\r\nline two", "document 1")
    assert not copies.first(("train", 0, 1), "c/1", "line one\rline two", "document 1")
    with pytest.raises(ValueError, match="b/1 and a/1 are both document 1 but differ"):
        copies.first(("train", 0, 1), "b/1", "line one\nline 2", "document 1")


def test_a_folder_named_like_a_cache_is_refused_by_name(tmp_path):
    from hiergraph.datasets.processed import load_weights_only

    (tmp_path / "data.pt").mkdir()  # (a bare IsADirectoryError)
    with pytest.raises(CorruptFileError, match="data.pt is not a cache"):
        load_weights_only(tmp_path / "data.pt", "a cache", "it")


def test_a_raw_file_replaced_after_its_check_is_never_read(tmp_path, monkeypatch):
    """PyG builds from private copies of the checked bytes: a file swapped in the raw
    folder between the check and PyG's read (it ran) is not read."""
    import contextlib

    raw = write_tiny_planetoid(tmp_path / "src")
    ran, checked = tmp_path / "ran", hp._verified

    class Planted:
        def __reduce__(self):
            return (Path.touch, (ran,))

    @contextlib.contextmanager
    def swapped_after_the_check(folder, files, pinned):
        with checked(folder, files, pinned) as staged:
            (raw / "ind.cora.x").write_bytes(pickle.dumps(Planted(), protocol=2))
            yield staged

    monkeypatch.setattr(hp, "_verified", swapped_after_the_check)
    data = hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw)[0]
    assert data.num_nodes == 560 and not ran.exists()
    # (the private copies are gone)
    assert sorted(p.name for p in (tmp_path / "data" / "Cora").iterdir()) == ["processed", "raw"]


def test_a_cache_that_vanishes_while_loading_is_not_rebuilt_from_unchecked_files(
    tmp_path, monkeypatch
):
    """With a cache there, PyG reads no raw file; were it deleted between the loader's look
    and PyG's, PyG built from the raw folder, unchecked (a planted pickle ran)."""
    raw = write_tiny_planetoid(tmp_path / "src")
    hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw)
    ran, init = tmp_path / "ran", hp._Planetoid.__init__

    class Planted:
        def __reduce__(self):
            return (Path.touch, (ran,))

    def vanishing(self, root, name, raw_folder=None, **options):
        (tmp_path / "data" / "Cora" / "processed" / "data.pt").unlink(missing_ok=True)
        init(self, root, name, raw_folder, **options)

    (raw / "ind.cora.x").write_bytes(pickle.dumps(Planted(), protocol=2))
    monkeypatch.setattr(hp._Planetoid, "__init__", vanishing)
    with pytest.raises(FileNotFoundError, match="the processed cache vanished"):
        hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw)
    assert not ran.exists()


def test_copies_left_by_a_killed_build_are_removed(tmp_path):
    raw = write_tiny_planetoid(tmp_path / "src")
    stale = tmp_path / "data" / "Cora" / ".verified-left"
    stale.mkdir(parents=True)
    hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw)
    assert not stale.exists()


def test_ppi_graphs_that_are_no_graphs_are_refused(tmp_path):
    raw = hp.write_synthetic_ppi(tmp_path / "src", graphs=(2, 1, 1), nodes_per_graph=8)
    train = hp.load_ppi(root=tmp_path / "data", raw_dir=raw)[0]
    from hiergraph.datasets.processed import SAFE_CLASSES

    path = Path(train.processed_paths[2])  # the test split's cache
    with torch.serialization.safe_globals(SAFE_CLASSES):
        data, slices, *rest = torch.load(path, weights_only=True)
    data["edge_index"][0, 0] = 10**6
    torch.save((data, slices, *rest), path)
    with pytest.raises(CorruptFileError, match=r"test.pt: graph 0 is no PPI graph: .*node ids"):
        hp.load_ppi(root=tmp_path / "data", raw_dir=raw)
