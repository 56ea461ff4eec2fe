"""Archive robustness: members filtered by name before reading, a size cap, and errors on
damaged archives that name the file."""

from __future__ import annotations

import codecs
import io
import tarfile
import tracemalloc
import zipfile

import pytest

from hiergraph.datasets.archives import decode, iter_raw_files
from hiergraph.datasets.bbc import BBCNews
from hiergraph.datasets.download import CorruptFileError
from hiergraph.datasets.imdb import IMDB
from hiergraph.datasets.newsgroups import TwentyNewsgroups
from tests.datasets.fixtures import imdb_files, truncate, write_tar

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


@pytest.mark.parametrize("fraction", [0.02, 0.5, 0.97])
def test_truncated_tar_gz_names_the_file(tmp_path, fraction):
    files = {f"20news-bydate-train/sci.space/{i}": f"Subject: s{i}\n\nspace {i}" for i in range(50)}
    files |= {f"20news-bydate-test/sci.space/{i}": f"Subject: t\n\nspace {i}" for i in range(10)}
    archive = truncate(write_tar(tmp_path / "20news-bydate.tar.gz", files), fraction)
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
    truncate(bad_zip, 0.6)  # the central directory is gone
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


def test_copies_that_differ_in_line_endings_only_are_one_document(tmp_path):
    from hiergraph.datasets.archives import FirstCopies

    copies = FirstCopies(tmp_path)
    assert copies.first(("train", 0, 1), "a/1", "line one\nline two", "document 1")
    assert not copies.first(("train", 0, 1), "b/1", "line one\r\nline two", "document 1")
    assert not copies.first(("train", 0, 1), "c/1", "line one\rline two", "document 1")
    with pytest.raises(ValueError, match="b/1 and a/1 are both document 1 but differ"):
        copies.first(("train", 0, 1), "b/1", "line one\nline 2", "document 1")
