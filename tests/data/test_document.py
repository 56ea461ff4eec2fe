import numpy as np
import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import Domain
from hiergraph.data.document import (
    SimpleTokenizer,
    TokenizedDocument,
    as_encoder,
    document_hierarchy,
    forest_from_lengths,
    hierarchy_from_lengths,
    split_paragraphs,
    split_sentences,
    tokenize_document,
    tokenize_documents,
)
from hiergraph.ops import hierarchical_attention

F64 = dict(dtype=torch.float64)
TEXT = "The cat sat. It was happy!\n\nA dog barked? Then it ran.<br /><br />The end."


@pytest.fixture
def tok():
    return SimpleTokenizer.fit([TEXT])


def test_segmentation():
    assert split_paragraphs("a\n\n b \n \n\nc<br /><br/>d<br />e") == ["a", "b", "c", "d e"]
    assert split_sentences('Hi there. "Yes!" he said? ok.') == [
        "Hi there.",
        '"Yes!"',
        "he said?",
        "ok.",
    ]
    assert split_sentences("e.g.x no break") == ["e.g.x no break"]


def test_simple_tokenizer(tok):
    assert SimpleTokenizer.split("Don't STOP, 42!") == ["don't", "stop", ",", "42", "!"]
    ids = tok.encode("the cat zebra")
    assert ids[2] == SimpleTokenizer.UNK and min(ids[:2]) >= 2
    assert tok.vocab[0] == "." and len(tok) == len(tok.vocab) + 2  # most frequent first
    small = SimpleTokenizer.fit(["a a b c"], max_size=1)
    assert small.vocab == ["a"] and small.encode("b") == [1]
    with pytest.raises(TypeError, match="a text must be a str, got int: 1"):  # (AttributeError)
        SimpleTokenizer.fit([1, 2])
    with pytest.raises(ValueError, match="repeated"):
        SimpleTokenizer(["a", "a"])


def test_simple_tokenizer_words_are_of_any_script():
    """(Words were ASCII letters and digits: every other letter was a token of its own,
    ``café`` two tokens and ``москва`` six.)"""
    text = "Café naïve ZÜRICH. Москва! Don’t a_b x²"
    expected = ["café", "naïve", "zürich", ".", "москва", "!", "don’t", "a", "_", "b", "x²"]
    assert SimpleTokenizer.split(text) == expected
    assert SimpleTokenizer.split("cafe\u0301") == ["caf\u00e9"]  # (a separate accent joins)
    assert SimpleTokenizer.split("東京タワー、です") == ["東京タワー", "、", "です"]


def test_texts_and_encoders_are_checked(tok):
    """A bare str was read as a list of one-character texts; an encoder that returns fewer
    token lists than sentences gave the ids to the wrong sentences; ``max_size=-1`` dropped
    the rarest word and 1.5 failed in a slice."""
    with pytest.raises(TypeError, match=r"got a str \('a cat'\); wrap one text in a list"):
        tokenize_documents("a cat", tok)
    with pytest.raises(TypeError, match="wrap one text in a list"):
        SimpleTokenizer.fit("a b c")
    with pytest.raises(ValueError, match="returned 1 token lists for 3 sentences"):
        tokenize_documents(["a b. c d. e."], tok, encoder=lambda texts: [[2]])
    with pytest.raises(ValueError, match="max_size must be a positive int or None, got -1"):
        SimpleTokenizer.fit(["a b b"], max_size=-1)
    with pytest.raises(TypeError, match="max_size must be a positive int or None, got 1.5"):
        SimpleTokenizer.fit(["a b b"], max_size=1.5)
    assert SimpleTokenizer.fit(["a b b"], max_size=np.int64(1)).vocab == ["b"]
    assert SimpleTokenizer.fit(["a b b"], max_size=None).vocab == ["b", "a"]


def test_depth_and_caps_are_ints(tok):
    """``depth=2.0`` failed in a slice and ``True`` was taken as 1; a NumPy cap was refused."""
    doc = tokenize_document(TEXT, tok)
    for depth in (2.0, True):
        with pytest.raises(TypeError, match="depth must be a positive int"):
            hierarchy_from_lengths(doc, depth)
    assert hierarchy_from_lengths(doc, np.int64(2)).num_nodes == doc.num_tokens + 6
    assert doc.truncate(max_tokens=np.int64(2))[0].num_tokens == 2
    with pytest.raises(TypeError, match="max_tokens must be a positive int or None, got 2.5"):
        doc.truncate(max_tokens=2.5)


def test_builder_structure(tok):
    h = document_hierarchy(TEXT, tok)
    # 3 paragraphs with 2, 2, 1 sentences; tokens per sentence
    expected_lengths = [4, 4, 4, 4, 3]
    num_tokens = sum(expected_lengths)
    assert h.num_leaves == num_tokens
    assert h.num_nodes == num_tokens + 5 + 3 + 1
    assert h.x.tolist() == tok.encode(TEXT.replace("<br /><br />", " "))
    leaves, sents = torch.arange(num_tokens), torch.arange(num_tokens, num_tokens + 5)
    paras, root = torch.arange(num_tokens + 5, num_tokens + 8), num_tokens + 8
    # token -> sentence, sentence -> paragraph, paragraph -> root
    sent_of_tok = torch.arange(5).repeat_interleave(torch.tensor(expected_lengths))
    assert torch.equal(h.parent[leaves], sents[sent_of_tok])
    assert torch.equal(h.parent[sents], paras[torch.tensor([0, 0, 1, 1, 2])])
    assert torch.equal(h.parent[paras], torch.full((3,), root))
    assert int(h.parent[root]) == root
    assert torch.equal(h.depth, torch.tensor([3] * num_tokens + [2] * 5 + [1] * 3 + [0]))
    # positions: index within the family on a 1-D grid
    assert h.pos[:4, 0].tolist() == [0, 1, 2, 3] and h.pos[16:19, 0].tolist() == [0, 1, 2]
    assert h.pos[sents, 0].tolist() == [0, 1, 0, 1, 0]
    assert h.pos[paras, 0].tolist() == [0, 1, 2]
    assert torch.equal(h.pos[:, 0], h.slot) and bool((h.pos[:, 1] == 0).all())
    assert bool((h.domain[:-1] == int(Domain.GRID1D)).all()) and int(h.domain[-1]) == 0
    assert h.truncation.tolist() == [[0, 0, 0, num_tokens]]
    # the tree plan accepts it (structure is valid for HSA)
    assert h.tree_index().num_leaves == num_tokens


@pytest.mark.parametrize("depth, internal", [(2, 5 + 1), (1, 1)])
def test_builder_depth(tok, depth, internal):
    h = document_hierarchy(TEXT, tok, depth=depth)
    assert h.num_nodes == h.num_leaves + internal
    assert int(h.depth.max()) == depth
    assert h.x.tolist() == document_hierarchy(TEXT, tok).x.tolist()
    if depth == 1:
        assert h.pos[: h.num_leaves, 0].tolist() == list(range(h.num_leaves))


def test_truncation_reported(tok):
    doc = tokenize_document(TEXT, tok)
    capped, rep = doc.truncate(max_tokens=10)
    assert capped.sentence_lengths.tolist() == [4, 4, 2]
    assert capped.paragraph_sizes.tolist() == [2, 1]
    assert (rep.paragraphs, rep.sentences, rep.tokens, rep.raw_tokens) == (1, 2, 9, 19)
    assert torch.equal(capped.ids, doc.ids[:10])
    _, rep = doc.truncate(max_paragraphs=1)
    assert (rep.paragraphs, rep.sentences, rep.tokens) == (2, 3, 11)
    capped, rep = doc.truncate(max_sentences=1, max_sentence_tokens=2)
    assert capped.sentence_lengths.tolist() == [2, 2, 2] and rep.sentences == 2
    assert rep.tokens == 19 - 6 and rep.truncated
    same, rep = doc.truncate(max_tokens=100)
    assert same is doc and not rep.truncated
    h = document_hierarchy(TEXT, tok, max_tokens=10)
    assert h.num_leaves == 10 and h.truncation.tolist() == [[1, 2, 9, 19]]
    batch = Batch.from_data_list([h, document_hierarchy(TEXT, tok)])
    assert batch.truncation.shape == (2, 4)


def test_builder_bad_input(tok):
    with pytest.raises(ValueError, match="no tokens"):
        document_hierarchy(" \n\n <br /> ", tok)
    with pytest.raises(ValueError, match="max_tokens must be a positive int"):
        document_hierarchy(TEXT, tok, max_tokens=0)
    with pytest.raises(ValueError, match="depth must be one of"):
        document_hierarchy(TEXT, tok, depth=4)
    with pytest.raises(TypeError, match="tokenizer must be"):
        document_hierarchy(TEXT, object())
    with pytest.raises(TypeError, match="documents must be str"):
        document_hierarchy(b"bytes", tok)
    with pytest.raises(ValueError, match="sentence_lengths sum"):
        TokenizedDocument([1, 2, 3], [2], [1])
    with pytest.raises(ValueError, match=">= 1"):
        TokenizedDocument([1, 2], [2, 0], [2])
    # an empty document would build a root with no leaves (an invalid tree)
    with pytest.raises(ValueError, match="at least one token"):
        TokenizedDocument(torch.tensor([], dtype=torch.long), [], [])
    with pytest.raises(ValueError, match="ids must be token ids >= 0, got -5"):
        TokenizedDocument([-5, 3], [2], [1])
    with pytest.raises(TypeError, match="ids must hold integers"):
        TokenizedDocument(torch.tensor([1.0, 2.5]), [2], [1])
    with pytest.raises(TypeError, match="sentence_lengths must hold integers"):
        TokenizedDocument([1, 2], [2.0], [1])
    with pytest.raises(ValueError, match="ids must be 1-D"):
        TokenizedDocument([[1, 2]], [2], [1])


def test_callable_and_hf_style_tokenizers(tok):
    # a plain callable
    h = document_hierarchy(TEXT, lambda s: [len(w) for w in s.split()])
    assert h.num_leaves == len(TEXT.replace("<br /><br />", " ").split())

    class FakeTransformersTokenizer:  # the part of the transformers API used
        def convert_tokens_to_ids(self, tokens):
            return tokens

        def __call__(self, texts, add_special_tokens=True):
            assert add_special_tokens is False
            return {"input_ids": [tok.encode(t) for t in texts]}

    h2 = document_hierarchy(TEXT, FakeTransformersTokenizer())
    assert torch.equal(h2.x, document_hierarchy(TEXT, tok).x)
    assert as_encoder(FakeTransformersTokenizer())([]) == []


def test_real_wordpiece_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    vocab = {"[UNK]": 0, "the": 1, "cat": 2, "sat": 3, ".": 4, "##s": 5}
    wp = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    h = document_hierarchy("the cats sat. the cat.", wp)
    assert h.x.tolist() == [1, 2, 5, 3, 4, 1, 2, 4]
    assert h.num_nodes == 8 + 2 + 1 + 1


def test_hierarchy_from_lengths_matches_text_builder_and_batches(tok):
    doc = tokenize_document(TEXT, tok)
    x = torch.randn(doc.num_tokens, 4)
    h = hierarchy_from_lengths(doc, 3, x=x)
    assert torch.equal(h.x, x)
    ref = document_hierarchy(TEXT, tok, depth=3)  # the same tree as building from the text
    for key in ("parent", "slot", "pos", "depth", "domain", "node_type", "edge_index"):
        assert torch.equal(getattr(h, key), getattr(ref, key)), key
    batch = Batch.from_data_list([h, h])
    assert batch.num_leaves == 2 * doc.num_tokens and batch.num_trees == 2


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_forest_equals_batched_trees(tok, depth):
    """The one-step forest builder is the PyG batch of the single trees, up to node ids."""
    texts = [TEXT, "Short one.", "A b c. D e!\n\nF g h i j k. L.", TEXT + " More words here."]
    docs = [
        tokenize_document(t, tok).truncate(max_tokens=cap)[0]
        for t, cap in zip(texts, (None, None, 9, 14), strict=True)
    ]
    forest = forest_from_lengths(docs, depth)
    batch = Batch.from_data_list([hierarchy_from_lengths(d, depth) for d in docs])
    assert torch.equal(forest.x, batch.x) and forest.num_trees == batch.num_trees == 4
    assert forest.num_nodes == batch.num_nodes

    def node_keys(h):  # (tree, depth, slot, domain, pos, parent's depth and slot) per node
        parent = h.parent
        cols = (h.batch, h.depth, h.slot, h.domain, h.pos[:, 0], h.depth[parent], h.slot[parent])
        return sorted(zip(*(c.tolist() for c in cols), strict=True))

    assert node_keys(forest) == node_keys(batch)
    gen = torch.Generator().manual_seed(depth)
    q, k, v = (torch.randn(forest.num_leaves, 2, 3, generator=gen, **F64) for _ in range(3))
    out = hierarchical_attention(q, k, v, forest)
    assert (out - hierarchical_attention(q, k, v, batch)).abs().max() <= 1e-12
    leaf_tree = forest.batch[forest.is_leaf]
    assert torch.equal(leaf_tree, batch.batch[batch.is_leaf])
    with pytest.raises(ValueError, match="docs is empty"):
        forest_from_lengths([], depth)
    with pytest.raises(ValueError, match="depth must be one of"):
        forest_from_lengths(docs, 4)


def test_forests_take_tokenized_documents_only(tok):
    """``tokenize_documents`` gives ``None`` for a document without tokens: passed on, it was
    an AttributeError inside the builder; a generator of documents was read twice (the second
    pass found none)."""
    docs = tokenize_documents([TEXT, " \n\n ", "Short one."], tok)
    assert docs[1] is None
    with pytest.raises(TypeError, match=r"docs\[1\] must be a TokenizedDocument, got NoneType: "):
        forest_from_lengths(docs)
    with pytest.raises(TypeError, match=r"docs\[0\] must be a TokenizedDocument, got str"):
        forest_from_lengths(["The cat sat."])
    with pytest.raises(TypeError, match="doc must be a TokenizedDocument, got str"):
        hierarchy_from_lengths(TEXT)
    kept = [d for d in docs if d is not None]
    assert forest_from_lengths(d for d in kept).num_trees == 2
