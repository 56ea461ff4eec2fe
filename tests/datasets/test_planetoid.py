"""The offline Planetoid loader: raw files found or explained, checked before they are read
(pickles), and refused by name when damaged."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from hiergraph.datasets import planetoid as hp
from hiergraph.datasets.errors import CorruptFileError
from tests.conftest import needs_planetoid, planetoid_raw
from tests.datasets.fixtures import truncate, trust_planetoid, write_tiny_planetoid


def test_missing_files_raise_a_clear_error(no_env, no_network, tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        hp.load_planetoid("CiteSeer", root=tmp_path)
    message = str(info.value)
    assert str(tmp_path / "CiteSeer" / "raw") in message
    assert "ind.citeseer.graph" in message and hp.RAW_ENV in message and "raw_dir" in message
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="ppi.zip"):
        hp.load_ppi(root=tmp_path, raw_dir=tmp_path / "empty")
    with pytest.raises(ValueError, match="Cora, CiteSeer or PubMed"):
        hp.load_planetoid("Karate", root=tmp_path)
    with pytest.raises(ValueError, match="Cora, CiteSeer or PubMed"):
        hp.load_planetoid(None, root=tmp_path)
    with pytest.raises(ValueError, match="split must be one of public, full"):
        hp.load_planetoid("Cora", root=tmp_path, split="bogus")


def test_a_name_in_another_case_finds_the_collections_folder(no_env, monkeypatch, tmp_path):
    """(``"cora"`` passed the name check, then searched ``$HIERGRAPH_RAW/cora/raw`` only.)"""
    write_tiny_planetoid(tmp_path / "collection" / "Cora" / "raw")
    monkeypatch.setenv(hp.RAW_ENV, str(tmp_path / "collection"))
    dataset = hp.load_planetoid("cora", root=tmp_path / "data")
    assert dataset[0].num_nodes == 560 and (tmp_path / "data" / "Cora" / "processed").is_dir()


@needs_planetoid("Cora")
def test_real_cora_public_split(no_env, no_network, tmp_path):
    data = hp.load_planetoid("Cora", root=tmp_path, raw_dir=planetoid_raw("Cora"))[0]
    assert data.num_nodes == 2708 and data.num_edges == 10556 and data.num_features == 1433
    assert [int(m.sum()) for m in (data.train_mask, data.val_mask, data.test_mask)] == [
        140,
        500,
        1000,
    ]


def test_a_raw_file_that_is_a_fifo_is_refused_not_waited_on(no_env, tmp_path):
    """(Reading a FIFO blocked forever, holding the dataset's lock; a link to /dev/zero read
    until memory ran out.)"""
    import os

    from hiergraph.datasets.download import CorruptFileError
    from tests.datasets.fixtures import write_tiny_planetoid

    raw = write_tiny_planetoid(tmp_path / "source" / "raw")
    (raw / "ind.cora.x").unlink()
    os.mkfifo(raw / "ind.cora.x")
    with pytest.raises(CorruptFileError, match="ind.cora.x: a raw file is not a regular file"):
        hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw)


def test_corrupt_planetoid_pickle_names_the_file(no_env, tmp_path):
    raw = write_tiny_planetoid(tmp_path / "src")
    data = hp.load_planetoid("Cora", root=tmp_path / "ok", raw_dir=raw)[0]
    assert data.num_nodes == 560 and int(data.train_mask.sum()) == 40
    truncate(raw / "ind.cora.graph", 0.5)
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


def test_planetoid_pickles_that_are_not_the_official_files_are_not_read(no_env, tmp_path):
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


def test_raw_files_that_read_but_do_not_fit_name_the_folder(no_env, tmp_path):
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
def test_raw_files_that_build_but_are_no_graph_are_refused(no_env, tmp_path, edit, problem):
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


MASK_KEYS = ("train_mask", "val_mask", "test_mask")


def test_geom_gcn_split_reads_the_checked_raw_folder(no_env, tmp_path):
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


def test_a_raw_file_replaced_after_its_check_is_never_read(no_env, tmp_path, monkeypatch):
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
    no_env, tmp_path, monkeypatch
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


def test_copies_left_by_a_killed_build_are_removed(no_env, tmp_path):
    raw = write_tiny_planetoid(tmp_path / "src")
    stale = tmp_path / "data" / "Cora" / ".verified-left"
    stale.mkdir(parents=True)
    hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw)
    assert not stale.exists()
