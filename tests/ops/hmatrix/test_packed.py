"""H-matrix attention's fast path (:mod:`hiergraph.ops.hmatrix.packed`): against the
dense reference and exact softmax, its invariants, its internals and its custom ops
under ``torch.compile``."""

import math
import operator
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from hiergraph.data.windows import hmatrix_layout, hmatrix_window_hierarchy
from hiergraph.nn.pool import coarsen_leaves
from hiergraph.ops.hmatrix import (
    hmatrix_attention,
    hmatrix_attention_dense,
    hmatrix_attention_matrix,
    hmatrix_logits,
)
from hiergraph.ops.hmatrix.packed import (
    _OP_SUFFIX,
    _backward_op,
    _band,
    _band_bmm,
    _child_weights,
    _coarse_pack,
    _forward,
    _forward_op,
    _key_grad,
    _levels,
    _packed_counts,
    _Plan,
    _source_digest,
    _unmasked_counts,
)
from tests.conftest import (
    assert_same_gradients,
    relative_error,
    rounding_error,
    unordered_backward_nodes,
)
from tests.ops.hmatrix import qkv as _qkv

CASES = [(16, 2), (64, 4), (128, 8), (256, 16), (100, 8), (37, 2), (5, 4)]


def _softmax_attention(q, k, v, causal):
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        length = q.shape[2]
        logits = logits.masked_fill(torch.ones(length, length).triu(1).bool(), -math.inf)
    return torch.softmax(logits, -1) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length, block_size", [(8, 4), (10, 6), (7, 8), (1, 2)])
def test_single_level_is_exact_softmax(length, block_size, causal):
    q, k, v = _qkv(length)
    assert hmatrix_layout(length, block_size).num_levels == 1
    expected = _softmax_attention(q, k, v, causal)
    torch.testing.assert_close(hmatrix_attention(q, k, v, block_size, causal), expected)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length, block_size", [(64, 4), (100, 8)])
def test_partition_of_unity_with_zero_queries_and_keys(length, block_size, causal):
    _, _, v = _qkv(length)
    zeros = torch.zeros_like(v)
    out = hmatrix_attention(zeros, zeros, v, block_size, causal)
    if causal:
        counts = torch.arange(1, length + 1, dtype=v.dtype).view(length, 1)
        expected = v.cumsum(2) / counts
    else:
        expected = v.mean(2, keepdim=True).expand_as(v)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length, block_size", CASES)
def test_fast_matches_implied_dense(length, block_size, causal):
    q, k, v = _qkv(length)
    fast = hmatrix_attention(q, k, v, block_size, causal)
    dense = hmatrix_attention_dense(q, k, v, block_size, causal)
    torch.testing.assert_close(fast, dense, atol=1e-12, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_fast_matches_dense_with_padding_and_gradients(causal):
    q, k, v = (x.requires_grad_() for x in _qkv(45, batch=2))
    mask = torch.zeros(2, 45, dtype=torch.bool)
    mask[0, 40:], mask[1, 3:7] = True, True
    fast = hmatrix_attention(q, k, v, 4, causal, mask)
    dense = hmatrix_attention_dense(q, k, v, 4, causal, mask)
    torch.testing.assert_close(fast, dense, atol=1e-12, rtol=0)
    assert_same_gradients(fast, dense, (q, k, v), atol=1e-11, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(causal):
    q, k, v = (x.requires_grad_() for x in _qkv(11, dim=2, batch=1, heads=2))
    mask = torch.zeros(1, 11, dtype=torch.bool)
    mask[0, 2] = True
    assert torch.autograd.gradcheck(
        lambda a, b, c: hmatrix_attention(a, b, c, 2, causal, mask), (q, k, v)
    )


@pytest.mark.parametrize("causal", [False, True])
def test_backward_adds_rows_in_index_order(causal):
    """No ``x[index]`` gather (unordered atomic adds in its CPU backward) in the fast path
    or in the implied dense matrix, whose coarse rows repeat."""
    q, k, v = (t.requires_grad_() for t in _qkv(40))
    assert unordered_backward_nodes(hmatrix_attention(q, k, v, 4, causal)) == []
    assert unordered_backward_nodes(hmatrix_attention_matrix(q, k, 4, causal)) == []


@pytest.mark.parametrize("causal", [False, True])
def test_exact_for_piecewise_constant_queries_and_keys(causal):
    length, block_size = 64, 4  # M = 4 levels, chunks of 2^(M-1) = 8 tokens
    q, k, v = _qkv(length // 8)
    q, k = q.repeat_interleave(8, 2), k.repeat_interleave(8, 2)
    v = torch.randn(2, 3, length, 4, dtype=torch.float64)
    expected = _softmax_attention(q, k, v, causal)
    torch.testing.assert_close(hmatrix_attention(q, k, v, block_size, causal), expected)


@pytest.mark.parametrize("causal", [False, True])
def test_row_stochastic_and_convex(causal):
    q, k, v = _qkv(100)
    matrix = hmatrix_attention_matrix(q, k, 8, causal)
    torch.testing.assert_close(matrix.sum(-1), torch.ones(2, 3, 100, dtype=torch.float64))
    constant = torch.tensor([1.5, -2.0, 0.0, 3.0], dtype=torch.float64).expand_as(v)
    torch.testing.assert_close(hmatrix_attention(q, k, constant, 8, causal), constant)
    out = hmatrix_attention(q, k, v, 8, causal)
    assert (out <= v.amax(2, keepdim=True) + 1e-12).all()
    assert (out >= v.amin(2, keepdim=True) - 1e-12).all()


def test_causal_never_sees_the_future():
    q, k, v = _qkv(96)
    t = 41
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, t + 1 :] = torch.randn_like(x[:, :, t + 1 :]) * 10
    before = hmatrix_attention(q, k, v, 4, causal=True)[:, :, : t + 1]
    after = hmatrix_attention(q2, k2, v2, 4, causal=True)[:, :, : t + 1]
    torch.testing.assert_close(before, after, atol=1e-13, rtol=0)

    # Negative control: mean-coarsened queries (non-causal coarsening, causal level map) leak.
    def mean_query_causal(q, k, v):
        logits = hmatrix_logits(q, k, 4).masked_fill(torch.ones(96, 96).triu(1).bool(), -math.inf)
        return (torch.softmax(logits, -1) @ v)[:, :, : t + 1]

    assert (mean_query_causal(q, k, v) - mean_query_causal(q2, k2, v2)).abs().max() > 1e-3


@pytest.mark.parametrize("causal", [False, True])
def test_stable_at_large_logits(causal):
    q, k, v = _qkv(128, dim=8, dtype=torch.float32, seed=3)
    q, k = q * 30, k * 30  # logits ~ 1e3
    out = hmatrix_attention(q, k, v, 8, causal)
    assert torch.isfinite(out).all()
    reference = hmatrix_attention_dense(q.double(), k.double(), v.double(), 8, causal)
    assert hmatrix_logits(q.double(), k.double(), 8, causal).nan_to_num(0, 0, 0).abs().max() > 500
    torch.testing.assert_close(out.double(), reference, atol=2e-3, rtol=0)  # fp32 logit rounding
    out64 = hmatrix_attention(q.double(), k.double(), v.double(), 8, causal)
    torch.testing.assert_close(out64, reference, atol=1e-10, rtol=0)


@pytest.mark.parametrize("fill", [1e3, float("nan"), float("inf")])
@pytest.mark.parametrize("causal", [False, True])
def test_padding_contents_do_not_matter(fill, causal):
    q, k, v = _qkv(50)
    mask = torch.zeros(2, 50, dtype=torch.bool)
    mask[:, 10:13], mask[1, 44:] = True, True
    q2, k2, v2 = (x.masked_fill(mask[:, None, :, None], fill) for x in (q, k, v))
    out = hmatrix_attention(q, k, v, 4, causal, key_padding_mask=mask)
    torch.testing.assert_close(out, hmatrix_attention(q2, k2, v2, 4, causal, key_padding_mask=mask))
    assert (out[mask[:, None, :, None].expand_as(out)] == 0).all()
    # the dense reference too (a padded NaN reached the valid rows through a zero weight)
    reference = hmatrix_attention_dense(q2, k2, v2, 4, causal, key_padding_mask=mask)
    torch.testing.assert_close(reference, out)


def test_heads_and_batch_are_independent():
    q, k, v = _qkv(40)
    out = hmatrix_attention(q, k, v, 4)
    perm = torch.tensor([2, 0, 1])
    torch.testing.assert_close(
        hmatrix_attention(q[:, perm], k[:, perm], v[:, perm], 4), out[:, perm]
    )
    torch.testing.assert_close(hmatrix_attention(q[1:], k[1:], v[1:], 4), out[1:])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("attention", [hmatrix_attention, hmatrix_attention_dense])
def test_an_empty_batch_no_heads_or_no_tokens_give_an_empty_output(attention, causal):
    """As :func:`~torch.nn.functional.scaled_dot_product_attention` (sequences of length 0
    were refused)."""
    for shape in ((0, 3, 40, 4), (2, 0, 40, 4), (2, 3, 0, 4)):
        q = torch.randn(shape, requires_grad=True)
        mask = torch.zeros(shape[0], shape[2], dtype=torch.bool)
        out = attention(q, q, q[..., :3], 4, causal, key_padding_mask=mask)
        assert out.shape == (*shape[:3], 3)
        out.sum().backward()
        assert q.grad.shape == shape


class _LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in out if isinstance(out, tuple | list) else [out]:
            if isinstance(x, torch.Tensor):
                self.largest = max(self.largest, x.numel())
        return out


@pytest.mark.parametrize("causal", [False, True])
def test_linear_cost(causal):
    dim, block_size, flops = 8, 8, {}
    for length in (512, 1024, 2048):
        q, k, v = _qkv(length, dim=dim, batch=1, heads=1, dtype=torch.float32)
        counter, largest = FlopCounterMode(display=False), _LargestTensor()
        with counter, largest:
            hmatrix_attention(q, k, v, block_size, causal)
        nr, levels, padded = hmatrix_layout(length, block_size)
        width = 2 if causal else 3  # blocks per band: (left, own[, right])
        logits = width * nr * nr * (2 * padded // nr + levels - width)  # documented closed form
        assert counter.get_total_flops() == 2 * (dim + dim + 1) * logits
        assert largest.largest <= 4 * length * (3 * nr + dim)  # never O(L^2)
        flops[length] = counter.get_total_flops()
    assert 1.9 < flops[1024] / flops[512] < 2.1 and 1.9 < flops[2048] / flops[1024] < 2.1


def test_levels_are_the_window_hierarchy():
    """Coarse tokens of the fast path = leaf means/sums of hmatrix_window_hierarchy's nodes."""
    length, block_size = 64, 4
    layout = hmatrix_layout(length, block_size)
    x = torch.randn(1, 1, length, 3, dtype=torch.float64)
    plan = _Plan(block_size, 3, 1.0, tuple(length >> l for l in range(layout.num_levels)), length)
    child = _child_weights(_packed_counts(None, x, plan), plan)
    means = _levels(_coarse_pack((x,), None, plan, child)[0], plan, dim=2)
    sums = _levels(_coarse_pack((x,), None, plan)[0], plan, dim=2)
    hierarchy, pooled_mean, pooled_sum = (
        hmatrix_window_hierarchy(length, block_size),
        x[0, 0],
        x[0, 0],
    )
    assert int(hierarchy.is_leaf.sum()) == length
    for level in range(layout.num_levels):
        torch.testing.assert_close(means[level][0, 0], pooled_mean)
        torch.testing.assert_close(sums[level][0, 0], pooled_sum)
        pooled_mean, coarse, _ = coarsen_leaves(pooled_mean, hierarchy, "mean")
        pooled_sum, _, _ = coarsen_leaves(pooled_sum, hierarchy, "sum")
        hierarchy = coarse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [60, 64, 97])
def test_the_counts_of_a_plan_are_made_once(length, causal):
    """Without padding, the packed counts and child weights are functions of the plan: made
    once on the CPU from exact float64 counts (partial groups at the tail included), they
    are the ones the forward computes otherwise, and the forward gives the same with them."""
    plan = _Plan.of(length, 4, causal, 4)
    counts = _packed_counts(None, torch.empty(0, dtype=torch.float64), plan)
    made = _unmasked_counts(plan, torch.float64)
    torch.testing.assert_close(made[0], counts, rtol=0, atol=0)
    torch.testing.assert_close(made[1], _child_weights(counts, plan), rtol=0, atol=0)
    assert _unmasked_counts(plan, torch.float64) is made
    q, k, v = _qkv(length)
    got, want = _forward(q, k, v, None, plan, made), _forward(q, k, v, None, plan)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # the op hands the cached tensors to its forward and backward: they stay as made
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    hmatrix_attention(q, k, v, 4, causal).square().sum().backward()
    torch.testing.assert_close(made[0], counts, rtol=0, atol=0)
    torch.testing.assert_close(made[1], _child_weights(counts, plan), rtol=0, atol=0)


@pytest.mark.parametrize("width", [2, 3], ids=["causal", "bidirectional"])
def test_band_products_write_every_block(width):
    """The banded block products, against loops over the blocks of a packed sequence whose
    first and last blocks are separators: query block ``t >= 1`` sees key blocks
    ``t-1 .. t+w-2`` while they exist, entries on separator keys are 0 (their bias), and
    every block outside those products is zero whatever the output buffer held before
    (NaN here: a product of NaN and a zero gradient row would not be zero)."""
    n, blocks, dim, channels = 2, 6, 3, 4
    gen = torch.Generator().manual_seed(0)
    queries = torch.randn(blocks, n, dim, generator=gen, dtype=torch.float64)
    keys = torch.randn(blocks * n, dim, generator=gen, dtype=torch.float64)
    x = torch.randn(blocks * n, channels, generator=gen, dtype=torch.float64)
    entries = torch.full((blocks, n, width * n), math.nan, dtype=torch.float64)
    key_grads = torch.full((blocks, n, channels), math.nan, dtype=torch.float64)

    want_entries = torch.zeros_like(entries)
    want_key_grads = torch.zeros_like(key_grads)
    key_blocks, rows = keys.view(blocks, n, dim), x.view(blocks, n, channels)
    bands = [(t, p) for t in range(1, blocks - width + 2) for p in range(width)]
    for t, p in bands:  # query block t, key block t - 1 + p in columns p*n .. (p+1)*n
        want_entries[t, :, p * n : (p + 1) * n] = 0.5 * queries[t] @ key_blocks[t - 1 + p].T
    separators = torch.zeros(blocks, 1, width * n, dtype=torch.bool)
    for t, p in bands:
        if t - 1 + p in (0, blocks - 1):
            separators[t, :, p * n : (p + 1) * n] = True
    kept = want_entries.masked_fill(separators, 0.0)
    for t, p in bands:
        want_key_grads[t - 1 + p] += kept[t, :, p * n : (p + 1) * n].T @ rows[t]

    _band_bmm(queries, _band(keys, n, width), 0.5, out=entries)
    torch.testing.assert_close(entries, want_entries, rtol=0, atol=1e-14)
    _key_grad(entries.masked_fill(separators, 0.0), x, n, width, out=key_grads)
    torch.testing.assert_close(key_grads, want_key_grads, rtol=0, atol=1e-14)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_costs_one_rounding(dtype, causal):
    """bf16/fp16 inputs are computed in float32 and the output and gradients rounded once:
    against float64 on the same (rounded) inputs they err as much as the float64 results
    rounded to ``dtype``, also where coarse tokens count up to 1,024 valid tokens (half of
    4,096 are padding; a bf16 sum of ones stops being exact at 256). Computed in bf16 and
    fp16, the rounded logits alone cost several times that."""
    gen = torch.Generator().manual_seed(0)
    length = 4096
    q, k, v = (torch.randn(1, 2, length, 32, generator=gen) for _ in range(3))
    mask = torch.rand(1, length, generator=gen) < 0.5
    half = [(2 * q).to(dtype), k.to(dtype), v.to(dtype)]
    half = [t.requires_grad_() for t in half]
    wide = [t.detach().double().requires_grad_() for t in half]
    out = hmatrix_attention(*half, 16, causal, mask)
    want = hmatrix_attention(*wide, 16, causal, mask)
    assert out.dtype == dtype
    assert relative_error(out, want) <= 1.25 * rounding_error(want, dtype)
    grad = torch.randn(out.shape, generator=gen).to(dtype)
    out.backward(grad)
    want.backward(grad.double())
    for got, exact in zip(half, wide, strict=True):
        assert got.grad.dtype == dtype
        assert relative_error(got.grad, exact.grad) <= 1.25 * rounding_error(exact.grad, dtype)


def test_autocast_casts_the_inputs_and_computes_as_without_it():
    """Under autocast, float32 inputs are cast to its dtype (as SDPA casts them) and the op
    runs as on inputs of that dtype (in float32 inside, not in autocast's dtype)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 100, 8, generator=gen) for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = hmatrix_attention(q, k, v, 8)
    want = hmatrix_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), 8)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, want)


# ------------------------------------------------------------------------------ compile


def _padding(length: int, valid: int) -> torch.Tensor:
    """A ``[2, length]`` key padding mask: the second sequence has ``valid`` tokens."""
    mask = torch.zeros(2, length, dtype=torch.bool)
    mask[1, valid:] = True
    return mask


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_custom_ops_pass_opcheck(causal, padded):
    """The forward and backward run under ``torch.compile`` as custom ops: their schemas,
    fake (shape-only) implementations and aliasing agree with what they compute. The check
    through AOT autograd with dynamic shapes (nine tenths of the time) runs on the two
    variants that share no option, the others on the rest."""
    q, k, v = _qkv(60)
    valid = (~_padding(60, 50)).double() if padded else None
    fields = _Plan.of(60, 4, causal, q.shape[-1]).fields()
    utils = ["test_schema", "test_autograd_registration", "test_faketensor"]
    if causal == padded:
        utils.append("test_aot_dispatch_dynamic")
    torch.library.opcheck(_forward_op, (q, k, v, valid, *fields), test_utils=utils)
    out, *saved = _forward_op(q, k, v, valid, *fields)
    grad = torch.randn_like(out)
    torch.library.opcheck(_backward_op, (grad, out, valid, saved, *fields), test_utils=utils)


def _compiled_graph_sizes(length: int, causal: bool) -> list[int]:
    """Operator calls in the forward and backward graphs ``torch.compile`` hands its backend
    (not counting the unpacking of the custom ops' outputs: one per level's kept weights)."""
    sizes = []

    def count(graph_module, example_inputs):
        nodes = graph_module.graph.nodes
        sizes.append(sum(n.op == "call_function" and n.target != operator.getitem for n in nodes))
        return graph_module

    mask = _padding(length, length - 5)
    q, k, v = (x.requires_grad_() for x in _qkv(length, batch=2))
    fn = torch.compile(
        lambda q, k, v: hmatrix_attention(q, k, v, 4, causal, key_padding_mask=mask),
        backend=aot_autograd(fw_compiler=count, bw_compiler=count),
        fullgraph=True,
        dynamic=False,
    )
    torch._dynamo.reset()
    fn(q, k, v).sum().backward()
    return sizes


@pytest.mark.parametrize("causal", [False, True])
def test_compiled_graph_does_not_grow_with_depth(causal):
    """The compiler sees the packed core as two opaque calls (forward, backward), not its
    per-level in-place updates, which inductor took minutes per level to compile."""
    assert _compiled_graph_sizes(40, causal) == _compiled_graph_sizes(1000, causal)  # 4, 8 levels


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("HIERGRAPH_SLOW"), reason="set HIERGRAPH_SLOW=1")
@pytest.mark.parametrize("causal", [False, True])
def test_compiled_matches_eager_on_new_lengths(causal):
    """Inductor-compiled, on a first length and then on lengths that recompile (with dynamic
    shapes: as many levels, more levels, one level), output and gradients equal eager ones."""
    torch._dynamo.reset()
    compiled = torch.compile(hmatrix_attention, fullgraph=True)
    for length in (40, 56, 200, 7, 8):
        mask = _padding(length, length - 3)
        q, k, v = (x.requires_grad_() for x in _qkv(length, seed=length))
        results = []
        for fn in (compiled, hmatrix_attention):
            out = fn(q, k, v, 4, causal, key_padding_mask=mask)
            results.append((out, torch.autograd.grad(out.square().sum(), (q, k, v))))
        (out, grads), (ref, ref_grads) = results
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
        for grad, ref_grad in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-12)


def test_source_digest_follows_the_sources(tmp_path):
    """The custom ops are named by the digest of their sources: it changes with any byte of
    any file, and with a file's name, not with the order the files are given in."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    digest = _source_digest([a, b])
    assert digest == _source_digest([b, a]) and len(digest) == 10
    a.write_text("x = 2\n")
    assert _source_digest([a, b]) != digest
    a.write_text("x = 1\n")
    assert _source_digest([a, b]) == digest
    c = b.rename(tmp_path / "c.py")
    assert _source_digest([a, c]) != digest
    assert len(_source_digest([a, tmp_path / "missing.py"])) == 10  # no sources on disk
    assert _forward_op._name.endswith(f"hmatrix_forward_{_OP_SUFFIX}")
    assert _backward_op._name.endswith(f"hmatrix_backward_{_OP_SUFFIX}")


_COMPILED_STEP = """
import torch, hiergraph
from hiergraph.ops import hmatrix_attention
assert hiergraph.__file__.startswith(%r), hiergraph.__file__
q, k, v = (torch.randn(1, 2, 64, 8, dtype=torch.float64, requires_grad=True) for _ in "qkv")
out = torch.compile(hmatrix_attention, fullgraph=True, dynamic=False)(q, k, v, 4)
out.sum().backward()
torch.testing.assert_close(out, hmatrix_attention(q, k, v, 4))
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("HIERGRAPH_SLOW"), reason="set HIERGRAPH_SLOW=1")
def test_compile_cache_never_replays_another_version(tmp_path):
    """A step compiled with one version of the custom ops is cached on disk; a version that
    saves a tensor of another shape (the same op otherwise) compiles its own step instead of
    replaying the cached one, which fails (the saved tensor's rank or strides are wrong)
    when both versions have the same op names."""
    import hiergraph

    library = tmp_path / "library"
    shutil.copytree(Path(hiergraph.__file__).parent, library / "hiergraph")
    env = dict(os.environ, PYTHONPATH=str(library), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "c"))
    env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    script = _COMPILED_STEP % str(library)

    def compiled_step():
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]

    compiled_step()
    packed = library / "hiergraph" / "ops" / "hmatrix" / "packed.py"
    source = packed.read_text()
    edits = {  # save the denominator as [B H, L], not [B H, L, 1]
        "return [out, qk_pack, v_pack, weights, den, child, alphas]": (
            "return [out, qk_pack, v_pack, weights, den.squeeze(-1), child, alphas]"
        ),
        "qk_pack, v_pack, weights, den, child, alphas = saved": (
            "qk_pack, v_pack, weights, den, child, alphas = saved\n    den = den.unsqueeze(-1)"
        ),
    }
    for old, new in edits.items():
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    packed.write_text(source)
    compiled_step()
