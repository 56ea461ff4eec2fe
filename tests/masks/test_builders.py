"""hiergraph.masks.builders: every builder against its definition and its
edge-count formula."""

import itertools
import math

import pytest
import torch

from hiergraph.masks import (
    block_diagonal_mask,
    causal_mask,
    check_edge_index,
    cross_mask,
    dilated_mask,
    edge_index_to_mask,
    full_mask,
    global_tokens_mask,
    graph_mask,
    random_mask,
    sibling_mask,
    window_mask,
)
from tests.masks.conftest import assert_canonical, brute_mask, dense


def window_count(n, p, causal):
    q = min(p, max(n - 1, 0))
    return (q + 1) * n - q * (q + 1) // 2 if causal else (2 * q + 1) * n - q * (q + 1)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 16])
def test_sequence_mask_definitions_and_counts(n):
    cases = [
        (full_mask(n), lambda i, j: True, n * n),
        (full_mask(n, self_loops=False), lambda i, j: i != j, n * (n - 1)),
        (causal_mask(n), lambda i, j: j <= i, n * (n + 1) // 2),
    ]
    for p in (0, 1, 3, 20):
        cases.append(
            (window_mask(n, p), lambda i, j, p=p: abs(i - j) <= p, window_count(n, p, False))
        )
        cases.append(
            (
                window_mask(n, p, causal=True),
                lambda i, j, p=p: 0 <= i - j <= p,
                window_count(n, p, True),
            )
        )
        for s in (1, 2, 3):
            classes = [math.ceil((n - r) / s) for r in range(min(s, n))]
            for causal in (False, True):
                cases.append(
                    (
                        dilated_mask(n, p, s, causal=causal),
                        lambda i, j, p=p, s=s, c=causal: (
                            (i - j) % s == 0 and (0 if c else -p * s) <= i - j <= p * s
                        ),
                        sum(window_count(m, p, causal) for m in classes),
                    )
                )
    for edge_index, allowed, count in cases:
        assert edge_index.dtype == torch.long and edge_index.shape == (2, count)
        assert torch.equal(dense(edge_index, n), brute_mask(n, allowed))
        if count:
            assert_canonical(edge_index)


def test_nesting_and_corollary_1():
    """T9/T4: window(p) ⊆ window(p+1) ⊆ causal ⊆ full; p >= n-1 is causal; p = 0 is
    the identity; the paper's code ``stride = s`` is the causal window p = s - 1."""
    n = 9
    chain = [dense(window_mask(n, p, causal=True), n) for p in range(n)]
    chain += [dense(causal_mask(n), n), dense(full_mask(n), n)]
    for small, big in itertools.pairwise(chain):
        assert bool((small <= big).all())
    assert torch.equal(window_mask(n, n - 1, causal=True), causal_mask(n))
    assert torch.equal(window_mask(n, 0), torch.arange(n).repeat(2, 1))
    stride = 3  # appendix B: keep {max(0, i - t) : t < stride}
    paper = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        paper[i, [max(0, i - t) for t in range(stride)]] = True
    assert torch.equal(dense(window_mask(n, stride - 1, causal=True), n), paper)


def test_toeplitz_masks():
    """T3: the causal and window relations are translation invariant."""
    n = 8
    for edge_index in (causal_mask(n), window_mask(n, 2, causal=True), window_mask(n, 2)):
        m = dense(edge_index, n)
        assert torch.equal(m[1:, 1:], m[:-1, :-1])


def test_block_diagonal_mask():
    sizes = [3, 1, 0, 4]
    edge_index = block_diagonal_mask(sizes)
    assert edge_index.size(1) == sum(b * b for b in sizes)
    seg = torch.repeat_interleave(torch.arange(4), torch.tensor(sizes))
    assert torch.equal(dense(edge_index, 8), seg[:, None] == seg[None, :])


def test_cross_mask_joint_and_bipartite():
    m, n = 3, 4
    joint = cross_mask(m, n)
    assert joint.size(1) == m * n
    mask = dense(joint, m + n)
    assert not mask[:m].any()  # encoder rows are empty
    assert mask[m:, :m].all() and not mask[m:, m:].any()
    bip = cross_mask(m, n, joint=False)
    assert torch.equal(edge_index_to_mask(bip, (m, n), rows="query"), torch.ones(n, m).bool())


@pytest.mark.parametrize("read_only", [False, True])
def test_global_tokens_mask(read_only):
    n, g = 6, 2
    base = window_mask(n, 1)
    edge_index = global_tokens_mask(base, n, g, read_only=read_only)
    extra = g * n + g * g + (0 if read_only else g * n)
    assert edge_index.size(1) == base.size(1) + extra
    assert_canonical(edge_index)
    mask = dense(edge_index, n + g)
    assert torch.equal(mask[:n, :n], dense(base, n))
    assert mask[:, n:].all()  # everybody reads the global tokens
    assert bool(mask[n:, :n].all()) is (not read_only)


def test_random_mask():
    edge_index = random_mask(50, 400, seed=3)
    assert edge_index.size(1) == 400
    assert_canonical(edge_index)
    assert torch.equal(edge_index, random_mask(50, 400, seed=3))
    assert not torch.equal(edge_index, random_mask(50, 400, seed=4))
    loops = edge_index[:, edge_index[0] == edge_index[1]]
    assert loops.size(1) == 50
    no_loops = random_mask(50, 400, seed=3, self_loops=False)
    assert no_loops.size(1) == 400 and not bool((no_loops[0] == no_loops[1]).any())
    dense_case = random_mask(5, 25)  # every pair
    assert torch.equal(dense(dense_case, 5), torch.ones(5, 5).bool())
    sparse_case = random_mask(3000, 9000, seed=1)  # rejection-sampling branch
    assert sparse_case.size(1) == 9000
    assert_canonical(sparse_case)


def test_graph_mask():
    edge_index = torch.tensor([[0, 0, 1, 2, 2], [1, 1, 2, 2, 0]])
    with_loops = graph_mask(edge_index, 4)
    assert with_loops.size(1) == 3 + 4  # distinct non-loop edges + n
    assert_canonical(with_loops)
    without = graph_mask(edge_index, 4, self_loops=False)
    assert without.tolist() == [[2, 0, 1], [0, 1, 2]]


def test_graph_mask_past_the_int64_sort_key():
    """Ids beyond ~3.04e9 nodes: ``dst * num_nodes + src`` overflowed int64 and gave
    ``[[4294967270], [3]]``."""
    edge_index = torch.tensor([[2**32 - 1, 5, 2**32 - 1], [2**32 - 2, 2**32 - 2, 2**32 - 2]])
    out = graph_mask(edge_index, 2**32 + 5, self_loops=False)
    assert out.tolist() == [[5, 2**32 - 1], [2**32 - 2, 2**32 - 2]]


@pytest.mark.parametrize("root_value", ["minus_one", "self"])
def test_sibling_mask(root_value):
    # two trees: 0 -> {1, 2, 3}, 1 -> {4, 5}; 6 -> {7, 8}
    parent = torch.tensor([-1, 0, 0, 0, 1, 1, -1, 6, 6])
    if root_value == "self":
        parent = torch.where(parent < 0, torch.arange(9), parent)
    edge_index = sibling_mask(parent)
    assert edge_index.size(1) == 3**2 + 2**2 + 2**2 + 2  # families + roots
    assert_canonical(edge_index)
    p = parent.tolist()

    def siblings(i, j):
        root_i, root_j = p[i] in (-1, i), p[j] in (-1, j)
        return i == j if (root_i or root_j) else p[i] == p[j]

    assert torch.equal(dense(edge_index, 9), brute_mask(9, siblings))
    no_loops = sibling_mask(parent, self_loops=False)
    assert no_loops.size(1) == 3 * 2 + 2 * 1 + 2 * 1
    assert torch.equal(sibling_mask(parent.int()), edge_index)  # (int32 was refused)


@pytest.mark.parametrize(
    "call,error,message",
    [
        (lambda: full_mask(-1), ValueError, "n must be >= 0"),
        (lambda: causal_mask(3.0), TypeError, "n must be an int"),
        (lambda: window_mask(5, -2), ValueError, "p must be >= 0"),
        (lambda: dilated_mask(5, 1, 0), ValueError, "dilation must be >= 1"),
        (lambda: window_mask(5, 1, causal="False"), TypeError, "causal must be a bool"),
        (lambda: dilated_mask(5, 1, 2, causal=None), TypeError, "causal must be a bool"),
        (lambda: block_diagonal_mask([2, -1]), ValueError, "block size must be >= 0"),
        (lambda: random_mask(4, 30), ValueError, r"num_edges must lie in \[4, 16\]"),
        (lambda: random_mask(4, 2), ValueError, "num_edges must lie in"),
        (lambda: random_mask(4, 6, seed=1.5), TypeError, "seed must be an int, got 1.5"),
        # (2**64: "Overflow when unpacking long long" from manual_seed)
        (lambda: random_mask(4, 6, seed=2**64), ValueError, r"seed must be an int in \[0, 2\*\*64"),
        (lambda: random_mask(4, 6, seed=-1), ValueError, "seed must be an int in"),  # (= 2**64-1)
        (lambda: random_mask(2**32, 10, self_loops=False), ValueError, "n must be at most"),
        # flags are bools, not truth values ("False" and "no" are true)
        (lambda: full_mask(3, self_loops="no"), TypeError, "self_loops must be a bool"),
        (lambda: cross_mask(2, 2, joint=0), TypeError, "joint must be a bool"),
        (
            lambda: global_tokens_mask(window_mask(3, 1), 3, 1, read_only="False"),
            TypeError,
            "read_only must be a bool",
        ),
        (lambda: graph_mask(window_mask(3, 1), 3, self_loops=None), TypeError, "self_loops"),
        (lambda: sibling_mask(torch.tensor([-1, 0]), self_loops="no"), TypeError, "self_loops"),
        (lambda: graph_mask(torch.tensor([[0], [5]]), 3), ValueError, "outside"),
        (lambda: graph_mask(torch.tensor([[0.0], [1.0]]), 3), TypeError, "int64 or int32"),
        (lambda: global_tokens_mask(torch.zeros(3, 1).long(), 3, 1), ValueError, r"\[2, E\]"),
        (lambda: sibling_mask(torch.tensor([0.0, 0.0])), TypeError, "1-D integer tensor"),
        (lambda: sibling_mask(torch.tensor([True, False])), TypeError, "1-D integer tensor"),
        (lambda: sibling_mask(torch.tensor([-1, 7])), ValueError, "parent ids must lie"),
    ],
)
def test_builder_bad_inputs(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_check_edge_index():
    """One check for builders, dense converters and MaskedAttentionConv: each row
    against its own node set, and messages that say which row is out of range."""
    check_edge_index(torch.tensor([[0, 2], [1, 0]]), 3, 2)  # bipartite: 3 sources, 2 targets
    check_edge_index(torch.zeros(2, 0, dtype=torch.long), 0)  # no edges, no nodes
    with pytest.raises(ValueError, match=r"targets \(row 1, queries\) span 0\.\.2 for num_dst = 2"):
        check_edge_index(torch.tensor([[0, 2], [2, 0]]), 3, 2)
    with pytest.raises(ValueError, match=r"sources \(row 0, keys\) span -1\.\.0 for num_src = 3"):
        check_edge_index(torch.tensor([[-1, 0], [0, 0]]), 3)
    with pytest.raises(TypeError, match=r"int32 tensor of shape \[2, E\] or a BandMask, got a"):
        check_edge_index(torch.zeros(2, 1), 3, alternative="a BandMask")
    with pytest.raises(TypeError, match="got list"):
        check_edge_index([[0], [1]], 3)
    with pytest.raises(ValueError, match=r"shape \[2, E\], got \(3, 1\)"):
        check_edge_index(torch.zeros(3, 1, dtype=torch.long), 3)
