"""VCC compression ops vs the dense reference (Zeng et al. §3.2–3.4: exact VIP rows, the
compression identities, permutation)."""

import math

import pytest
import torch
import torch.nn.functional as F

from hiergraph.ops.vcc.dense import compression_matrices, vcc_layer_dense
from hiergraph.ops.vcc.layer import (
    compress,
    decompress,
    pack_compressed,
    unpack_compressed,
    vcc_layer,
    vip_attention_scores,
    vip_partition,
    vip_restore,
    vip_score_fn,
    vip_scores_padded,
)
from hiergraph.ops.vcc.segment_tree import (
    SegmentTree,
    build_tree_state,
    materialize,
    select_segments,
)

D, HEADS = 8, 2


class Layer:
    """A pre-LN transformer layer (ReLU FFN) as a pure function of ``(z, key_bias)``."""

    def __init__(self, seed: int):
        gen = torch.Generator().manual_seed(seed)
        w = [torch.randn(D, D, generator=gen, dtype=torch.float64) / math.sqrt(D) for _ in range(6)]
        self.wq, self.wk, self.wv, self.wo, self.w1, self.w2 = w

    def heads(self, x, w):
        return (F.layer_norm(x, (D,)) @ w).unflatten(-1, (HEADS, -1))

    def query(self, x):
        return self.heads(x, self.wq) / math.sqrt(D // HEADS)

    def key(self, x):
        return self.heads(x, self.wk)

    def __call__(self, z, key_bias):
        q, k, v = (self.heads(z, w).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        logits = q @ k.transpose(-1, -2) / math.sqrt(D // HEADS) + key_bias[:, None, None, :]
        z = z + (torch.softmax(logits, -1) @ v).transpose(1, 2).flatten(2) @ self.wo
        return z + torch.relu(F.layer_norm(z, (D,)) @ self.w1) @ self.w2


def _batch(lengths=(21, 9, 14), num_vip=(3, 0, 2), seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = max(lengths)
    x = torch.randn(len(lengths), n, D, generator=gen, dtype=torch.float64)
    mask = torch.arange(n)[None] < torch.tensor(lengths)[:, None]
    vip = torch.zeros_like(mask)
    for b, (length, count) in enumerate(zip(lengths, num_vip, strict=True)):
        vip[b, torch.randperm(length, generator=gen)[:count]] = True
    return x, vip, mask


def _run_tree(layers, x, vip, mask, branching, budgets):
    """Tree path over several layers; returns the outputs and the selections."""
    p, p_ptr, c, c_ptr = vip_partition(x, vip, mask)
    tree = SegmentTree.from_ptr(c_ptr, branching)
    state, selections = build_tree_state(c, tree), []
    for layer in layers:
        score = vip_score_fn(layer.query(p), p_ptr, layer.key)
        p, state, sel = vcc_layer(layer, p, p_ptr, state, tree, budgets, score)
        selections.append(sel)
    return vip_restore(p, materialize(state, tree), vip, mask), selections


def _run_dense(layers, x, vip, mask, selections):
    """Explicit X <- S^dagger gamma(S X) + X per sequence, with the same partitions."""
    out = torch.zeros_like(x)
    for b in range(x.size(0)):
        xb = torch.cat([x[b][vip[b]], x[b][mask[b] & ~vip[b]]])
        num_vip = int(vip[b].sum())
        for layer, sel in zip(layers, selections, strict=True):
            xb = vcc_layer_dense(layer, xb, num_vip, sel.count[sel.batch == b])
        out[b][vip[b]], out[b][mask[b] & ~vip[b]] = xb[:num_vip], xb[num_vip:]
    return out


def test_compression_matrices_structure():
    """T4: J is a partition; S_c^dagger = pinv(S_c) = S_c^T D; S_c S_c^dagger = I; one-hot S^+."""
    count = torch.tensor([4, 1, 1, 2, 4, 3])
    s, s_pinv, log_d = compression_matrices(count, num_vip=3)
    s_c = s[3:, 3:]
    assert ((s_c != 0).sum(0) == 1).all()
    torch.testing.assert_close(s_pinv, torch.linalg.pinv(s))
    torch.testing.assert_close(s_pinv[3:, 3:], s_c.T * count.double())
    torch.testing.assert_close(s @ s_pinv, torch.eye(s.size(0), dtype=torch.float64))
    assert ((s_pinv == 1).sum(1) == 1).all() and ((s_pinv != 0).sum(1) == 1).all()
    with pytest.raises(TypeError, match="count must be a 1-D integer tensor"):  # (truncated)
        compression_matrices(torch.tensor([2.5, 1.0]), 0)
    with pytest.raises(ValueError, match="count must be >= 1"):  # (a zero row: inf in S)
        compression_matrices(torch.tensor([2, 0]), 0)
    with pytest.raises(ValueError, match="num_vip must be"):
        compression_matrices(count, -1)
    assert torch.equal(s[:3, :3], torch.eye(3, dtype=torch.float64)) and (s[:3, 3:] == 0).all()
    torch.testing.assert_close(log_d.exp()[3:], count.double())


def test_compression_matrices_are_built_on_the_cpu_whatever_the_default_device():
    """(Under ``torch.set_default_device("cuda")``, ``meta`` here, they mixed devices.)"""
    count = torch.tensor([2, 1, 3])
    expected = compression_matrices(count, num_vip=2)
    with torch.device("meta"):
        found = compression_matrices(count, num_vip=2)
    for a, b in zip(found, expected, strict=True):
        assert a.device.type == "cpu" and torch.equal(a, b)


def test_multiplicity_identity_eq43():
    """T5: exp(P C^T S_c^T) D S_c has entries exp(<P_i, c_seg(j)>)."""
    gen = torch.Generator().manual_seed(1)
    p, c = (torch.randn(n, 4, generator=gen, dtype=torch.float64) * 0.5 for n in (3, 15))
    count = torch.tensor([4, 1, 1, 2, 4, 3])
    s_c = compression_matrices(count, 0)[0]
    lhs = torch.exp(p @ c.T @ s_c.T) @ torch.diag(count.double()) @ s_c
    means = (s_c @ c)[torch.arange(6).repeat_interleave(count)]
    torch.testing.assert_close(lhs, torch.exp(p @ means.T))


def test_squared_error_formula_eq51():
    """T6: eq. (51) holds with exp(2 <P_i, c>) (the paper prints it without the square)."""
    gen = torch.Generator().manual_seed(2)
    p, c = (
        torch.randn(2, 4, generator=gen, dtype=torch.float64),
        torch.randn(12, 4, generator=gen, dtype=torch.float64),
    )
    count = torch.tensor([3, 1, 4, 4])
    s_c = compression_matrices(count, 0)[0]
    seg = torch.arange(4).repeat_interleave(count)
    means = s_c @ c
    error = ((torch.exp(p @ c.T) - torch.exp(p @ means[seg].T)) ** 2).sum(1)
    inner = (torch.exp(p @ (c - means[seg]).T) - 1) ** 2
    squared = (torch.exp(2 * p @ means[seg].T) * inner).sum(1)
    printed = (torch.exp(p @ means[seg].T) * inner).sum(1)
    torch.testing.assert_close(squared, error)
    assert not torch.allclose(printed, error)


def test_compress_decompress_are_the_matrices():
    x, vip, mask = _batch()
    p, p_ptr, c, c_ptr = vip_partition(x, vip, mask)
    tree = SegmentTree.from_ptr(c_ptr, (3,))
    layer = Layer(0)
    sel = select_segments(
        build_tree_state(c, tree), tree, (None, 1), vip_score_fn(layer.query(p), p_ptr, layer.key)
    )
    torch.testing.assert_close(compress(c, sel), sel.value)
    y = torch.randn_like(sel.value)
    for b in range(3):
        rows, toks = sel.batch == b, slice(int(c_ptr[b]), int(c_ptr[b + 1]))
        s, s_pinv, _ = compression_matrices(sel.count[rows], 0)
        torch.testing.assert_close(s @ c[toks], sel.value[rows])
        torch.testing.assert_close(decompress(y, sel)[toks], s_pinv @ y[rows])
    # the segment reduction reads N rows whatever c holds: past its end (or a crash) before
    for wrong in (c[:3], c[:0], torch.cat([c, c]), c[:, 0]):
        with pytest.raises(ValueError, match=rf"c must be the \[{c.size(0)}, d\] tokens"):
            compress(wrong, sel)
    with pytest.raises(ValueError, match=rf"rows must be \[{y.size(0)}, d\]"):
        decompress(y[:-1], sel)


@pytest.mark.parametrize(
    "branching, budgets", [((3,), (None, 2)), ((2, 2), (None, 1, 2)), ((4,), (None, 0))]
)
def test_tree_path_equals_explicit_path_over_layers(branching, budgets):
    """T7: Alg. 1 + Alg. 2 over 3 layers == explicit S^dagger gamma(S X) + X, batched."""
    x, vip, mask = _batch()
    layers = [Layer(s) for s in range(3)]
    out, selections = _run_tree(layers, x, vip, mask, branching, budgets)
    torch.testing.assert_close(
        out, _run_dense(layers, x, vip, mask, selections), rtol=0, atol=1e-12
    )
    assert (out[~mask] == 0).all()


def test_no_compression_is_the_layer():
    """T1/T2: refining everything gives the uncompressed layers on the original order."""
    x, vip, mask = _batch()
    layers = [Layer(s) for s in range(2)]
    out, _ = _run_tree(layers, x, vip, mask, (2, 2), (None, None, None))
    ref = x
    key_bias = torch.zeros(mask.shape, dtype=x.dtype).masked_fill(~mask, -math.inf)
    for layer in layers:
        ref = layer(ref, key_bias)
    torch.testing.assert_close(out, ref * mask[..., None], rtol=0, atol=1e-12)


def test_identical_tokens_need_the_multiplicity_bias():
    """T3: identical tokens inside each block => exact with h = 0, broken without log s."""
    x, vip, mask = _batch(lengths=(19, 12), num_vip=(2, 1))
    k = 3
    for b in range(2):
        other = (mask[b] & ~vip[b]).nonzero().squeeze(1)
        blocks = torch.arange(other.numel()) // k
        x[b, other] = x[b, other[blocks * k]]  # copy each block's first token
    layer = Layer(0)
    key_bias = torch.zeros(mask.shape, dtype=x.dtype).masked_fill(~mask, -math.inf)
    ref = layer(x, key_bias) * mask[..., None]
    out, _ = _run_tree([layer], x, vip, mask, (k,), (None, 0))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)

    class NoMultiplicity(Layer):
        def __call__(self, z, key_bias):
            return super().__call__(z, key_bias.clamp(max=0))  # drops log s, keeps padding

    no_d = NoMultiplicity(0)
    out, _ = _run_tree([no_d], x, vip, mask, (k,), (None, 0))
    assert (out - ref).abs().max() > 1e-2


def test_vip_outputs_see_unrefined_blocks_only_through_means():
    x, vip, mask = _batch(lengths=(24,), num_vip=(2,))
    layer = Layer(0)
    out, (sel,) = _run_tree([layer], x, vip, mask, (4,), (None, 2))
    coarse = int(((sel.count == 4) & (sel.level == 1)).nonzero()[0])
    other = (mask[0] & ~vip[0]).nonzero().squeeze(1)
    positions = other[int(sel.start[coarse]) : int(sel.start[coarse]) + 4]
    bump = torch.randn(4, D, dtype=torch.float64)
    bump = bump - bump.mean(0)
    x2 = x.clone()
    x2[0, positions] += bump
    out2, (sel2,) = _run_tree([layer], x2, vip, mask, (4,), (None, 2))
    assert torch.equal(sel2.node, sel.node)
    torch.testing.assert_close(out2[vip], out[vip], rtol=0, atol=1e-13)
    expected = out.clone()
    expected[0, positions] += bump
    torch.testing.assert_close(out2, expected, rtol=0, atol=1e-13)


def test_vip_scores_and_hand_built_selection():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(5, 2, 3, generator=gen, dtype=torch.float64)
    k = torch.randn(7, 2, 3, generator=gen, dtype=torch.float64)
    q_ptr, k_batch = torch.tensor([0, 3, 3, 5]), torch.tensor([0, 0, 0, 1, 1, 2, 2])
    log_s = torch.rand(7, generator=gen, dtype=torch.float64)
    scores = vip_attention_scores(q, q_ptr, k, k_batch, log_s)
    for b, (qs, ks) in enumerate(
        [(slice(0, 3), slice(0, 3)), (slice(3, 3), slice(3, 5)), (slice(3, 5), slice(5, 7))]
    ):
        logits = torch.einsum("phd,mhd->phm", q[qs], k[ks]) + log_s[ks]
        expected = torch.softmax(logits, -1).mean((0, 1)) if b != 1 else torch.zeros(2)
        torch.testing.assert_close(scores[ks], expected.double())
    # W_Q = W_K = I: the block whose mean is a large multiple of the VIP direction is refined
    n_c, k_size = 32, 4
    c = torch.randn(n_c, 6, generator=gen, dtype=torch.float64) * 0.1
    p = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    direction = p.mean(0) / p.mean(0).norm()
    c[20:24] += 5 * direction
    tree = SegmentTree.from_ptr(torch.tensor([0, n_c]), (k_size,))
    score = vip_score_fn(p[:, None], torch.tensor([0, 3]), lambda m: m[:, None])
    sel = select_segments(build_tree_state(c, tree), tree, (None, 1), score)
    assert sel.split[0].tolist() == [5]


def test_vip_error_falls_with_budget():
    gen = torch.Generator().manual_seed(4)
    n = 96
    walk = torch.cumsum(torch.randn(1, n, D, generator=gen, dtype=torch.float64), 1) * 0.3
    x = walk + 0.05 * torch.randn(1, n, D, generator=gen, dtype=torch.float64)
    vip = torch.zeros(1, n, dtype=torch.bool)
    vip[0, :4] = True
    mask = torch.ones_like(vip)
    layer = Layer(5)
    layer.wq, layer.wk = layer.wq * 3, layer.wk * 3  # peaked attention
    full = layer(x, torch.zeros(1, n, dtype=x.dtype))
    errors = []
    for h in (0, 4, 12, 23):
        out, _ = _run_tree([layer], x, vip, mask, (4,), (None, h))
        errors.append(((out - full)[vip].norm() / (full - x)[vip].norm()).item())
    assert errors[0] > errors[1] > errors[2] > errors[3] and errors[3] < 1e-12


def test_partition_restore_round_trip_and_pack():
    x, vip, mask = _batch()
    p, p_ptr, c, c_ptr = vip_partition(x, vip, mask)
    assert p_ptr.tolist() == [0, 3, 3, 5] and c_ptr.tolist() == [0, 18, 27, 39]
    torch.testing.assert_close(vip_restore(p, c, vip, mask), x * mask[..., None])
    # stable: each sequence's VIP rows, then its other rows, in original order
    order = torch.argsort((~vip).long() + 2 * (~mask).long(), dim=1, stable=True)
    for b in range(3):
        xb = x[b, order[b]]
        n_vip, n_other = p_ptr[b + 1] - p_ptr[b], c_ptr[b + 1] - c_ptr[b]
        torch.testing.assert_close(p[p_ptr[b] : p_ptr[b + 1]], xb[:n_vip])
        torch.testing.assert_close(c[c_ptr[b] : c_ptr[b + 1]], xb[n_vip : n_vip + n_other])
    tree = SegmentTree.from_ptr(c_ptr, (4,))
    sel = select_segments(build_tree_state(c, tree), tree, (None, 0))
    z, key_bias, real, order = pack_compressed(p, p_ptr, sel.value, sel)
    assert z.shape[:2] == key_bias.shape == real.shape
    assert torch.equal(real.sum(1), (p_ptr.diff() + sel.ptr.diff()))
    assert torch.isinf(key_bias[~real]).all()
    assert torch.allclose(key_bias[0, :3], torch.zeros(3, dtype=z.dtype))
    p2, rows2 = unpack_compressed(z, real, order, p.size(0))
    assert torch.equal(p2, p) and torch.equal(rows2, sel.value)


def test_gradients_match_the_explicit_path():
    x, vip, mask = _batch(lengths=(13, 6), num_vip=(2, 1))
    layers = [Layer(0), Layer(1)]
    weight = torch.randn_like(x)
    x.requires_grad_()
    out, selections = _run_tree(layers, x, vip, mask, (2,), (None, 2))
    (grad,) = torch.autograd.grad((out * weight).sum(), x)
    ref = _run_dense(layers, x, vip, mask, selections)
    (grad_ref,) = torch.autograd.grad((ref * weight).sum(), x)
    torch.testing.assert_close(grad, grad_ref, rtol=0, atol=1e-12)


def test_bad_inputs():
    x, vip, mask = _batch()
    with pytest.raises(TypeError, match="bool"):
        vip_partition(x, vip.long(), mask)
    with pytest.raises(ValueError, match="shape"):
        vip_partition(x, vip[:, :-1], mask)
    with pytest.raises(ValueError, match="padded positions .*token_mask"):
        vip_partition(x, vip | ~mask, token_mask=mask)
    with pytest.raises(ValueError, match=r"\[B, n, d\]"):
        vip_partition(x[0], vip, mask)
    p, p_ptr, c, c_ptr = vip_partition(x, vip, mask)
    tree = SegmentTree.from_ptr(c_ptr, (4,))
    state = build_tree_state(c, tree)
    with pytest.raises(ValueError, match="input's shape"):
        vcc_layer(lambda z, b: z[:, :-1], p, p_ptr, state, tree, (None, 0))
    # VIP rows that p_ptr does not cut (an IndexError deep inside, or a message about the
    # selection's shape)
    same = lambda z, b: z  # noqa: E731
    for rows in (p[:-1], torch.cat([p, p])):
        with pytest.raises(ValueError, match=rf"p_ptr must run from 0 to p's {rows.size(0)} rows"):
            vcc_layer(same, rows, p_ptr, state, tree, (None, 0))
    with pytest.raises(ValueError, match=r"p_ptr must be \[4\] \(the tree's 3 sequences"):
        vcc_layer(same, p, p_ptr[:-1], state, tree, (None, 0))
    with pytest.raises(ValueError, match=r"p must be a \[N_p, d\] tensor"):
        vcc_layer(same, p[None], p_ptr, state, tree, (None, 0))
    # rows that do not fit the tree's (errors inside a concatenation, an index_copy or a
    # repeat_interleave)
    with pytest.raises(ValueError, match="p must have the tree state's 8 features, got 9"):
        vcc_layer(same, torch.cat([p, p[:, :1]], 1), p_ptr, state, tree, (None, 0))
    with pytest.raises(TypeError, match="p_ptr must be an integer tensor"):
        vcc_layer(same, p, p_ptr.double(), state, tree, (None, 0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_means_and_log_counts(dtype):
    """Segment means are taken in float32 and rounded once (a bf16 running mean of 3000
    ones gave 0.085); log s is taken of float32 counts (fp16 counts above 65504 are inf)."""
    import types

    gen = torch.Generator().manual_seed(0)
    c = torch.rand(3007, 4, generator=gen) + 0.5
    sel = types.SimpleNamespace(
        token_ptr=torch.tensor([0, 7, 3007]),
        batch=torch.tensor([0, 0]),
        count=torch.tensor([7, 70000]),  # a count past fp16's range
        num_tokens=3007,
    )
    ref = compress(c.to(dtype).float(), sel)
    out = compress(c.to(dtype), sel)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, rtol=8e-3, atol=0)
    ones = compress(torch.ones(3007, 4, dtype=dtype), sel)
    assert torch.equal(ones, torch.ones(2, 4, dtype=dtype))

    p, rows = torch.zeros(1, 4, dtype=dtype), torch.zeros(2, 4, dtype=dtype)
    _, key_bias, real, _ = pack_compressed(p, torch.tensor([0, 1]), rows, sel)
    assert key_bias.dtype == dtype
    torch.testing.assert_close(
        key_bias[real].float(), torch.tensor([0.0, math.log(7), math.log(70000)]), rtol=8e-3, atol=0
    )
    q = torch.randn(3, 1, 4, generator=gen)
    score = vip_score_fn(q.to(dtype), torch.tensor([0, 3]), lambda mean: mean[:, None, :])
    mean = torch.randn(2, 4, generator=gen)
    out = score(mean.to(dtype), sel.batch, sel.count)
    assert torch.isfinite(out).all()
    ref = vip_score_fn(q.to(dtype).float(), torch.tensor([0, 3]), lambda m: m[:, None, :])
    torch.testing.assert_close(
        out.float(), ref(mean.to(dtype).float(), sel.batch, sel.count), rtol=0, atol=0.02
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_scores_rank_as_in_float64(dtype):
    """VIP scores of half-precision inputs are taken in float32, so the candidates rank as
    in float64 on the same inputs. Rounded to bf16, the probabilities of 96 candidates tie
    in groups and a tie goes to the earlier segment: in a bf16 VCCEncoder over 2,048 tokens
    most refined segments were not float64's."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 4, 16, generator=gen).to(dtype)
    k = torch.randn(2, 96, 4, 16, generator=gen).to(dtype)
    key_bias = torch.full((2, 96), math.log(16)).to(dtype)
    slot_real = torch.ones(2, 8, dtype=torch.bool)
    got = vip_scores_padded(q, slot_real, k, key_bias)
    want = vip_scores_padded(q.double(), slot_real, k.double(), key_bias.double())
    ranks = [s.argsort(dim=1, descending=True, stable=True) for s in (got, want)]
    assert torch.equal(*ranks)
    assert got.dtype == torch.float32


def test_stacked_layers_under_autocast():
    """Under CPU autocast a layer returns bfloat16 rows while the tree state stays float32:
    the next layer takes them (the dtypes promote), as it did before its inputs were
    checked."""
    x, vip, mask = _batch()
    p, p_ptr, c, c_ptr = vip_partition(x.float(), vip, mask)
    tree = SegmentTree.from_ptr(c_ptr, (4,))
    state = build_tree_state(c, tree)
    linear = torch.nn.Linear(p.size(1), p.size(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(3):
            p, state, _ = vcc_layer(lambda z, b: linear(z), p, p_ptr, state, tree, (None, 0))
    assert p.dtype == torch.bfloat16 and state.root.dtype == torch.float32
    assert torch.isfinite(p).all()


def test_an_empty_batch_gives_empty_outputs():
    """No sequence at all (``p_ptr = [0]``), as the padded form takes (it failed inside
    PyG's ``to_dense_batch``)."""
    from hiergraph.ops import SegmentTree, vcc_layer
    from hiergraph.ops.vcc.segment_tree import build_tree_state

    def layer(z, key_bias):
        return z + (z @ z.transpose(1, 2) + key_bias[:, None]).softmax(-1) @ z

    tree = SegmentTree.from_ptr(torch.tensor([0]), (2,))
    state = build_tree_state(torch.zeros(0, 4), tree)
    p = vcc_layer(layer, torch.zeros(0, 4), torch.tensor([0]), state, tree, (None, None))[0]
    assert p.shape == (0, 4)
