import pytest
import torch

from hiergraph.data import window_hierarchy
from hiergraph.integrations import (
    padded_block_attention,
    padded_hsa,
    padded_hub_window_hsa,
    padded_window_hsa,
    valid_token_mask,
    window_hierarchies,
)
from hiergraph.ops import hierarchical_attention_matrix
from tests.ops.test_gpu_path import opt_in

LENGTHS = [11, 16, 5]


def padded_inputs(lengths=LENGTHS, heads=2, dim=4, seed=0, length=None):
    """``q, k, v [B, H, T, d]`` and the valid tokens ``[B, T]`` (``T``: ``length`` or the
    longest)."""
    gen = torch.Generator().manual_seed(seed)
    length = length or max(lengths)
    shape = (len(lengths), heads, length, dim)
    q, k, v = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(3))
    valid = torch.arange(length) < torch.tensor(lengths)[:, None]
    return q, k, v, valid


@pytest.mark.parametrize("size_bias", [True, False])
def test_padded_hsa_matches_dense_reference_per_example(size_bias):
    q, k, v, valid = padded_inputs()
    branching = (2, 3)
    out = padded_hsa(q, k, v, valid, window_hierarchies(LENGTHS, branching), size_bias=size_bias)
    assert out.shape == (3, max(LENGTHS), 2, 4)
    for b, n in enumerate(LENGTHS):
        tree = window_hierarchy(n, branching)
        qb, kb, vb = (t[b, :, :n].transpose(0, 1) for t in (q, k, v))
        theta = hierarchical_attention_matrix(qb, kb, tree, include_self=True, size_bias=size_bias)
        expected = torch.einsum("hij,jhd->ihd", theta, vb)
        torch.testing.assert_close(out[b, :n], expected, atol=1e-12, rtol=0)
        assert (out[b, n:] == 0).all()


@pytest.mark.parametrize("size_bias", [True, False])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize(
    ("lengths", "branching"),
    [
        ([64, 37, 3, 0, 1, 64], (2, 4, 8)),
        ([24, 7, 13], (2, 3, 4)),
        ([30, 11, 2], (4, 8)),
        ([32, 32], (2, 4, 8)),  # no padding: no leaf mask
    ],
    ids=["equal-fanout", "equal-fanout-3", "ragged-top", "unpadded"],
)
def test_padded_windows_equal_the_trees_of_the_valid_tokens(lengths, branching, include_self,
                                                             size_bias):  # fmt: skip
    q, k, v, valid = padded_inputs(lengths, heads=3)
    options = dict(include_self=include_self, size_bias=size_bias)
    out = padded_window_hsa(q, k, v, valid, branching, **options)
    trees = window_hierarchies([n for n in lengths if n], branching)
    expected = padded_hsa(q, k, v, valid, trees, **options)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    assert out.is_contiguous() and (out[~valid] == 0).all()


def test_padded_windows_first_run_under_inference_mode_then_with_gradients():
    """The window forest cached per shape, first built under ``torch.inference_mode()``,
    then serves a pass with gradients (a shape no other test uses: a fresh cache entry;
    inference runs the fused passes, training the recorded op: equal up to rounding)."""
    q, k, v, valid = padded_inputs([27, 13], heads=1)
    with torch.inference_mode():
        evaluated = padded_window_hsa(q, k, v, valid, (3, 9))
    q.requires_grad_()
    out = padded_window_hsa(q, k, v, valid, (3, 9))
    out.square().sum().backward()
    torch.testing.assert_close(out, evaluated, atol=1e-12, rtol=0)
    assert q.grad.abs().sum() > 0


@pytest.mark.slow
@opt_in
def test_padded_windows_trace_with_one_break_only():
    """Under ``torch.compile`` a new batch shape's forest is built on the host, not traced
    (a shape and branching no other test uses, so the cache misses while tracing); the one
    graph break left is the host read of the padding's layout."""
    q, k, v, valid = padded_inputs([24, 17, 24, 3, 24], heads=2)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(lambda *t: padded_window_hsa(*t, (3, 2, 4)))(q, k, v, valid)
    (reason,) = explanation.break_reasons
    assert reason.user_stack[-1].filename.endswith("padded_attention.py"), reason


@pytest.mark.parametrize("padded", [True, False])
def test_padded_windows_read_either_memory_layout(padded):
    """``[B, H, T, d]`` inputs held as ``[B, T, H, d]`` memory (as transformers project
    them) and contiguous ones give the same output and gradients."""
    lengths = [16, 9, 16] if padded else [16, 16]
    q, k, v, valid = padded_inputs(lengths, heads=3)
    results = []
    for tokens_first in (False, True):
        inputs = [
            (t.transpose(1, 2).contiguous().transpose(1, 2) if tokens_first else t.clone())
            .requires_grad_()
            for t in (q, k, v)
        ]  # fmt: skip
        out = padded_window_hsa(*inputs, valid, (2, 4, 2))
        results.append((out, *torch.autograd.grad(out.pow(2).sum(), inputs)))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_padded_windows_under_left_padding_take_the_trees_of_the_valid_tokens():
    q, k, v, valid = padded_inputs([4, 6], heads=1)
    valid = valid.flip(1)
    out = padded_window_hsa(q, k, v, valid, (2, 3))
    expected = padded_hsa(q, k, v, valid, window_hierarchies([4, 6], (2, 3)))
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)


def test_flat_tree_is_softmax_with_diagonal():
    q, k, v, valid = padded_inputs()
    out = padded_hsa(q, k, v, token_mask=valid, hierarchy=window_hierarchies(LENGTHS, ()))
    logits = (q @ k.transpose(-1, -2)) * 0.5 + torch.where(valid[:, None, None], 0.0, -torch.inf)
    expected = (torch.softmax(logits, -1) @ v).transpose(1, 2)
    torch.testing.assert_close(out[valid], expected[valid], atol=1e-12, rtol=0)


def test_no_size_bias_counts_each_sibling_subtree_as_one_token():
    # uniform energies (q = k = 0), 2-level tree of m full windows of b tokens: without the
    # log n(B) bias a leaf gives 1/(b+m-1) to each leaf of its window and 1/(b(b+m-1)) to
    # each leaf of another window; with it, HSA is uniform 1/N
    b, m = 3, 4
    n = b * m
    zeros = torch.zeros(1, 1, n, 2, dtype=torch.float64)
    eye = torch.eye(n, dtype=torch.float64)[None, None]
    valid = torch.ones(1, n, dtype=torch.bool)
    tree = window_hierarchies([n], (b,))
    theta = padded_hsa(zeros, zeros, eye, valid, tree, size_bias=False)[0, :, 0]
    same = torch.arange(n)[:, None] // b == torch.arange(n)[None] // b
    inside, outside = torch.tensor([1 / (b + m - 1), 1 / (b * (b + m - 1))], dtype=torch.float64)
    expected = torch.where(same, inside, outside)
    torch.testing.assert_close(theta, expected, atol=1e-14, rtol=0)
    uniform = padded_hsa(zeros, zeros, eye, valid, tree)[0, :, 0]
    torch.testing.assert_close(uniform, torch.full((n, n), 1 / n, dtype=torch.float64))


def test_block_attention_matches_masked_softmax():
    q, k, v, valid = padded_inputs()
    block = 4
    out = padded_block_attention(q, k, v, valid, block)
    pos = torch.arange(max(LENGTHS))
    same = (pos[:, None] // block == pos[None] // block)[None, None]
    allowed = same & valid[:, None, None, :]
    logits = (q @ k.transpose(-1, -2) * 0.5).masked_fill(~allowed, -torch.inf)
    expected = (torch.softmax(logits, -1) @ v).transpose(1, 2)
    torch.testing.assert_close(out[valid], expected[valid], atol=1e-12, rtol=0)
    assert (out[~valid] == 0).all()
    with pytest.raises(ValueError, match="block"):
        padded_block_attention(q, k, v, valid, 0)
    whole = padded_block_attention(q, k, v, valid, q.size(2))  # one block: the whole sequence
    torch.testing.assert_close(padded_block_attention(q, k, v, valid, 10**6), whole)  # (4 TB)


def test_block_attention_follows_valid_tokens_under_left_padding():
    q, k, v, valid = padded_inputs([6], heads=1)
    right = padded_block_attention(q, k, v, valid, 4)
    shift = lambda t: torch.cat([torch.zeros_like(t[:, :, :3]), t], 2)  # noqa: E731
    left_valid = torch.cat([torch.zeros(1, 3, dtype=torch.bool), valid], 1)
    left = padded_block_attention(shift(q), shift(k), shift(v), left_valid, 4)
    torch.testing.assert_close(left[:, 3:], right, atol=1e-12, rtol=0)


def test_valid_token_mask_formats():
    valid = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    expected = valid.bool()
    additive = (1.0 - valid[:, None, None, :].float()) * torch.finfo(torch.float32).min
    square = additive.expand(2, 1, 4, 4)
    for mask in (valid, expected[:, None, None, :], additive, square, expected[:, None, None]):
        assert torch.equal(valid_token_mask(mask, 2, 4), expected)
    assert valid_token_mask(None, 2, 4).all()
    causal = torch.ones(4, 4, dtype=torch.bool).tril()[None, None].expand(2, 1, 4, 4)
    with pytest.raises(ValueError, match="key padding mask only"):
        valid_token_mask(causal, 2, 4)
    with pytest.raises(ValueError, match="attention mask"):
        valid_token_mask(valid, 3, 4)
    halves = valid.float() * 0.5  # (0.5 was read as attend)
    for not_binary in (additive[:, 0, 0], valid * 2, valid.float() - 0.5, halves):
        with pytest.raises(ValueError, match=r"a \[B, T\] attention mask holds 1 .* and 0"):
            valid_token_mask(not_binary, 2, 4)
    assert torch.equal(valid_token_mask(valid.float(), 2, 4), expected)  # float 0/1 is fine


def test_wrong_hierarchy_size_raises():
    q, k, v, valid = padded_inputs()
    with pytest.raises(ValueError, match="leaves"):
        padded_hsa(q, k, v, valid, window_hierarchies([11, 16, 4], (2,)))
    with pytest.raises(ValueError, match=r"\[12, 15, 5\] leaves"):  # same total, wrong split
        padded_hsa(q, k, v, valid, window_hierarchies([12, 15, 5], (2,)))


@pytest.mark.parametrize(
    "dtype, masked_value",
    [
        (torch.float32, -10000.0),  # BERT's classic extended attention mask
        (torch.float16, -1e4),
        (torch.bfloat16, -1e9),
        (torch.float32, float("-inf")),
        (torch.float64, torch.finfo(torch.float64).min),
    ],
)
def test_additive_masks_with_any_large_negative_value_mask_keys(dtype, masked_value):
    valid = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    additive = torch.zeros(2, 1, 1, 4, dtype=dtype).masked_fill(~valid[:, None, None], masked_value)
    assert torch.equal(valid_token_mask(additive, 2, 4), valid)
    square = additive.expand(2, 1, 4, 4)
    assert torch.equal(valid_token_mask(square, 2, 4), valid)


@pytest.mark.parametrize("bias", [-1.0, -20.0, 0.5, float("nan")])
def test_additive_masks_with_soft_biases_raise(bias):
    additive = torch.zeros(2, 1, 1, 4)
    additive[0, 0, 0, 1] = bias  # neither 0 (attend) nor a large negative (masked)
    with pytest.raises(ValueError, match="additive attention mask"):
        valid_token_mask(additive, 2, 4)


@pytest.mark.parametrize("as_bool", [True, False])
def test_masks_that_differ_between_heads_raise(as_bool):
    allowed = torch.ones(2, 2, 1, 3, dtype=torch.bool)
    allowed[0, 1, 0, 2] = False  # head 1 of example 0 masks key 2, head 0 does not
    mask = allowed if as_bool else torch.zeros(2, 2, 1, 3).masked_fill(~allowed, -1e9)
    with pytest.raises(ValueError, match="key padding mask only.*heads"):
        valid_token_mask(mask, 2, 3)
    square = allowed.expand(2, 2, 3, 3) if as_bool else mask.expand(2, 2, 3, 3)
    with pytest.raises(ValueError, match="key padding mask only"):
        valid_token_mask(square, 2, 3)
    same = allowed[:, :1].expand(2, 2, 1, 3)  # identical per-head copies are a padding mask
    assert torch.equal(valid_token_mask(same, 2, 3), allowed[:, 0, 0])


EMPTY = dict(
    q=torch.randn(2, 3, 0, 4),
    k=torch.randn(2, 3, 0, 4),
    v=torch.randn(2, 3, 0, 4),
    mask=torch.ones(2, 0, dtype=torch.bool),
)
PADDED_OPS = {
    "padded_hsa": lambda q, k, v, m: padded_hsa(q, k, v, m, window_hierarchies([8, 8], (2,))),
    "padded_window_hsa": lambda q, k, v, m: padded_window_hsa(q, k, v, m, (2,)),
    "padded_hub_window_hsa": lambda q, k, v, m: padded_hub_window_hsa(q, k, v, m, (2,), 2),
    "padded_block_attention": lambda q, k, v, m: padded_block_attention(q, k, v, m, 4),
}


def test_a_block_size_that_is_no_count_is_refused():
    """(2.5 failed in pad, "3" in a comparison, True was a block of 1.)"""
    from hiergraph.integrations import padded_block_attention

    q, mask = torch.randn(1, 2, 6, 4), torch.ones(1, 6, dtype=torch.bool)
    for size, error in ((2.5, TypeError), ("3", TypeError), (True, TypeError), (0, ValueError)):
        with pytest.raises(error, match="block_size must be a positive int"):
            padded_block_attention(q, q, q, mask, block_size=size)


@pytest.mark.parametrize("name", PADDED_OPS)
@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(mask=torch.ones(2, 7, dtype=torch.bool)), "token_mask must be a"),
        (dict(mask=torch.ones(2, 8)), "token_mask must be a"),
        (dict(k=torch.randn(2, 3, 8, 5)), "q and k must be"),
        (dict(q=torch.randn(3, 8, 4), k=torch.randn(3, 8, 4)), "q and k must be"),
        (dict(v=torch.randn(2, 3, 7, 4)), "v must be"),
        (dict(EMPTY), "no tokens"),
        (dict(mask=torch.ones(2, 8, dtype=torch.bool, device="meta")), "token_mask is on meta"),
    ],
)
def test_bad_shapes_raise_one_clear_error(name, bad, match):
    args = dict(q=torch.randn(2, 3, 8, 4), k=torch.randn(2, 3, 8, 4), v=torch.randn(2, 3, 8, 4),
                mask=torch.ones(2, 8, dtype=torch.bool))  # fmt: skip
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        PADDED_OPS[name](args["q"], args["k"], args["v"], args["mask"])


@pytest.mark.parametrize("name", PADDED_OPS)
@pytest.mark.parametrize(
    "dtypes",
    [(torch.long,) * 3, (torch.bool,) * 3, (torch.complex64,) * 3,
     (torch.float64, torch.float32, torch.float64)],
)  # fmt: skip
def test_non_floating_or_mixed_dtypes_raise_one_type_error(name, dtypes):
    """Integer, bool or complex features, or ``q, k, v`` of different dtypes, are refused by
    name rather than failing inside a matmul or softmax."""
    q, k, v = (torch.ones(2, 3, 8, 4, dtype=dtype) for dtype in dtypes)
    with pytest.raises(TypeError, match="q, k, v must share one floating dtype"):
        PADDED_OPS[name](q, k, v, torch.ones(2, 8, dtype=torch.bool))


@pytest.mark.slow
@opt_in
def test_compiled_padded_windows_equal_eager_for_a_second_batch_shape():
    """A compiled ``padded_window_hsa`` called on a second batch shape recompiles with
    dynamic shapes; its families of two (windows of 2) then still give eager's outputs
    (inductor once broadcast their constant weights wrongly there: errors of order 1)."""
    compiled = torch.compile(lambda *t: padded_window_hsa(*t, (2, 4)))
    torch._dynamo.reset()
    for lengths in ([16, 9, 4], [24, 13], [32, 30, 17, 8]):
        q, k, v, valid = padded_inputs(lengths, heads=2)
        with torch.no_grad():
            torch.testing.assert_close(
                compiled(q, k, v, valid), padded_window_hsa(q, k, v, valid, (2, 4)),
                atol=1e-12, rtol=0,
            )  # fmt: skip


@pytest.mark.slow
@opt_in
@pytest.mark.parametrize("dynamic", [False, None, True])
def test_compiled_padded_windows_train_on_a_second_batch_shape(dynamic, tmp_path, monkeypatch):
    """Compiled training on two batch shapes: the second shape's gradients equal eager's,
    with ``dynamic=False`` (a static recompile per shape), with the default (``None``,
    whose second shape recompiles with dynamic shapes: the families of two then have a
    symbolic size, and inductor once computed the backward of their members' products
    wrongly, gradients NaN or of order 1e+200) and with ``dynamic=True`` (which once
    failed to trace: a float default argument read first in an autograd function's
    backward)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # no kernels of other runs
    compiled = torch.compile(lambda *t: padded_window_hsa(*t, (2, 4)), dynamic=dynamic)
    torch._dynamo.reset()
    for lengths, length in (([12, 9, 15], 16), ([18, 12], 24)):  # padding in every example
        q, k, v, valid = padded_inputs(lengths, heads=2, dim=8, length=length)
        inputs = [t.requires_grad_() for t in (q, k, v)]
        results = []
        for fn in (compiled, lambda *t: padded_window_hsa(*t, (2, 4))):
            out = fn(*inputs, valid)
            results.append((out, *torch.autograd.grad(out.square().sum(), inputs)))
        for a, b in zip(*results, strict=True):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize("shape", [(0, 2, 5, 4), (2, 0, 5, 4)], ids=["no example", "no head"])
def test_empty_batches_give_empty_outputs(shape):
    """(A batch of no example, or of no head, failed in the tree builder or a reshape.)"""
    q = torch.randn(*shape)
    mask = torch.ones(shape[0], shape[2], dtype=torch.bool)
    expected = (shape[0], shape[2], shape[1], shape[3])
    assert padded_window_hsa(q, q, q, mask, (2,)).shape == expected
    assert padded_hub_window_hsa(q, q, q, mask, (2,), 1).shape == expected
