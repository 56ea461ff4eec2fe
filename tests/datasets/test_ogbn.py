"""ogbn-* wiring: OGB's dataset class and Evaluator on a tiny fixture in OGB's raw layout."""

from __future__ import annotations

import gzip
import importlib.util
import os
import shutil
import sys

import numpy as np
import pytest
import torch

from hiergraph.datasets.ogbn import load_ogbn, ogbn_dir


def _ogb_importable() -> bool:
    if importlib.util.find_spec("ogb") is None:
        return False
    try:
        import ogb.nodeproppred  # noqa: F401  (needs pandas)
    except ImportError:
        return False
    return True


needs_ogb = pytest.mark.skipif(
    not _ogb_importable(), reason="ogb (or its dependency pandas) is not installed here"
)


def _write_csv(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for row in np.atleast_2d(rows):
            f.write(",".join(str(v) for v in np.atleast_1d(row)) + "\n")


def write_tiny_arxiv(root, n=12, classes=3, seed=0):
    """A tiny **synthetic** graph in ogbn-arxiv's raw layout (OGB's file names and split)."""
    rng = np.random.default_rng(seed)
    folder = ogbn_dir("ogbn-arxiv", root)
    edges = np.stack([np.arange(n), (np.arange(n) + 1) % n], 1)
    _write_csv(folder / "raw" / "edge.csv.gz", edges)
    _write_csv(folder / "raw" / "node-feat.csv.gz", rng.normal(size=(n, 4)).round(3))
    labels = rng.integers(0, classes, size=(n, 1))
    _write_csv(folder / "raw" / "node-label.csv.gz", labels)
    _write_csv(folder / "raw" / "node_year.csv.gz", np.full((n, 1), 2020))
    _write_csv(folder / "raw" / "num-node-list.csv.gz", np.array([[n]]))
    _write_csv(folder / "raw" / "num-edge-list.csv.gz", np.array([[len(edges)]]))
    split = {"train": np.arange(0, 6), "valid": np.arange(6, 9), "test": np.arange(9, n)}
    for part, idx in split.items():
        _write_csv(folder / "split" / "time" / f"{part}.csv.gz", idx[:, None])
    (folder / "RELEASE_v1.txt").write_text("tiny synthetic fixture\n")
    return torch.from_numpy(labels.reshape(-1)), split


def test_unsupported_name(tmp_path):
    with pytest.raises(ValueError, match="ogbn-arxiv"):
        load_ogbn("ogbn-proteins", root=tmp_path)


@needs_ogb
def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"(?s)ogbn_arxiv.*switched off"):
        load_ogbn("ogbn-arxiv", root=tmp_path)  # offline (tests/datasets/conftest.py)


def test_clear_error_without_ogb(tmp_path, monkeypatch):
    """Where ``ogb`` cannot be imported (hidden here: CI installs it)."""
    for module in ("ogb", "ogb.nodeproppred"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    write_tiny_arxiv(tmp_path)
    with pytest.raises(ImportError, match="pip install ogb"):
        load_ogbn("ogbn-arxiv", root=tmp_path)


@needs_ogb
def test_tiny_fixture_through_ogb_dataset_and_evaluator(tmp_path):
    labels, split = write_tiny_arxiv(tmp_path)
    data, metric = load_ogbn("ogbn-arxiv", root=tmp_path)
    assert data.num_nodes == 12 and torch.equal(data.y, labels)
    for key, part in (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test")):
        assert torch.equal(data[key].nonzero().view(-1), torch.from_numpy(split[part]))
    pred = labels.clone()
    pred[9] = (pred[9] + 1) % 3  # one of the three test nodes is wrong
    assert metric(pred, data.test_mask) == pytest.approx(2 / 3)
    logits = torch.nn.functional.one_hot(labels, 3).float()
    assert metric(logits, data.val_mask) == 1.0


@needs_ogb
def test_ogb_never_downloads_or_asks(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("ogb tried to download or to ask on stdin")

    import ogb.nodeproppred.dataset_pyg as ogb_pyg

    monkeypatch.setattr(ogb_pyg, "download_url", no_network)
    monkeypatch.setattr("builtins.input", no_network)
    labels, _ = write_tiny_arxiv(tmp_path)
    folder = ogbn_dir("ogbn-arxiv", tmp_path)
    load_ogbn("ogbn-arxiv", root=tmp_path)  # processes the raw files
    for raw in (folder / "raw").iterdir():  # processed files alone are enough
        raw.unlink()
    data, _ = load_ogbn("ogbn-arxiv", root=tmp_path)
    assert torch.equal(data.y, labels)
    for processed in (folder / "processed").iterdir():  # neither raw nor processed files
        processed.unlink()
    with pytest.raises(FileNotFoundError, match="the folder is incomplete"):
        load_ogbn("ogbn-arxiv", root=tmp_path)
    (folder / "RELEASE_v1.txt").unlink()  # ogb would ask whether to delete the folder
    with pytest.raises(FileNotFoundError, match="RELEASE_v1.txt not found"):
        load_ogbn("ogbn-arxiv", root=tmp_path)


@needs_ogb
def test_missing_folder_is_downloaded_from_a_local_server(tmp_path, monkeypatch):
    import io
    import zipfile

    from hiergraph.datasets import ogbn
    from tests.datasets.fixtures import Server

    labels, _ = write_tiny_arxiv(tmp_path / "src")
    folder = ogbn_dir("ogbn-arxiv", tmp_path / "src")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:  # OGB's zip: one top folder named download_name
        for path in folder.rglob("*"):
            if path.is_file():
                z.write(path, f"arxiv/{path.relative_to(folder).as_posix()}")
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "arxiv.zip").write_bytes(buffer.getvalue())
    monkeypatch.delenv("HIERGRAPH_OFFLINE")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    with Server(tmp_path / "www") as server:
        meta = {"version": "1", "url": f"{server.url}/arxiv.zip", "download_name": "arxiv"}
        monkeypatch.setattr(ogbn, "_ogb_meta", lambda name: meta)
        data, _ = load_ogbn("ogbn-arxiv", root=tmp_path / "data")
        assert torch.equal(data.y, labels) and server.requests == ["/arxiv.zip"]
        assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["ogbn_arxiv"]
        usage = shutil.disk_usage(tmp_path)
        monkeypatch.setattr(ogbn.shutil, "disk_usage", lambda p: usage._replace(free=100))
        with pytest.raises(ogbn.CorruptFileError, match="unpacks to .* more than the 100 free"):
            load_ogbn("ogbn-arxiv", root=tmp_path / "full")  # (extracted in full before)
        assert not (tmp_path / "full" / "ogbn_arxiv" / "raw").exists()
        monkeypatch.setattr(ogbn, "MAX_AUTO_DOWNLOAD", 100)  # e.g. ogbn-papers100M
        with pytest.raises(ogbn.DownloadError, match="more than 100"):
            load_ogbn("ogbn-arxiv", root=tmp_path / "big")


@needs_ogb
def test_replaced_pre_processing_record_is_refused(tmp_path):
    """PyG reads ``pre_transform.pt`` with ``weights_only=False`` before ogb's own load."""
    from hiergraph.datasets.download import CorruptFileError
    from tests.datasets.test_processed import _Payload

    write_tiny_arxiv(tmp_path)
    load_ogbn("ogbn-arxiv", root=tmp_path)  # processes the raw files, writes the records
    record = ogbn_dir("ogbn-arxiv", tmp_path) / "processed" / "pre_transform.pt"
    assert torch.load(record, weights_only=True) == "None"
    marker = tmp_path / "ran"
    torch.save(_Payload(marker), record)
    with pytest.raises(CorruptFileError, match="record of a pre-processing step"):
        load_ogbn("ogbn-arxiv", root=tmp_path)
    assert not marker.exists()


@needs_ogb
@pytest.mark.parametrize(
    "file", ["split/time/split_dict.pt", "processed/geometric_data_processed.pt"]
)
def test_ogb_reads_its_files_weights_only_whatever_the_torch_default(tmp_path, monkeypatch, file):
    """ogb calls ``torch.load`` without ``weights_only``: before PyTorch 2.6 (emulated by
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``) that unpickled whatever a planted file held."""
    from hiergraph.datasets.download import CorruptFileError
    from tests.datasets.test_processed import _Payload

    write_tiny_arxiv(tmp_path)
    load_ogbn("ogbn-arxiv", root=tmp_path)  # processes the raw files, saves the split
    marker = tmp_path / "ran"
    torch.save(_Payload(marker), ogbn_dir("ogbn-arxiv", tmp_path) / file)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    before = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    with pytest.raises(CorruptFileError, match="ogb could not read it"):
        load_ogbn("ogbn-arxiv", root=tmp_path)
    assert not marker.exists()
    assert os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] == "1"  # restored
    assert os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD") == before


@needs_ogb
@pytest.mark.parametrize(
    "edit, match",
    [
        ("negative", r"the train split holds node ids -1\.\.5 for 12 nodes"),
        ("past", r"the test split holds node ids 9\.\.5000 for 12 nodes"),
        ("overlap", "train_mask and val_mask share nodes"),
        ("label", r"labels span 0\.\.99 for 40 classes"),
        ("truncated", "ogb could not read it"),
        ("float split", r"the valid split must be integer node ids \[n\], got torch.float32"),
        ("no split", "the test split must be integer node ids"),
        ("fractional", "y holds labels that are not class ids"),
    ],
)
def test_damaged_files_are_refused_by_name(tmp_path, edit, match):
    """(A negative id marked the last node as training, an overlap leaked nodes between
    splits, labels out of range loaded, a truncated file raised a bare EOFError.)"""
    from hiergraph.datasets.download import CorruptFileError

    labels, split = write_tiny_arxiv(tmp_path)
    folder = ogbn_dir("ogbn-arxiv", tmp_path)
    if edit == "negative":
        _write_csv(
            folder / "split" / "time" / "train.csv.gz", np.array([-1, 1, 2, 3, 4, 5])[:, None]
        )
    elif edit == "past":
        _write_csv(folder / "split" / "time" / "test.csv.gz", np.array([9, 10, 5000])[:, None])
    elif edit == "overlap":
        _write_csv(folder / "split" / "time" / "valid.csv.gz", np.array([5, 6, 7])[:, None])
    elif edit == "label":
        labels[3] = 99
        _write_csv(folder / "raw" / "node-label.csv.gz", labels.numpy()[:, None])
    elif edit == "truncated":
        path = folder / "raw" / "edge.csv.gz"
        path.write_bytes(path.read_bytes()[:20])
    else:  # edits of what ogb processed
        load_ogbn("ogbn-arxiv", root=tmp_path)
        if edit == "fractional":
            _edit_processed(folder, lambda data: data.__setitem__("y", data["y"].float() + 0.5))
        else:
            split = {k: torch.as_tensor(v) for k, v in split.items()}
            split["valid"] = split["valid"].float()
            if edit == "no split":
                del split["test"]
            torch.save(split, folder / "split" / "time" / "split_dict.pt")
    with pytest.raises(CorruptFileError, match=match):
        load_ogbn("ogbn-arxiv", root=tmp_path)


def _edit_processed(folder, edit) -> None:
    """Rewrite ogb's processed graph in ``folder`` with ``edit(data: dict)``."""
    from hiergraph.datasets.processed import SAFE_CLASSES, allowing

    path = folder / "processed" / "geometric_data_processed.pt"
    with allowing(SAFE_CLASSES):
        data, slices, *rest = torch.load(path, weights_only=True)
    edit(data)
    torch.save((data, slices, *rest), path)


@needs_ogb
def test_a_folder_ogb_would_read_instead_is_refused(tmp_path, monkeypatch):
    """ogb prefers ``<name>_pyg`` when it exists: it then asked on stdin whether to delete
    that folder (and deleted it on 'y')."""
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("asked on stdin"))
    write_tiny_arxiv(tmp_path)
    keep = ogbn_dir("ogbn-arxiv", tmp_path).with_name("ogbn_arxiv_pyg") / "keep"
    keep.mkdir(parents=True)
    with pytest.raises(FileExistsError, match="ogbn_arxiv_pyg exists: ogb reads ogbn-arxiv"):
        load_ogbn("ogbn-arxiv", root=tmp_path)
    assert keep.exists()


@needs_ogb
def test_unlabelled_nodes_and_machine_errors(tmp_path, monkeypatch):
    """NaN labels mark unlabelled nodes (most of ogbn-papers100M's): they load. A root that
    cannot be written is no damaged dataset (it was reported as one, with advice to delete
    the folder)."""
    labels, _ = write_tiny_arxiv(tmp_path)
    folder = ogbn_dir("ogbn-arxiv", tmp_path)
    rows = [[float("nan")] if i in (0, 11) else [int(y)] for i, y in enumerate(labels)]
    _write_csv(folder / "raw" / "node-label.csv.gz", np.array(rows))
    data, metric = load_ogbn("ogbn-arxiv", root=tmp_path)
    assert data.y[[0, 11]].isnan().all() and metric(labels, data.test_mask) == 1.0

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(folder / "processed"))

    import ogb.nodeproppred.dataset_pyg as ogb_pyg

    monkeypatch.setattr(ogb_pyg.PygNodePropPredDataset, "process", refuse)
    shutil.rmtree(folder / "processed")
    with pytest.raises(PermissionError, match="Permission denied"):
        load_ogbn("ogbn-arxiv", root=tmp_path)


@needs_ogb
def test_integer_split_ids_of_any_width_load(tmp_path):
    _, split = write_tiny_arxiv(tmp_path)
    folder = ogbn_dir("ogbn-arxiv", tmp_path)
    load_ogbn("ogbn-arxiv", root=tmp_path)
    torch.save({k: torch.as_tensor(v, dtype=torch.int32) for k, v in split.items()},
               folder / "split" / "time" / "split_dict.pt")  # fmt: skip
    data, _ = load_ogbn("ogbn-arxiv", root=tmp_path)
    assert data.test_mask.nonzero().view(-1).tolist() == split["test"].tolist()
