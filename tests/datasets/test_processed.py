"""Processed caches are read with ``weights_only=True`` only: a replaced cache file that
names other globals (code) is refused, where PyG's own ``load`` would unpickle it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from hiergraph.datasets import planetoid as hp
from hiergraph.datasets.download import CorruptFileError
from hiergraph.datasets.imdb import IMDB
from tests.datasets.fixtures import imdb_files, truncate, write_tar, write_tiny_planetoid


class _Payload:
    """Touches a marker file when unpickled, as a hostile pickle would run any command."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


def test_replaced_planetoid_cache_is_refused(no_env, tmp_path):
    raw = write_tiny_planetoid(tmp_path / "source" / "raw")
    root = tmp_path / "data"
    first = hp.load_planetoid("Cora", root=root, raw_dir=raw)
    again = hp.load_planetoid("Cora", root=root, raw_dir=raw)  # read back from the cache
    assert torch.equal(first[0].x, again[0].x) and torch.equal(first[0].y, again[0].y)
    cache = Path(first.processed_paths[0])
    marker = tmp_path / "ran"
    torch.save((_Payload(marker), {}, None), cache)
    with pytest.raises(CorruptFileError, match="not a readable processed cache") as info:
        hp.load_planetoid("Cora", root=root, raw_dir=raw)
    assert info.value.path == cache and not isinstance(info.value.__cause__, CorruptFileError)
    assert not marker.exists()


def test_strict_load_reads_pyg_caches_and_refuses_other_objects(tmp_path):
    from torch_geometric.data import Data, InMemoryDataset

    from hiergraph.data import window_hierarchy
    from hiergraph.datasets.processed import StrictLoad

    class Tiny(StrictLoad, InMemoryDataset):
        def __init__(self):
            super().__init__(str(tmp_path))

    trees = [window_hierarchy(n, (2, 2), x=torch.randn(n, 3)) for n in (5, 8)]
    path = tmp_path / "cache.pt"
    InMemoryDataset.save(trees, str(path))
    dataset = Tiny()
    dataset.load(str(path))
    assert len(dataset) == 2 and torch.equal(dataset[1].x, trees[1].x)
    assert type(dataset[0]).__name__ == "SignalHierarchy"
    marker = tmp_path / "ran"
    torch.save((_Payload(marker), {}, Data), path)
    with pytest.raises(CorruptFileError, match="not a readable processed cache"):
        dataset.load(str(path))
    assert not marker.exists()
    from torch_geometric.data.storage import GlobalStorage

    data = Data(x=torch.ones(2, 1)).to_dict()
    not_a_data_class = ((data, None, "Data"), (data, None, GlobalStorage))  # (allow-listed)
    for other in ((1, 2), ({}, 5), ([1], {}, Data), *not_a_data_class):  # readable, but not
        torch.save(other, path)  # (data, slices[, class]): errors from inside PyG before
        with pytest.raises(CorruptFileError, match=r"does not hold \(data, slices"):
            dataset.load(str(path))


@pytest.mark.parametrize("record", ["pre_transform.pt", "pre_filter.pt"])
def test_replaced_pre_processing_record_is_refused(no_env, tmp_path, record):
    """PyG reads these records with ``weights_only=False`` before the cache itself."""
    raw = write_tiny_planetoid(tmp_path / "source" / "raw")
    root = tmp_path / "data"
    first = hp.load_planetoid("Cora", root=root, raw_dir=raw)
    path = Path(first.processed_dir) / record
    assert torch.load(path, weights_only=True) == "None"  # PyG's record: a string
    marker = tmp_path / "ran"
    torch.save(_Payload(marker), path)
    with pytest.raises(CorruptFileError, match="record of a pre-processing step") as info:
        hp.load_planetoid("Cora", root=root, raw_dir=raw)
    assert info.value.path == path and not marker.exists()
    path.unlink()  # as the message says: deleting it lets the dataset load again
    assert torch.equal(hp.load_planetoid("Cora", root=root, raw_dir=raw)[0].x, first[0].x)


def test_a_record_swapped_after_its_check_runs_no_code(no_env, tmp_path, monkeypatch):
    """A writer racing the check (the record replaced between the check and PyG's read):
    PyG's read runs under weights_only too."""
    from hiergraph.datasets import processed

    raw = write_tiny_planetoid(tmp_path / "source" / "raw")
    root = tmp_path / "data"
    first = hp.load_planetoid("Cora", root=root, raw_dir=raw)
    path = Path(first.processed_dir) / "pre_transform.pt"
    marker = tmp_path / "ran"
    check = processed.check_records

    def racing(folder):
        check(folder)  # the honest record passes, then is replaced
        torch.save(_Payload(marker), path)

    monkeypatch.setattr(processed, "check_records", racing)
    with pytest.raises(CorruptFileError, match="cannot load this processed Cora cache"):
        hp.load_planetoid("Cora", root=root, raw_dir=raw)
    assert not marker.exists()


def _edit_cache(path: Path, edit) -> None:
    """Rewrite the PyG cache at ``path`` with ``edit(data: dict, slices: dict | None)``."""
    from hiergraph.datasets.processed import SAFE_CLASSES, allowing

    with allowing(SAFE_CLASSES):
        data, slices, *rest = torch.load(path, weights_only=True)
    edit(data, slices)
    torch.save((data, slices, *rest), path)


def _imdb(root, raw):
    from hiergraph.datasets.imdb import IMDB

    return IMDB(root, tokenizer="simple", raw_dir=raw)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d, s: d.pop("sentence_lengths"), "it holds no tensor 'sentence_lengths'"),
        (lambda d, s: s["x"].__setitem__(-1, 5), "its slices of 'x' do not cut its"),
        (lambda d, s: d["y"].__setitem__(0, 99), r"its labels span 0\.\.99 for 2 classes"),
        (
            lambda d, s: (d.__setitem__("y", d["y"][:-1]), s.__setitem__("y", s["y"][:-1])),
            "its slices cut different numbers of examples",
        ),
    ],
    ids=["missing field", "slices", "label", "counts"],
)
def test_caches_with_missing_fields_bad_slices_or_labels_are_refused(tmp_path, edit, match):
    """(They loaded: a bare KeyError or RuntimeError on first access, or a label past the
    classes.)"""
    from tests.datasets.fixtures import imdb_files, write_tar

    write_tar(tmp_path / "aclImdb_v1.tar.gz", imdb_files())
    dataset = _imdb(tmp_path / "imdb", tmp_path)
    _edit_cache(Path(dataset.processed_paths[0]), edit)
    with pytest.raises(CorruptFileError, match=match):
        _imdb(tmp_path / "imdb", tmp_path)


def test_a_rebuild_cut_short_leaves_no_mixed_cache(no_env, tmp_path, monkeypatch):
    """A rebuild (``force_reload``) from other raw files killed after its first split: the
    next load mixed that split with the old ones and the old vocabulary."""
    from hiergraph.datasets.imdb import IMDB
    from tests.datasets.fixtures import imdb_files, write_tar

    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir(), new.mkdir()
    write_tar(old / "aclImdb_v1.tar.gz", imdb_files())
    files = {name: "quite different words here. " * 3 for name in imdb_files()}
    write_tar(new / "aclImdb_v1.tar.gz", files)
    root = tmp_path / "imdb"
    IMDB(root, tokenizer="simple", raw_dir=old)
    save = IMDB.save

    def killed_after_one(cls, data_list, path):
        save(data_list, path)
        raise KeyboardInterrupt  # the process dies after writing the training split

    monkeypatch.setattr(IMDB, "save", classmethod(killed_after_one))
    with pytest.raises(KeyboardInterrupt):
        IMDB(root, tokenizer="simple", raw_dir=new, force_reload=True)
    monkeypatch.undo()
    again = IMDB(root, tokenizer="simple", raw_dir=new, split="test")  # rebuilt whole
    vocab = set(again.meta["vocab"])  # the new files' words alone
    assert "quite" in vocab and vocab <= {
        "<pad>",
        "<unk>",
        "quite",
        "different",
        "words",
        "here",
        ".",
    }


def test_planetoid_cache_without_features_is_refused(no_env, tmp_path):
    raw = write_tiny_planetoid(tmp_path / "source" / "raw")
    first = hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw)
    _edit_cache(Path(first.processed_paths[0]), lambda d, s: d.pop("x"))
    with pytest.raises(CorruptFileError, match="it holds no tensor 'x'"):
        hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw)


def test_a_damaged_planetoid_cache_is_rebuilt_with_force_reload(no_env, tmp_path):
    """(The error said to pass force_reload=True, which the loaders did not take.)"""
    raw = write_tiny_planetoid(tmp_path / "source" / "raw")
    first = hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw)
    Path(first.processed_paths[0]).write_bytes(b"damaged")
    with pytest.raises(CorruptFileError, match="force_reload=True"):
        hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw)
    again = hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw, force_reload=True)
    assert torch.equal(again[0].x, first[0].x)
    ppi_raw = hp.write_synthetic_ppi(tmp_path / "ppi", graphs=(2, 1, 1), nodes_per_graph=8)
    train = hp.load_ppi(root=tmp_path / "data", raw_dir=ppi_raw)[0]
    for path in train.processed_paths:
        Path(path).write_bytes(b"damaged")
    assert len(hp.load_ppi(root=tmp_path / "data", raw_dir=ppi_raw, force_reload=True)[2]) == 1


def test_a_root_that_cannot_be_written_is_no_damaged_raw_file(no_env, tmp_path, monkeypatch):
    """(A PermissionError writing the processed folder said the raw files did not fit.)"""
    raw = write_tiny_planetoid(tmp_path / "source" / "raw")

    def refuse(self, *args, **kwargs):
        raise PermissionError(
            13, "Permission denied", str(tmp_path / "data" / "Cora" / "processed")
        )

    monkeypatch.setattr(hp._Planetoid, "process", refuse)
    with pytest.raises(PermissionError, match="Permission denied"):
        hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw)


def test_stacked_fields_are_cut_per_example(tmp_path):
    """A field PyG stacks (``__cat_dim__`` is ``None``) has one entry per example."""
    from torch_geometric.data import Data, InMemoryDataset

    from hiergraph.datasets.processed import StrictLoad

    class Stacked(Data):
        def __cat_dim__(self, key, value, *args, **kwargs):
            return None if key == "y" else super().__cat_dim__(key, value, *args, **kwargs)

    class Tiny(StrictLoad, InMemoryDataset):
        cache_keys = ("x", "y")

        def __init__(self):
            super().__init__(str(tmp_path))

    dataset = Tiny()
    parts = [Stacked(x=torch.randn(n, 2), y=torch.randn(4)) for n in (2, 3, 1)]
    dataset.data, dataset.slices = InMemoryDataset.collate(parts)
    assert dataset._data.y.shape == (3, 4)
    assert dataset._cache_key_problem("y") is None and dataset._cache_key_problem("x") is None
    dataset.slices["y"] = torch.tensor([0, 1, 2])
    assert "do not cut its 3 stored entries" in dataset._cache_key_problem("y")


@pytest.mark.parametrize(
    "key, edit, match",
    [
        ("test_mask", lambda d: d["train_mask"].clone(), "train_mask and test_mask share nodes"),
        ("y", lambda d: d["y"] - 1, "not class ids"),
        ("y", lambda d: d["y"].float() + 0.5, "not class ids"),
        ("x", lambda d: d["x"].long(), "x must be float features"),
        ("edge_index", lambda d: d["edge_index"].float(), "edge_index must be int64"),
        ("edge_index", lambda d: d["edge_index"][:1], r"edge_index must be \[2, num_edges\]"),
        ("train_mask", lambda d: d["train_mask"][:50], r"train_mask must be flags \[560\]"),
        ("val_mask", lambda d: d["val_mask"][:, None].expand(-1, 10), "masks differ in shape"),
        ("test_mask", lambda d: d["test_mask"].long() * 2, "test_mask holds values other"),
        ("y", lambda d: d["y"] > 2, r"y must be \[560\] class ids, got torch.bool"),
    ],
    ids=[
        "test is train",
        "negative",
        "fractional",
        "int x",
        "float edges",
        "one row",
        "short",
        "2-d",
        "not flags",
        "bool y",
    ],  # fmt: skip
)
def test_planetoid_cache_that_holds_no_graph_is_refused_by_name(no_env, tmp_path, key, edit, match):
    """(They loaded: a test set equal to the training set, labels that fail in the loss,
    tensors that fail inside a model.)"""
    raw = write_tiny_planetoid(tmp_path / "source" / "raw")
    cache = Path(hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw).processed_paths[0])
    _edit_cache(cache, lambda d, s: d.__setitem__(key, edit(d)))
    with pytest.raises(CorruptFileError, match=f"data.pt: this processed Cora cache .*{match}"):
        hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d, m: d.__setitem__("x", d["x"].float()), "x must be an int64 vector"),
        (lambda d, m: d["x"].__setitem__(0, -4), r"its token ids span -4\.\."),
        (lambda d, m: d["x"].__setitem__(0, 10**6), r"its token ids span .*\.\.1000000"),
        (lambda d, m: d["sentence_lengths"].__setitem__(0, 999), "sentence_lengths of a document"),
        (lambda d, m: d["paragraph_sizes"].__setitem__(0, 999), "paragraph_sizes of a document"),
        (lambda d, m: m.__setitem__("classes", ["a", "b", "c"]), r"its classes \['a', 'b', 'c'\]"),
        (lambda d, m: m.__setitem__("tokenizer", "minilm"), "built by tokenizer 'minilm'"),
    ],
    ids=["float ids", "negative id", "id past vocab", "lengths", "sizes", "classes", "tokenizer"],
)
def test_text_cache_that_holds_no_documents_is_refused_by_name(tmp_path, edit, match):
    """(They loaded, and failed at some document or inside the embedding, naming no file, or
    not at all.)"""
    import json

    from tests.datasets.fixtures import imdb_files, write_tar

    write_tar(tmp_path / "aclImdb_v1.tar.gz", imdb_files())
    dataset = _imdb(tmp_path / "imdb", tmp_path)
    meta_path = Path(dataset.processed_paths[-1])
    meta = json.loads(meta_path.read_text())
    _edit_cache(Path(dataset.processed_paths[0]), lambda d, s: edit(d, meta))
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(
        CorruptFileError, match=f"simple_train.pt: this processed IMDB cache .*{match}"
    ):
        _imdb(tmp_path / "imdb", tmp_path)


@pytest.mark.parametrize(
    "damage",
    [
        lambda path: truncate(path, 0.5),
        lambda path: path.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n"),
        lambda path: path.write_bytes(b"ra  "),
        lambda path: path.write_bytes(b"jn0vxskjy zh8jrs8a4aiy5g\nb/8/rx:z8\n"),
    ],
    ids=["truncated", "text", "4 bytes", "noise"],
)
def test_damaged_processed_cache_names_the_file(no_env, tmp_path, damage):
    """(Text in the cache's place raised a bare IndexError, struct.error or KeyError from
    inside PyTorch's reader, naming no file.)"""
    write_tar(tmp_path / "aclImdb_v1.tar.gz", imdb_files())
    IMDB(tmp_path / "imdb", tokenizer="simple", raw_dir=tmp_path)
    cache = tmp_path / "imdb" / "processed" / "simple_train.pt"
    damage(cache)
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
def test_edited_cache_metadata_names_the_file(no_env, tmp_path, content):
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


@pytest.mark.parametrize(
    "vocab, match",
    [(5, "its vocabulary is no list of words"), (["a", "a"], "its vocabulary repeats words")],
)
def test_a_cache_vocabulary_that_is_no_list_of_words_names_the_file(no_env, tmp_path, vocab, match):
    """(A number raised a bare TypeError on reading the vocabulary size, a repeated word a
    ValueError naming no file.)"""
    import json

    write_tar(tmp_path / "aclImdb_v1.tar.gz", imdb_files())
    IMDB(tmp_path / "imdb", tokenizer="simple", raw_dir=tmp_path)
    meta_path = tmp_path / "imdb" / "processed" / "simple.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "vocab": vocab}))
    with pytest.raises(CorruptFileError, match=f"simple.json: {match}") as info:
        IMDB(tmp_path / "imdb", tokenizer="simple", raw_dir=tmp_path)
    assert info.value.path == meta_path


def test_a_folder_named_like_a_cache_is_refused_by_name(no_env, tmp_path):
    from hiergraph.datasets.processed import load_weights_only

    (tmp_path / "data.pt").mkdir()  # (a bare IsADirectoryError)
    with pytest.raises(CorruptFileError, match="data.pt is not a cache"):
        load_weights_only(tmp_path / "data.pt", "a cache", "it")


@pytest.mark.parametrize("name", ["simple_train.pt", "simple.json", "pre_transform.pt"])
def test_a_fifo_in_a_cache_files_place_is_refused_not_waited_on(no_env, tmp_path, name):
    """(Its read blocked without end, holding the dataset's lock.)"""
    import os

    write_tar(tmp_path / "aclImdb_v1.tar.gz", imdb_files())
    IMDB(tmp_path / "imdb", tokenizer="simple", raw_dir=tmp_path)
    path = tmp_path / "imdb" / "processed" / name
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    with pytest.raises(CorruptFileError, match="not a regular file") as info:
        IMDB(tmp_path / "imdb", tokenizer="simple", raw_dir=tmp_path)
    assert info.value.path == path


def test_reading_a_cache_keeps_what_was_allow_listed_before(tmp_path):
    """PyTorch's ``safe_globals`` context drops on exit every class it was given, also those
    that PyG and hiergraph allow-list on import: a user's own dataset read after one of
    ours warned, then read its file with ``weights_only=False``."""
    from torch_geometric.data import Data

    from hiergraph.data import SignalHierarchy
    from hiergraph.datasets.processed import (
        SAFE_CLASSES,
        allowing,
        load_weights_only,
        weights_only_loads,
    )

    class Extra:
        pass

    path = tmp_path / "cache.pt"
    torch.save(Data(x=torch.ones(2)).to_dict(), path)
    load_weights_only(path, "a cache", "it")
    with weights_only_loads():
        torch.load(path)
    with allowing([*SAFE_CLASSES, Extra]):
        assert Extra in torch.serialization.get_safe_globals()
    allowed = torch.serialization.get_safe_globals()
    assert Data in allowed and SignalHierarchy in allowed and Extra not in allowed
