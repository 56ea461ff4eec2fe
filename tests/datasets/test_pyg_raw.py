"""Raw folders of the PyG loaders: raw files linked from ``raw_dir=`` or ``$HIERGRAPH_RAW``
into ``<root>/<Name>/raw``."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from hiergraph.datasets import planetoid as hp


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


def test_raw_folders_given_with_a_tilde_are_the_home_folders(no_env, tmp_path, monkeypatch):
    """(``raw_dir="~/…"`` and ``HIERGRAPH_RAW="~/…"`` searched a literal ``~`` folder.)"""
    from tests.datasets.fixtures import write_tiny_planetoid

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    write_tiny_planetoid(tmp_path / "home" / "datasets" / "Cora" / "raw")
    cora = hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir="~/datasets/Cora/raw")
    assert cora[0].num_nodes > 0
    monkeypatch.setenv("HIERGRAPH_RAW", "~/datasets")
    assert hp.load_planetoid("Cora", root=tmp_path / "other")[0].num_nodes == cora[0].num_nodes


def test_a_forced_rebuild_reads_the_files_raw_dir_names_now(no_env, no_network, tmp_path):
    """**Synthetic** PPI files. After ``raw_dir=`` points at other files for the same root,
    ``force_reload=True`` rebuilds from them, and the synthetic marker of the files they
    replace goes (it rebuilt from the first files the raw folder had linked)."""
    small = dict(graphs=(2, 1, 1), nodes_per_graph=8)
    first = hp.write_synthetic_ppi(tmp_path / "first", **small, seed=0)
    other = hp.write_synthetic_ppi(tmp_path / "other", **small, seed=1)
    (other / hp.SYNTHETIC_MARKER).unlink()  # (as the real files have none)
    hp.load_ppi(root=tmp_path / "data", raw_dir=first)
    assert hp.is_synthetic(hp.load_ppi(root=tmp_path / "data", raw_dir=other)[0])  # the cache
    train, _, _ = hp.load_ppi(root=tmp_path / "data", raw_dir=other, force_reload=True)
    features = np.load(other / "train_feats.npy")
    assert torch.equal(train._data.x, torch.from_numpy(features).to(train._data.x.dtype))
    assert not hp.is_synthetic(train)
    for f in hp.ppi_raw_files():  # the files stay where they are: linked, never written
        assert (tmp_path / "data" / "PPI" / "raw" / f).resolve() == (other / f).resolve()
    assert (first / hp.SYNTHETIC_MARKER).exists()


def test_a_forced_rebuild_from_the_raw_folder_itself_keeps_its_files(no_env, tmp_path):
    """``raw_dir=`` naming the raw folder the files are in (or ``$HIERGRAPH_RAW`` holding
    it): a forced rebuild links nothing onto itself."""
    from tests.datasets.fixtures import write_tiny_planetoid

    raw = tmp_path / "data" / "Cora" / "raw"
    write_tiny_planetoid(raw)
    nodes = hp.load_planetoid("Cora", root=tmp_path / "data")[0].num_nodes
    again = hp.load_planetoid("Cora", root=tmp_path / "data", raw_dir=raw, force_reload=True)
    assert again[0].num_nodes == nodes
    assert not any(path.is_symlink() for path in raw.iterdir())
