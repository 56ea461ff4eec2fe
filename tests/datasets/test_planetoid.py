"""Offline Planetoid/PPI loaders and the synthetic PPI fixture."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from hiergraph.datasets import planetoid as hp
from tests.conftest import needs_planetoid, planetoid_raw

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def synthetic_ppi_raw(tmp_path_factory):
    """A tiny SYNTHETIC PPI (not real data) in PyG's raw layout."""
    return hp.write_synthetic_ppi(tmp_path_factory.mktemp("synthetic_ppi") / "raw")


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


def test_missing_files_raise_a_clear_error(no_env, no_network, tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        hp.load_planetoid("CiteSeer", root=tmp_path)
    message = str(info.value)
    assert str(tmp_path / "CiteSeer" / "raw") in message
    assert "ind.citeseer.graph" in message and hp.RAW_ENV in message and "raw_dir" in message
    with pytest.raises(FileNotFoundError, match="ppi.zip"):
        hp.load_ppi(root=tmp_path, raw_dir=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="Cora, CiteSeer or PubMed"):
        hp.load_planetoid("Karate", root=tmp_path)
    with pytest.raises(ValueError, match="Cora, CiteSeer or PubMed"):
        hp.load_planetoid(None, root=tmp_path)
    with pytest.raises(ValueError, match="split must be one of public, full"):
        hp.load_planetoid("Cora", root=tmp_path, split="bogus")


def test_synthetic_ppi_layout_and_loading(no_env, no_network, synthetic_ppi_raw, tmp_path):
    names = sorted(p.name for p in synthetic_ppi_raw.iterdir())
    assert names == sorted([*hp.ppi_raw_files(), hp.SYNTHETIC_MARKER])
    train, val, test = hp.load_ppi(root=tmp_path, raw_dir=synthetic_ppi_raw)
    assert (len(train), len(val), len(test)) == (20, 2, 2)
    assert all(hp.is_synthetic(split) for split in (train, val, test))  # the marker travels
    data = train[0]
    assert data.x.shape == (30, 50) and data.y.shape == (30, 121)
    assert int(data.edge_index.max()) == 29 and data.is_undirected()
    assert (tmp_path / "PPI" / "raw" / "train_graph.json").is_symlink()


def test_ppi_graphs_number_their_nodes_from_their_first_node(no_env, no_network, tmp_path):
    """**Synthetic** PPI files. As PyG's ``PPI`` where every graph's first node has an edge;
    where it has none, the edges stay on their nodes (PyG renumbered them from the smallest
    id with an edge: every edge moved onto other nodes)."""
    raw = hp.write_synthetic_ppi(tmp_path / "src", graphs=(2, 1, 1), nodes_per_graph=8)
    ours = hp.load_ppi(root=tmp_path / "ours", raw_dir=raw)
    shutil.copytree(raw, tmp_path / "pyg" / "raw")
    pyg = [hp.PPI(str(tmp_path / "pyg"), split=s) for s in ("train", "val", "test")]
    for split_ours, split_pyg in zip(ours, pyg, strict=True):
        for a, b in zip(split_ours, split_pyg, strict=True):
            assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.x, b.x)
    links = json.loads((raw / "train_graph.json").read_text())
    links["links"] = [e for e in links["links"] if 0 not in (e["source"], e["target"])]
    (raw / "train_graph.json").write_text(json.dumps(links))
    first = hp.load_ppi(root=tmp_path / "isolated", raw_dir=raw)[0][0]
    pairs = [(e["source"], e["target"]) for e in links["links"] if e["source"] < 8]
    expected = {*pairs, *((b, a) for a, b in pairs)}  # (an undirected node-link graph)
    got = {tuple(edge) for edge in first.edge_index.t().tolist()}
    assert got == expected and 0 not in first.edge_index


def test_raw_env_links_from_a_read_only_collection(no_env, no_network, monkeypatch, tmp_path):
    collection = tmp_path / "shared"
    hp.write_synthetic_ppi(collection / "PPI" / "raw", graphs=(2, 1, 1), nodes_per_graph=8)
    collection.chmod(0o555)
    try:
        monkeypatch.setenv(hp.RAW_ENV, str(collection))
        monkeypatch.setenv(hp.DATA_ENV, str(tmp_path / "data"))
        train, _, _ = hp.load_ppi()
        assert len(train) == 2
        assert (tmp_path / "data" / "PPI" / "processed").is_dir()
    finally:
        collection.chmod(0o755)


@pytest.mark.parametrize("old_source", ["removed", "emptied"])
def test_links_into_a_removed_folder_are_replaced(no_env, no_network, tmp_path, old_source):
    """The raw folder links to where the files were found; once that folder is gone or
    emptied, the next load links the new source's files, and writes nothing through the
    old links."""
    small = dict(graphs=(2, 1, 1), nodes_per_graph=8)
    old = hp.write_synthetic_ppi(tmp_path / "old", **small)
    hp.load_ppi(root=tmp_path / "data", raw_dir=old)
    shutil.rmtree(old)
    if old_source == "emptied":
        old.mkdir()
    shutil.rmtree(tmp_path / "data" / "PPI" / "processed")
    new = hp.write_synthetic_ppi(tmp_path / "new", **small)
    train, _, _ = hp.load_ppi(root=tmp_path / "data", raw_dir=new)
    assert len(train) == 2
    for f in hp.ppi_raw_files():
        linked = tmp_path / "data" / "PPI" / "raw" / f
        assert linked.resolve() == (new / f).resolve()
    assert not old.exists() if old_source == "removed" else not any(old.iterdir())


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


def test_raw_folders_given_with_a_tilde_are_the_home_folders(no_env, tmp_path, monkeypatch):
    """(``raw_dir="~/…"`` and ``HIERGRAPH_RAW="~/…"`` searched a literal ``~`` folder.)"""
    from tests.datasets.fixtures import write_tiny_planetoid

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    write_tiny_planetoid(tmp_path / "home" / "datasets" / "Cora" / "raw")
    cora = hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir="~/datasets/Cora/raw")
    assert cora[0].num_nodes > 0
    monkeypatch.setenv("HIERGRAPH_RAW", "~/datasets")
    assert hp.load_planetoid("Cora", root=tmp_path / "other")[0].num_nodes == cora[0].num_nodes
