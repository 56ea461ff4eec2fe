"""Mask builders, converters, batching, band detection and automorphism groups
(notes/relational_masks.md §5.2 and the test list of §7)."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.utils import dense_to_sparse

from hiergraph.masks import (
    BandMask,
    automorphisms,
    block_diagonal_mask,
    causal_mask,
    cross_mask,
    dilated_mask,
    edge_index_to_mask,
    full_mask,
    global_tokens_mask,
    graph_mask,
    is_automorphism,
    mask_to_edge_index,
    random_mask,
    relabel,
    sequence_batch,
    sibling_mask,
    window_mask,
)


def dense(edge_index, n):
    return edge_index_to_mask(edge_index, n, rows="query")


def brute_mask(n, allowed):
    """Dense mask[i, j] = allowed(i, j) from the definition (i = query, j = key)."""
    rows = [[bool(allowed(i, j)) for j in range(n)] for i in range(n)]
    return torch.tensor(rows, dtype=torch.bool).view(n, n)


def assert_canonical(edge_index):
    """Sorted by target then source, no duplicates."""
    key = edge_index[1] * (int(edge_index.max()) + 1) + edge_index[0]
    assert bool((key[1:] > key[:-1]).all())


# ---------------------------------------------------------------- edge counts
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


def test_causal_direction_and_pyg_trap():
    """T2/T7: causal edges point from the past to the present; dense_to_sparse
    on the query-row mask silently gives anti-causal edges."""
    n = 6
    edge_index = causal_mask(n)
    assert bool((edge_index[0] <= edge_index[1]).all())
    mask = torch.ones(n, n).tril().bool()  # mask[query, key]: j <= i
    assert torch.equal(mask_to_edge_index(mask, rows="query"), edge_index)
    assert torch.equal(mask_to_edge_index(mask.T, rows="key"), edge_index)
    trap, _ = dense_to_sparse(mask.long())
    assert bool((trap[0] >= trap[1]).all())  # anti-causal
    fixed, _ = dense_to_sparse(mask.T.long())
    assert bool((fixed[0] <= fixed[1]).all()) and torch.equal(dense(fixed, n), mask)


def test_converters_round_trip_square_and_bipartite():
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(7, 5, generator=gen) < 0.4  # 7 queries, 5 keys
    edge_index = mask_to_edge_index(mask, rows="query")
    assert int(edge_index[0].max()) < 5 and int(edge_index[1].max()) < 7
    assert torch.equal(edge_index_to_mask(edge_index, (5, 7), rows="query"), mask)
    assert torch.equal(edge_index_to_mask(edge_index, (5, 7), rows="key"), mask.T)
    square = torch.rand(6, 6, generator=gen) < 0.5
    assert torch.equal(dense(mask_to_edge_index(square, rows="query"), 6), square)


def test_converter_bad_inputs():
    mask = torch.ones(3, 3, dtype=torch.bool)
    with pytest.raises(TypeError):
        mask_to_edge_index(mask)  # rows is required, on purpose
    with pytest.raises(ValueError, match='rows must be "query"'):
        mask_to_edge_index(mask, rows="row")
    with pytest.raises(TypeError, match="BoolTensor"):
        mask_to_edge_index(mask.float(), rows="query")
    with pytest.raises(ValueError, match="outside the mask"):
        edge_index_to_mask(torch.tensor([[0], [3]]), 3, rows="query")
    with pytest.raises(ValueError, match=r"shape \[2, E\]"):
        edge_index_to_mask(torch.zeros(3, 2, dtype=torch.long), 3, rows="query")


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


@pytest.mark.parametrize(
    "call,error,message",
    [
        (lambda: full_mask(-1), ValueError, "n must be >= 0"),
        (lambda: causal_mask(3.0), TypeError, "n must be an int"),
        (lambda: window_mask(5, -2), ValueError, "p must be >= 0"),
        (lambda: dilated_mask(5, 1, 0), ValueError, "dilation must be >= 1"),
        (lambda: block_diagonal_mask([2, -1]), ValueError, "block size must be >= 0"),
        (lambda: random_mask(4, 30), ValueError, r"num_edges must lie in \[4, 16\]"),
        (lambda: random_mask(4, 2), ValueError, "num_edges must lie in"),
        (lambda: graph_mask(torch.tensor([[0], [5]]), 3), ValueError, "outside"),
        (lambda: graph_mask(torch.tensor([[0.0], [1.0]]), 3), TypeError, "LongTensor"),
        (lambda: global_tokens_mask(torch.zeros(3, 1).long(), 3, 1), ValueError, r"\[2, E\]"),
        (lambda: sibling_mask(torch.tensor([0.0, 0.0])), TypeError, "1-D LongTensor"),
        (lambda: sibling_mask(torch.tensor([-1, 7])), ValueError, "parent ids must lie"),
        (lambda: BandMask((3,), -1, 0), ValueError, "before and after must be >= 0"),
        (lambda: BandMask((3, -1), 1, 0), ValueError, "lengths must be >= 0"),
    ],
)
def test_builder_bad_inputs(call, error, message):
    with pytest.raises(error, match=message):
        call()


# ---------------------------------------------------------------- bands
@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=4),
    before=st.integers(0, 6),
    after=st.integers(0, 6),
    dilation=st.integers(1, 3),
)
def test_band_count_formula_and_definition(lengths, before, after, dilation):
    band = BandMask(tuple(lengths), before, after, dilation)
    edge_index = band.edge_index()
    assert edge_index.size(1) == band.num_edges
    n = band.num_nodes
    seg = band.segment_ids().tolist()

    def allowed(i, j):
        off = i - j
        return (
            seg[i] == seg[j]
            and off % dilation == 0
            and -after * dilation <= off <= before * dilation
        )

    assert torch.equal(dense(edge_index, n), brute_mask(n, allowed))
    detected = BandMask.detect(edge_index, n)
    if n and (dilation == 1 or len([m for m in lengths if m]) <= 1):
        assert detected is not None
        assert torch.equal(detected.edge_index(), edge_index)


def test_detect_recognises_builders_in_any_order():
    gen = torch.Generator().manual_seed(0)
    for edge_index, n in [
        (window_mask(40, 3), 40),
        (window_mask(40, 5, causal=True), 40),
        (dilated_mask(40, 2, 3), 40),
        (block_diagonal_mask([5, 7, 3]), 15),
        (causal_mask(10), 10),
        (full_mask(10), 10),
        (sequence_batch([5, 9, 2], window_mask, p=2).edge_index, 16),
    ]:
        band = BandMask.detect(edge_index, n)
        shuffled = edge_index[:, torch.randperm(edge_index.size(1), generator=gen)]
        assert band is not None and BandMask.detect(shuffled, n) == band
        assert torch.equal(band.edge_index(), edge_index)
    assert BandMask.detect(sequence_batch([5, 9], window_mask, p=2).edge_index, 14).lengths == (
        5,
        9,
    )


def test_detect_rejects_everything_else():
    edge_index = window_mask(30, 2)
    extra = torch.tensor([[0], [10]])
    for other in [
        edge_index[:, 1:],  # one edge missing
        torch.cat([edge_index, edge_index[:, :1]], dim=1),  # a duplicate
        torch.cat([edge_index, extra], dim=1),  # one edge too many
        full_mask(30, self_loops=False),  # no diagonal
        random_mask(30, edge_index.size(1)),
        cross_mask(3, 4),
        torch.empty(2, 0, dtype=torch.long),
    ]:
        assert BandMask.detect(other, 30) is None
    # a missing edge replaced by a duplicate keeps the count: still rejected
    swapped = edge_index.clone()
    swapped[:, 5] = swapped[:, 6]
    assert BandMask.detect(swapped, 30) is None


# ---------------------------------------------------------------- batches
def test_sequence_batch():
    """T10: no edge crosses sequences; local edges equal the per-sequence mask."""
    lengths = [5, 3, 0, 4]
    x = torch.randn(12, 2)
    batch = sequence_batch(lengths, window_mask, x=x, p=1, causal=True)
    assert batch.num_graphs == 4 and batch.ptr.tolist() == [0, 5, 8, 8, 12]
    assert torch.equal(batch.x, x)
    assert batch.pos.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]
    src, dst = batch.edge_index
    assert torch.equal(batch.batch[src], batch.batch[dst])
    for g, n in enumerate(lengths):
        local = batch.get_example(g).edge_index
        assert torch.equal(local, window_mask(n, 1, causal=True))
    with pytest.raises(ValueError, match="lengths sum to 12"):
        sequence_batch(lengths, window_mask, x=x[:5], p=1)
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        sequence_batch([2, -1], causal_mask)


# ---------------------------------------------------------------- automorphisms
def aut_size(edge_index, n):
    return automorphisms(edge_index, n).size(0)


def test_automorphism_classification_n6():
    """Note §2 table and §4.4, n = 6 (720 permutations)."""
    n = 6
    assert aut_size(full_mask(n), n) == 720
    assert aut_size(window_mask(n, 0), n) == 720  # identity mask
    identity = torch.arange(n)[None]
    assert torch.equal(automorphisms(causal_mask(n), n), identity)
    for p in (1, 2, 3):
        assert torch.equal(automorphisms(window_mask(n, p, causal=True), n), identity)
    # bidirectional window |i - j| <= w: 2, 2, 4, 48 (twins appear when n <= 2w)
    assert [aut_size(window_mask(n, w), n) for w in (1, 2, 3, 4)] == [2, 2, 4, 48]
    assert aut_size(block_diagonal_mask([2, 2, 2]), n) == 48  # S_2 wr S_3
    reversal = torch.arange(n - 1, -1, -1)
    assert is_automorphism(window_mask(n, 2), n, reversal)
    assert not is_automorphism(causal_mask(n), n, reversal)


def test_cross_attention_automorphisms_never_swap_sides():
    """T5: the joint encoder -> decoder graph has Aut = S_m x S_n, no swap (m = n = 3)."""
    m = n = 3
    auts = automorphisms(cross_mask(m, n), m + n)
    assert auts.size(0) == math.factorial(m) * math.factorial(n)
    assert bool((auts[:, :m] < m).all())  # encoder positions stay encoders


def test_automorphisms_networkx_matches_brute_force():
    for edge_index, n in [(window_mask(6, 1), 6), (block_diagonal_mask([2, 2, 2]), 6)]:
        brute = automorphisms(edge_index, n)
        assert torch.equal(automorphisms(edge_index, n, brute_force_up_to=0), brute)
    cycle = torch.stack([torch.arange(9), (torch.arange(9) + 1) % 9])
    assert aut_size(cycle, 9) == 9  # directed 9-cycle: rotations only (networkx path)


def test_relabel_convention():
    """x_new = x[perm] turns the mask into M[perm][:, perm] and the edges into inv[E]."""
    gen = torch.Generator().manual_seed(0)
    edge_index = random_mask(7, 20, seed=1)
    perm = torch.randperm(7, generator=gen)
    m = dense(edge_index, 7)
    assert torch.equal(dense(relabel(edge_index, perm), 7), m[perm][:, perm])
