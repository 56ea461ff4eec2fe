"""MultimodalRecordDataset: raw files are read from inside the raw folder only; processing
holds the lock and writes its cache files atomically."""

import dataclasses
from pathlib import Path

import pytest
import torch

from hiergraph.datasets import static_embeddings
from hiergraph.datasets.download import CorruptFileError, resolve_inside
from hiergraph.datasets.multimodal_records import MultimodalRecordDataset, RawRecord, group_split
from tests.datasets.fixtures import (
    FakeTokenizer,
    Killed,
    SlowProcess,
    cut_writes,
    first_runs_in_two_processes,
)


def test_resolve_inside(tmp_path):
    root = tmp_path / "raw"
    (root / "img").mkdir(parents=True)
    (root / "img" / "a.png").write_bytes(b"a")
    (tmp_path / "secret").write_bytes(b"s")
    assert resolve_inside(root, root / "img" / "a.png", "a") == (root / "img" / "a.png").resolve()
    assert resolve_inside(root, root / "img" / ".." / "img" / "a.png", "a").name == "a.png"
    (root / "img" / "in.png").symlink_to(root / "img" / "a.png")
    assert resolve_inside(root, root / "img" / "in.png", "in").name == "a.png"
    link = tmp_path / "link"
    link.symlink_to(root, True)
    assert resolve_inside(link, link / "img" / "a.png", "a").name == "a.png"

    (root / "img" / "out.png").symlink_to(tmp_path / "secret")
    cases = {
        "entry 'abs'": root / "img" / str(tmp_path / "secret"),  # an absolute name
        "entry 'dots'": root / "img" / ".." / ".." / "secret",
        "entry 'link'": root / "img" / "out.png",
        "entry 'prefix'": tmp_path / "raw_other" / "x.png",  # shares the root's name prefix
    }
    for entry, path in cases.items():
        with pytest.raises(ValueError, match="outside the raw folder") as info:
            resolve_inside(root, path, entry)
        assert str(info.value).startswith(f"{entry}: ") and repr(str(root)) in str(info.value)


class _OneRecord(MultimodalRecordDataset):
    name = "OneRecord"
    text_fields = ("title",)
    raw_env = "HIERGRAPH_TEST_ONE_RECORD"
    image: Path

    def read_records(self, raw: Path):
        record = RawRecord(name="x", image=self.image, texts={"title": "x"}, label=0, group="x")
        return [record], ["only"], {}

    def split_records(self, records):
        return {"train": [0], "val": [0], "test": [0]}


def test_process_refuses_images_outside_the_raw_folder(tmp_path, monkeypatch):
    from PIL import Image

    raw = tmp_path / "raw"
    raw.mkdir()
    Image.new("RGB", (8, 8), "red").save(tmp_path / "secret.png")
    monkeypatch.setattr(_OneRecord, "image", raw / ".." / "secret.png", raising=False)
    with pytest.raises(ValueError, match="record 'x'.* outside the raw folder"):
        _OneRecord(tmp_path / "cache", raw_dir=raw)


# --- processing: the lock and atomic cache files


class _Squares(MultimodalRecordDataset):
    """Every PNG of the raw folder is a record (class: the first letter of its name), in
    each of the three splits."""

    name = "Squares"
    text_fields = ("title",)
    raw_env = "HIERGRAPH_TEST_SQUARES"
    expected = "*.png"

    def read_records(self, raw: Path):
        pngs = sorted(raw.glob("*.png"))
        classes = sorted({p.name[0] for p in pngs})
        records = [
            RawRecord(p.stem, p, {"title": f"square {p.stem}"}, classes.index(p.name[0]), p.stem)
            for p in pngs
        ]
        return records, classes, {}

    def split_records(self, records):
        every = list(range(len(records)))
        return {"train": every, "val": every, "test": every}


class _SlowSquares(SlowProcess, _Squares):
    """Processing logs its start and end and takes at least a second."""


def write_squares(raw: Path, count: int = 6) -> Path:
    from PIL import Image

    raw.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(raw / f"{'ab'[i % 2]}{i}.png")
    return raw


def _build_squares(root: str, raw: str, log: str, barrier, queue) -> None:
    torch.set_num_threads(1)
    static_embeddings.minilm_tokenizer = FakeTokenizer
    _SlowSquares.event_log = log
    barrier.wait(timeout=120)
    ds = _SlowSquares(root, raw_dir=raw, image_size=8, patch_size=8)
    queue.put((len(ds), ds.meta["splits"], int(ds._data.image.sum())))


def test_two_processes_build_one_cache(tmp_path):
    raw = write_squares(tmp_path / "raw")
    args = (str(tmp_path / "cache"), str(raw))
    results, events = first_runs_in_two_processes(_build_squares, args, tmp_path / "log")
    assert events.count("start") == 1 and events.count("end") == 1, events  # built once
    assert results[0] == results[1] and results[0][0] == 6
    cache = tmp_path / "cache" / "processed"
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith(".")) == [".lock"]


def test_interrupted_processing_leaves_no_partial_file(tmp_path, monkeypatch):
    raw = write_squares(tmp_path / "raw")
    monkeypatch.setattr(static_embeddings, "minilm_tokenizer", FakeTokenizer)
    with monkeypatch.context() as m:
        cut_writes(m)  # killed while writing the first cache file
        with pytest.raises(Killed):
            _Squares(tmp_path / "cache", raw_dir=raw, image_size=8, patch_size=8)
    processed = tmp_path / "cache" / "processed"
    assert sorted(p.name for p in processed.iterdir()) == [".lock"]
    ds = _Squares(tmp_path / "cache", raw_dir=raw, image_size=8, patch_size=8)  # built in full
    assert len(ds) == 6 and ds.classes == ("a", "b")
    names = sorted(p.name for p in processed.iterdir())
    assert names == sorted([".lock", *ds.processed_file_names, "pre_filter.pt", "pre_transform.pt"])


def test_a_damaged_image_names_its_file_and_record(tmp_path, monkeypatch):
    """A truncated PNG: a CorruptFileError naming the file and the record (Pillow's bare
    "image file is truncated" before), and no cache file."""
    raw = write_squares(tmp_path / "raw")
    damaged = raw / "b1.png"
    damaged.write_bytes(damaged.read_bytes()[:50])  # cut inside the image data
    monkeypatch.setattr(static_embeddings, "minilm_tokenizer", FakeTokenizer)
    with pytest.raises(CorruptFileError, match=r"b1\.png \(record 'b1'\): cannot read") as info:
        _Squares(tmp_path / "cache", raw_dir=raw, image_size=8, patch_size=8)
    assert info.value.path == damaged and isinstance(info.value.__cause__, OSError)
    assert not any((tmp_path / "cache" / "processed").glob("*.pt"))


@pytest.mark.parametrize("label", [-1, 2])
def test_labels_outside_the_classes_are_refused(tmp_path, monkeypatch, label):
    raw = write_squares(tmp_path / "raw")
    read = _Squares.read_records

    def relabelled(self, raw):
        records, classes, meta = read(self, raw)
        records[0] = dataclasses.replace(records[0], label=label)
        return records, classes, meta

    monkeypatch.setattr(_Squares, "read_records", relabelled)
    monkeypatch.setattr(static_embeddings, "minilm_tokenizer", FakeTokenizer)
    with pytest.raises(ValueError, match=f"record 'a0' has label {label}, not one of the 2"):
        _Squares(tmp_path / "cache", raw_dir=raw, image_size=8, patch_size=8)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("label", True, "record 'a0' has label True, not an int class index"),  # (class 1)
        ("label", 0.5, "record 'a0' has label 0.5, not an int"),  # (failed inside bincount)
        ("label", "1", "record 'a0' has label '1', not an int"),  # (a bare '<=' TypeError)
        ("texts", {"title": None}, r"record 'a0' has texts \{'title': None\}; they must map"),
        ("texts", "square", "record 'a0' has texts 'square'; they must map each text field"),
    ],
)
def test_records_of_the_wrong_types_are_refused(tmp_path, monkeypatch, field, value, match):
    """What the raw files gave, checked before anything is tokenized or decoded."""
    raw = write_squares(tmp_path / "raw")
    read = _Squares.read_records

    def altered(self, raw):
        records, classes, meta = read(self, raw)
        records[0] = dataclasses.replace(records[0], **{field: value})
        return records, classes, meta

    monkeypatch.setattr(_Squares, "read_records", altered)
    monkeypatch.setattr(static_embeddings, "minilm_tokenizer", FakeTokenizer)
    with pytest.raises(TypeError, match=match):
        _Squares(tmp_path / "cache", raw_dir=raw, image_size=8, patch_size=8)
    assert not any((tmp_path / "cache" / "processed").glob("*.pt"))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(patch_size=0), ValueError, "patch_size must be a positive int, got 0"),  # (1 % 0)
        (dict(image_size=32.0), TypeError, "image_size must be a positive int"),
        (dict(max_tokens=2.5), TypeError, "max_tokens must be a positive int"),  # (read first)
        (dict(image_size=12), ValueError, "positive multiple of patch_size=8"),
    ],
)
def test_sizes_are_checked_before_anything_is_read(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        _Squares(tmp_path / "cache", raw_dir=tmp_path / "nothing", **kwargs)


def test_an_image_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    """(Pillow's read of a FIFO blocked forever, holding the dataset's lock.)"""
    import os

    from hiergraph.datasets.download import CorruptFileError
    from hiergraph.datasets.multimodal_records import load_image

    os.mkfifo(tmp_path / "face.png")
    with pytest.raises(CorruptFileError, match="face.png: an image is not a regular file"):
        load_image(tmp_path / "face.png", size=8, max_pixels=1000)


def test_group_split_checks_its_fractions_labels_and_seed():
    """(NaN or negative fractions were taken, and NaN quotas sent every group to the first
    part; a label of 1.5 was class 1, a negative one failed inside bincount; a negative seed
    was aliased to a large one.)"""
    groups, labels = ["a", "b", "c", "d"], [0, 1, 0, 1]
    for fractions in ((float("nan"), 0.5, 0.5), (1.5, -0.25, -0.25)):
        with pytest.raises(ValueError, match=r"fractions must be numbers in \[0, 1\]"):
            group_split(groups, labels, fractions)
    with pytest.raises(TypeError, match="fractions must be numbers"):
        group_split(groups, labels, ("0.5", 0.5))
    for label in (1.5, True):
        with pytest.raises(TypeError, match="each label must be an int"):
            group_split(groups, [0, 1, 0, label])
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*64 - 1\]"):
        group_split(groups, labels, seed=-1)
    # labels name the classes: any ints, in any range, split as 0, 1 would be
    fractions = (0.5, 0.25, 0.25)
    expected = group_split(groups, labels, fractions, seed=3)
    assert group_split(groups, [-7, 10**12, -7, 10**12], fractions, seed=3) == expected
