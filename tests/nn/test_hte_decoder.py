"""HTE decoder: cached decoding equals the full pass; the flat mode is softmax attention."""

import copy
import random

import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import SignalHierarchy, from_nested, window_hierarchy
from hiergraph.nn import HTEDecoder, append_schedule, from_schedule
from tests.conftest import relative_error, rounding_error


def random_schedule(rng, length):
    """document -> sentences -> words -> tokens, as (close, open) events."""
    events = [(0, 2)]
    for _ in range(length - 1):
        r = rng.random()
        events.append((2, 2) if r < 0.08 else (1, 1) if r < 0.35 else (0, 0))
    return events


def model(mode, **kw):
    torch.manual_seed(0)
    config = dict(vocab_size=20, hidden_channels=16, num_layers=2, heads=2, pos_channels=8,
                  max_slot=64)  # fmt: skip
    return HTEDecoder(**{**config, **kw}, attention=mode).double().eval()


@pytest.mark.parametrize("mode", ["hsa", "flat"])
def test_cached_decoding_equals_full_pass(mode):
    rng = random.Random(0)
    trees = [from_schedule(random_schedule(rng, n)) for n in (20, 12)]
    batch = Batch.from_data_list(trees)
    tokens = torch.randint(0, 20, (32,), generator=torch.Generator().manual_seed(1))
    net = model(mode)
    with torch.no_grad():
        full = net(tokens, batch)
    for tree, offset in ((trees[0], 0), (trees[1], 20)):
        caches = net.new_cache()
        steps = [
            net.step(int(tokens[offset + i]), caches, close, open_)
            for i, (close, open_) in enumerate(append_schedule(tree).tolist())
        ]
        assert (torch.stack(steps) - full[offset : offset + len(steps)]).abs().max() < 1e-10


def test_a_bf16_decoder_generates_what_its_full_pass_computes():
    """A decoder cast to bf16 decodes 2,048 tokens of a window tree (its caches bf16 too)
    with logits as close to its own full pass as twice the rounding of a float64 copy's
    logits to bf16: the caches keep their running sums in float32. With bf16 stores the
    steps drifted 0.9% from the full pass (5.6 times that), more the longer the sequence."""
    tree = window_hierarchy(2048, (16, 8))
    tokens = torch.randint(0, 50, (2048,), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    net = HTEDecoder(50, 64, 2, 4).bfloat16().eval()
    with torch.no_grad():
        full = net(tokens, tree).double()
        exact = copy.deepcopy(net).double()(tokens, tree)
    caches = net.new_cache()
    steps = torch.stack(
        [
            net.step(int(tokens[i]), caches, close, open_)
            for i, (close, open_) in enumerate(append_schedule(tree).tolist())
        ]
    )
    assert relative_error(steps, full) <= 2 * rounding_error(exact, torch.bfloat16)
    assert steps.dtype == torch.bfloat16


@pytest.mark.parametrize("mode", ["hsa", "flat"])
def test_prefill_then_steps_equal_the_full_pass(mode):
    """A prompt of every length through ``prefill``, then ``step``: the full pass's logits,
    the prompt's included."""
    events = random_schedule(random.Random(7), 24)
    tree = from_schedule(events)
    tokens = torch.randint(0, 20, (24,), generator=torch.Generator().manual_seed(8))
    net = model(mode)
    with torch.no_grad():
        full = net(tokens, tree)
    for size in (1, 2, 9, 23, 24):
        caches = net.new_cache()
        logits = [net.prefill(tokens[:size], from_schedule(events[:size]), caches)]
        for i in range(size, 24):
            logits.append(net.step(int(tokens[i]), caches, *events[i])[None])
        assert (torch.cat(logits) - full).abs().max() < 1e-10, size


@pytest.mark.parametrize("mode", ["hsa", "flat"])
def test_sequences_on_one_tree_decode_together(mode):
    """``B`` prompts on one tree through one ``prefill`` and batched ``step`` s (caches for
    ``B`` sequences): each sequence's logits are those of its own full pass."""
    events = random_schedule(random.Random(3), 20)
    tree = from_schedule(events)
    tokens = torch.randint(0, 20, (3, 20), generator=torch.Generator().manual_seed(4))
    net = model(mode)
    with torch.no_grad():
        full = torch.stack([net(row, tree) for row in tokens])  # [3, 20, V]
    for size in (1, 8, 20):
        caches = net.new_cache(sequences=3)
        logits = [net.prefill(tokens[:, :size], from_schedule(events[:size]), caches)]
        for i in range(size, 20):
            logits.append(net.step(tokens[:, i], caches, *events[i])[:, None])
        assert (torch.cat(logits, 1) - full).abs().max() < 1e-10, size


def test_sequences_must_match_their_caches():
    events = random_schedule(random.Random(9), 6)
    tree, tokens, net = from_schedule(events), torch.zeros(2, 6, dtype=torch.long), model("hsa")
    with pytest.raises(ValueError, match=r"new_cache\(sequences=2\); these hold 1"):
        net.prefill(tokens, tree, net.new_cache())
    with pytest.raises(ValueError, match=r"new_cache\(sequences=1\); these hold 2"):
        net.prefill(tokens[0], tree, net.new_cache(sequences=2))
    caches = net.new_cache(sequences=2)
    net.prefill(tokens, tree, caches)
    with pytest.raises(ValueError, match=r"new_cache\(sequences=3\)"):
        net.step(torch.zeros(3, dtype=torch.long), caches)
    with pytest.raises(ValueError, match=r"an int or \[B\]"):
        net.step(tokens, caches)
    with pytest.raises(ValueError, match="sequences"):
        net.new_cache(sequences=0)
    assert net.step(torch.zeros(2, dtype=torch.long), caches, 1, 0).shape == (2, 20)


def test_bad_prefills():
    events = random_schedule(random.Random(9), 6)
    tree = from_schedule(events)
    tokens = torch.zeros(6, dtype=torch.long)
    net = model("hsa")
    caches = net.new_cache()
    with pytest.raises(ValueError, match="2 empty caches"):
        net.prefill(tokens, tree, caches[:1])
    with pytest.raises(ValueError, match="one tree"):
        net.prefill(torch.cat([tokens, tokens]), Batch.from_data_list([tree, tree]), caches)
    net.prefill(tokens, tree, caches)
    with pytest.raises(ValueError, match="2 empty caches"):
        net.prefill(tokens, tree, caches)


@pytest.mark.parametrize("attention", ["hsa", "flat"])
def test_a_step_with_the_wrong_caches_writes_none(attention):
    """(A cache too few appended the token to the first ones, then failed in zip.)"""
    net = model(attention)
    caches = net.new_cache()
    net.step(1, caches)
    other = net.new_cache()
    for wrong in (caches[:1], [*caches, other[0]], [caches[0], other[1]], []):
        with pytest.raises(ValueError, match="step takes 2 caches, one per layer"):
            net.step(1, wrong)
    assert [cache.num_tokens for cache in (*caches, *other)] == [1, 1, 0, 0]
    net.step(1, tuple(caches))  # any sequence of caches
    assert [cache.num_tokens for cache in caches] == [2, 2]


def test_an_evaluation_under_inference_mode_then_training():
    """The causal plan first built under ``torch.inference_mode()`` serves training."""
    batch = Batch.from_data_list([from_schedule(random_schedule(random.Random(2), 14))])
    tokens = torch.randint(0, 20, (14,), generator=torch.Generator().manual_seed(3))
    net = model("hsa").train()
    with torch.inference_mode():
        evaluated = net(tokens, batch)
    logits = net(tokens, batch)
    logits.logsumexp(-1).sum().backward()
    assert torch.allclose(logits, evaluated, atol=1e-12)
    assert all(p.grad is not None for p in net.parameters() if p.requires_grad)


def test_gapped_slots_decode_like_the_full_pass():
    # slots only order siblings: gaps (root slots [0, 3], ...) must not change the model
    parent = [-1, 0, 0, 1, 1, 2, 2, 2]
    gapped = SignalHierarchy.from_parent(parent, slot=[0, 0, 3, 2, 5, 0, 4, 9])
    dense = SignalHierarchy.from_parent(parent)
    assert not torch.equal(gapped.slot, dense.slot)
    other = from_schedule(random_schedule(random.Random(6), 7))
    tokens = torch.randint(0, 20, (12,), generator=torch.Generator().manual_seed(6))
    net = model("hsa")
    with torch.no_grad():
        full = net(tokens[:5], gapped)
        assert (full - net(tokens[:5], dense)).abs().max() < 1e-12
        batched = net(tokens, Batch.from_data_list([gapped, other]))
    assert (batched[:5] - full).abs().max() < 1e-12
    caches = net.new_cache()
    steps = [
        net.step(int(tokens[i]), caches, close, open_)
        for i, (close, open_) in enumerate(append_schedule(gapped).tolist())
    ]
    assert (torch.stack(steps) - full).abs().max() < 1e-10


def test_flat_mode_is_hsa_on_the_flat_tree():
    flat_tree = window_hierarchy(25, ())
    tokens = torch.randint(0, 20, (25,), generator=torch.Generator().manual_seed(2))
    hsa, flat = model("hsa"), model("flat")
    with torch.no_grad():
        assert torch.allclose(hsa(tokens, flat_tree), flat(tokens, flat_tree), atol=1e-10)


def test_logits_do_not_see_the_future():
    tree = from_schedule(random_schedule(random.Random(3), 40))
    tokens = torch.randint(0, 20, (40,), generator=torch.Generator().manual_seed(3))
    changed = tokens.clone()
    changed[25:] = (changed[25:] + 7) % 20
    net = model("hsa")
    with torch.no_grad():
        assert torch.equal(net(tokens, tree)[:25], net(changed, tree)[:25])


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(heads=0), ValueError, "heads must be a positive int, got 0"),  # (was 1 / 0)
        (dict(vocab_size=0), ValueError, "vocab_size must be a positive int"),
        (dict(num_layers=0), ValueError, "num_layers must be a positive int, got 0"),
        (dict(hidden_channels=2.5), TypeError, "hidden_channels must be a positive int"),
        (dict(mlp_channels=0), ValueError, "mlp_channels must be a positive int or None"),
        (dict(pos_channels=-1), ValueError, "pos_channels must be an int >= 0"),
        (dict(max_depth=0), ValueError, "max_depth must be a positive int, got 0"),
        (dict(max_slot=0), ValueError, "max_slot must be a positive int"),
        (dict(dropout=1.5), ValueError, r"dropout must be a probability in \[0, 1\]"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        HTEDecoder(**{"vocab_size": 10, **kwargs})


def test_bad_inputs():
    with pytest.raises(ValueError, match="attention"):
        HTEDecoder(10, attention="sparse")
    step_net = HTEDecoder(10, hidden_channels=8, num_layers=1, heads=2)
    for token in (-1, 10, 2.0, True):  # (-1 read the last id's embedding)
        with pytest.raises(ValueError, match=r"token must be an id in \[0, 10\)"):
            step_net.step(token, step_net.new_cache(), 0, 1)
    for tokens in (torch.tensor([-1]), torch.tensor([3, 10])):
        with pytest.raises(ValueError, match=r"token ids span .* \[0, vocab_size = 10\)"):
            step_net.step(tokens, step_net.new_cache(len(tokens)), 0, 1)
    net = model("hsa", max_depth=2)
    tree = from_schedule(random_schedule(random.Random(4), 10))
    with pytest.raises(ValueError, match="tokens must be"):
        net(torch.zeros(9, dtype=torch.long), tree)
    with pytest.raises(ValueError, match=r"token ids span 0\.\.20; .*vocab_size = 20\)"):
        model("flat")(torch.tensor([0] * 9 + [20]), tree)
    with pytest.raises(ValueError, match="max_depth"):
        net(torch.zeros(10, dtype=torch.long), tree)
    other = from_nested([list(range(5)), list(range(5, 10))])  # 10 leaves, another shape
    assert other.num_nodes != tree.num_nodes
    with pytest.raises(ValueError, match="plan is of a forest of .* nodes, the hierarchy has"):
        net(torch.zeros(10, dtype=torch.long), tree, plan=other.causal_plan())  # (size error)
    with pytest.raises(ValueError, match="invalid"):
        from_schedule([(0, 1), (3, 0)])


def test_token_ids_of_any_integer_dtype_and_nothing_else():
    """Byte-level ids (uint8) and narrow ints give the int64 logits (torch's embedding takes
    int32 and int64 only); floats, bools and lists are a TypeError naming the tokens (an
    error of the embedding's indices, or an AttributeError, before)."""
    net = model("hsa")
    tree = from_schedule(random_schedule(random.Random(5), 10))
    tokens = torch.randint(0, 20, (10,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = net(tokens, tree)
        for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32):
            assert torch.equal(net(tokens.to(dtype), tree), expected)
        step = net.step(tokens[:1].to(torch.uint8), net.new_cache(), 0, 2)
        assert torch.equal(step, net.step(tokens[:1], net.new_cache(), 0, 2))
    for bad in (tokens.double(), tokens.bool(), tokens.tolist()):
        with pytest.raises(TypeError, match="tokens must be an integer tensor of token ids"):
            net(bad, tree)
        with pytest.raises(TypeError, match="tokens must be an integer tensor"):
            net.prefill(bad, tree, net.new_cache())
    with pytest.raises(TypeError, match="token must be an integer tensor of token ids"):
        net.step(torch.tensor([3.0]), net.new_cache(), 0, 2)


def test_the_old_name_of_hidden_channels():
    with pytest.warns(FutureWarning, match="'channels' is now called 'hidden_channels'"):
        old = HTEDecoder(10, channels=8, num_layers=1, heads=2)
    assert old.embed.embedding_dim == 8
