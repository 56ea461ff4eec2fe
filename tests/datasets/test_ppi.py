"""The PPI loader and the synthetic PPI fixture."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from hiergraph.datasets import ppi
from hiergraph.datasets.errors import CorruptFileError


@pytest.fixture(scope="module")
def synthetic_ppi_raw(tmp_path_factory):
    """A tiny SYNTHETIC PPI (not real data) in PyG's raw layout."""
    return ppi.write_synthetic_ppi(tmp_path_factory.mktemp("synthetic_ppi") / "raw")


def test_synthetic_ppi_layout_and_loading(no_env, no_network, synthetic_ppi_raw, tmp_path):
    names = sorted(p.name for p in synthetic_ppi_raw.iterdir())
    assert names == sorted([*ppi.ppi_raw_files(), ppi.SYNTHETIC_MARKER])
    train, val, test = ppi.load_ppi(root=tmp_path, raw_dir=synthetic_ppi_raw)
    assert (len(train), len(val), len(test)) == (20, 2, 2)
    assert all(ppi.is_synthetic(split) for split in (train, val, test))  # the marker travels
    data = train[0]
    assert data.x.shape == (30, 50) and data.y.shape == (30, 121)
    assert int(data.edge_index.max()) == 29 and data.is_undirected()
    assert (tmp_path / "PPI" / "raw" / "train_graph.json").is_symlink()


def test_ppi_graphs_number_their_nodes_from_their_first_node(no_env, no_network, tmp_path):
    """**Synthetic** PPI files. As PyG's ``PPI`` where every graph's first node has an edge;
    where it has none, the edges stay on their nodes (PyG renumbered them from the smallest
    id with an edge: every edge moved onto other nodes)."""
    raw = ppi.write_synthetic_ppi(tmp_path / "src", graphs=(2, 1, 1), nodes_per_graph=8)
    ours = ppi.load_ppi(root=tmp_path / "ours", raw_dir=raw)
    shutil.copytree(raw, tmp_path / "pyg" / "raw")
    pyg = [ppi.PPI(str(tmp_path / "pyg"), split=s) for s in ("train", "val", "test")]
    for split_ours, split_pyg in zip(ours, pyg, strict=True):
        for a, b in zip(split_ours, split_pyg, strict=True):
            assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.x, b.x)
    links = json.loads((raw / "train_graph.json").read_text())
    links["links"] = [e for e in links["links"] if 0 not in (e["source"], e["target"])]
    (raw / "train_graph.json").write_text(json.dumps(links))
    first = ppi.load_ppi(root=tmp_path / "isolated", raw_dir=raw)[0][0]
    pairs = [(e["source"], e["target"]) for e in links["links"] if e["source"] < 8]
    expected = {*pairs, *((b, a) for a, b in pairs)}  # (an undirected node-link graph)
    got = {tuple(edge) for edge in first.edge_index.t().tolist()}
    assert got == expected and 0 not in first.edge_index


def test_corrupt_ppi_file_names_the_file(no_env, tmp_path):
    raw = ppi.write_synthetic_ppi(tmp_path / "src", graphs=(2, 1, 1), nodes_per_graph=8)
    (raw / "valid_graph.json").write_text('{"nodes": [')
    with pytest.raises(CorruptFileError, match=r"valid_graph\.json.*node-link graph in JSON"):
        ppi.load_ppi(root=tmp_path / "data", raw_dir=raw)


def test_ppi_graphs_that_are_no_graphs_are_refused(no_env, tmp_path):
    raw = ppi.write_synthetic_ppi(tmp_path / "src", graphs=(2, 1, 1), nodes_per_graph=8)
    train = ppi.load_ppi(root=tmp_path / "data", raw_dir=raw)[0]
    from hiergraph.datasets.processed import SAFE_CLASSES, allowing

    path = Path(train.processed_paths[2])  # the test split's cache
    with allowing(SAFE_CLASSES):
        data, slices, *rest = torch.load(path, weights_only=True)
    data["edge_index"][0, 0] = 10**6
    torch.save((data, slices, *rest), path)
    with pytest.raises(CorruptFileError, match=r"test.pt: graph 0 is no PPI graph: .*node ids"):
        ppi.load_ppi(root=tmp_path / "data", raw_dir=raw)
