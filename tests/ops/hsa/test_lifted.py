import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import from_nested, window_forest
from hiergraph.data.restructure import lift_leaves
from hiergraph.ops import hierarchical_attention
from hiergraph.ops.hsa.lifted import _as_views, lifted_attention, runs_lifted


def rows_of(lengths, per_tree):
    """``[sum(lengths)]`` bool, true at the given leaves of every tree (local indices)."""
    out = torch.zeros(sum(lengths), dtype=torch.bool)
    offsets = [sum(lengths[:t]) for t in range(len(lengths))]
    for offset, rows in zip(offsets, per_tree, strict=True):
        out[[offset + r for r in rows]] = True
    return out


def reference(q, k, v, batch, lifted, pos_emb, **options):
    """HSA over the tree rebuilt by ``lift_leaves``, embeddings carried, the hubs' zero."""
    tree, node = lift_leaves(batch, lifted)
    index = tree.tree_index()
    if pos_emb is not None:
        pos_emb = pos_emb.index_select(0, node).clone()
        pos_emb[index.leaf_node[lifted]] = 0.0
    return hierarchical_attention(q, k, v, index, pos_emb=pos_emb, **options)


def assert_equals_reference(q, k, v, batch, lifted, slots, pos, kernel="dense", **options):
    """:func:`lifted_attention` on ``batch``'s own plan (with ``kernel``) gives HSA over the
    rebuilt lifted tree, zero at masked leaves."""
    want = reference(q, k, v, batch, lifted, pos, scale=0.3, **options)
    index = batch.tree_index()
    got = lifted_attention(
        q, k, v, index, lifted, slots, pos_emb=pos, scale=0.3, kernel=kernel, **options
    )
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    mask = options["leaf_mask"]
    if mask is not None:
        assert (got[~mask] == 0).all()


def assert_gradients_equal(q, k, v, batch, lifted, slots, mask):
    """With position embeddings ``[N, 2, 3]`` and self energies: the output and the gradients
    of ``q, k, v`` and the embeddings equal those over the rebuilt lifted tree. Returns the
    output, the embeddings and the options."""
    pos = torch.randn(batch.num_nodes, 2, 3, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(q.size(0), 2, 3, dtype=torch.float64)
    options = dict(include_self=True, leaf_mask=mask, size_bias=True)
    want = reference(q, k, v, batch, lifted, pos, scale=0.3, **options)
    index = batch.tree_index()
    got = lifted_attention(q, k, v, index, lifted, slots, pos_emb=pos, scale=0.3, **options)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    for a, b in zip(
        torch.autograd.grad((want * upstream).sum(), (q, k, v, pos)),
        torch.autograd.grad((got * upstream).sum(), (q, k, v, pos)),
        strict=True,
    ):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b, a, rtol=0, atol=1e-12)
    return got, pos, options


def inputs(length, seed, heads=2, grad=False):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(length, heads, d, generator=gen, dtype=torch.float64).requires_grad_(grad)
        for d in (4, 4, 3)
    ]


# tree lengths, branching, hubs per tree (None: random), masked leaves per tree; trees of
# equal length run on their own plan, others on its equal-fanout embedding
CASES = [
    ([8, 8, 8], (2, 4), [[0, 5], [], [1, 2, 3, 4, 6, 7]], None),  # none, some, all but one
    ([12, 12], (3, 2, 2), [list(range(12)), [0, 11]], None),  # a tree lifted whole
    ([4, 4], (2, 2), [[1], [2, 3]], [[0, 3], [0, 1, 2]]),  # masks: one valid leaf, a hub alone
    ([8] * 4, (4, 2), None, [[7], [], list(range(8)), [2]]),  # a tree fully masked
    ([7, 8, 3, 5], (2, 4), [[0, 6], [3], [], [1, 2, 3, 4]], None),
    ([13, 9, 16], (2, 2, 4), None, [[0], [8], []]),
]


@pytest.mark.parametrize("lengths, branching, hubs, masked", CASES)
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("size_bias", [True, False])
@pytest.mark.parametrize("pos_heads", [None, 0, 1, 2])  # 0: [N, c], shared by the heads
@pytest.mark.parametrize("kernel", ["dense", "blocks"])
def test_equals_hsa_over_the_lifted_tree(lengths, branching, hubs, masked, include_self,
                                         size_bias, pos_heads, kernel):  # fmt: skip
    """Equal-fanout forests and their embeddings, as reshaped views (or, with
    ``kernel="blocks"``, on their levels)."""
    batch = window_forest(lengths, branching)
    index = batch.tree_index()
    q, k, v = inputs(sum(lengths), seed=len(branching))
    assert _as_views(index, q) and (index.uniform is None) == (len(set(lengths)) > 1)
    mask = None if masked is None else ~rows_of(lengths, masked)
    if hubs is None:  # random hubs
        lifted = torch.rand(sum(lengths), generator=torch.Generator().manual_seed(7)) < 0.3
    else:
        lifted = rows_of(lengths, hubs)
    if mask is not None:
        lifted &= mask
    slots = max(int(t.sum()) for t in lifted.split(lengths)) + 1  # more slots than hubs
    pos = None
    if pos_heads is not None:
        gen = torch.Generator().manual_seed(3)
        shape = (batch.num_nodes, pos_heads, 2) if pos_heads else (batch.num_nodes, 2)
        pos = torch.randn(*shape, generator=gen, dtype=torch.float64)
    options = dict(include_self=include_self, leaf_mask=mask, size_bias=size_bias)
    assert_equals_reference(q, k, v, batch, lifted, slots, pos, kernel=kernel, **options)


@pytest.mark.parametrize("lengths", [[12, 12, 12], [12, 7, 10]])
def test_gradients_equal_those_over_the_lifted_tree(lengths):
    batch = window_forest(lengths, (2, 3, 2))
    q, k, v = inputs(sum(lengths), seed=4, grad=True)
    lifted = rows_of(lengths, [[0, 5], [1], [2, 6, 9]])
    mask = ~rows_of(lengths, [[1], [2], [3, 4]])
    got, pos, options = assert_gradients_equal(q, k, v, batch, lifted, 4, mask)
    assert (got - reference(q, k, v, batch, lifted, pos, **options)).abs().max() > 1e-6  # tau


# ragged forests, run on their levels: nested lists (top nodes of different sizes, leaves
# among them, a chain below a root), trees that sink below a chain, leaves at depth 1 only;
# with hubs at any depth and masks (a tree left with hubs alone, a fully masked tree)
RAGGED = [
    [[[0, 1], [2, [3, 4]], 5], [0, [1, 2]], [[0, [1, [2, 3]]]]],
    [[[0, 1, 2], [3, [4, 5, 6], 7]], [[0, 1], [2, 3], [4, 5], [6, 7]], [0, 1, 2, 3]],
    [[[[0, 1], [2, 3]], [[4, 5], 6]], [[0, [1, [2, [3, 4]]]]]],
]


def ragged(case: int):
    """The forest of ``RAGGED[case]`` (``case`` 3, 4: window trees whose shorter tree sinks
    below a chain, and leaves at depth 1)."""
    if case == 3:
        return window_forest([8, 4, 3], (2, 2))
    if case == 4:
        return window_forest([5, 8, 2], (8,))
    return Batch.from_data_list([from_nested(tree) for tree in RAGGED[case]])


@pytest.mark.parametrize("case", range(5))
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("size_bias", [True, False])
@pytest.mark.parametrize("pos_heads", [None, 2])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kernel", ["dense", "edge"])
def test_ragged_forests_equal_hsa_over_the_lifted_tree(case, include_self, size_bias,
                                                       pos_heads, masked, kernel):  # fmt: skip
    """Any forest runs in place on its levels (dense family blocks, or sibling pairs): the
    root family of every tree holds its top nodes and hub slots (some empty), in place of
    the roots' families."""
    batch = ragged(case)
    index = batch.tree_index()
    assert _as_views(index, torch.empty(1, 2, 4)) is None
    length = index.num_leaves
    q, k, v = inputs(length, seed=case)
    gen = torch.Generator().manual_seed(case)
    lifted = torch.rand(length, generator=gen) < 0.35
    mask = torch.rand(length, generator=gen) > 0.3 if masked else None
    tree = index.node_tree.index_select(0, index.leaf_node)
    if mask is not None:  # the first tree keeps its hubs alone
        mask |= lifted & (tree == 0)
        lifted &= mask
    sizes = torch.bincount(tree, minlength=index.level_ptr[1])
    lifted &= torch.bincount(tree[lifted], minlength=sizes.numel())[tree] < sizes[tree]
    slots = int(torch.bincount(tree[lifted], minlength=1).max()) + 1  # more slots than hubs
    pos = None
    if pos_heads is not None:
        shape = (batch.num_nodes, pos_heads, 2) if pos_heads else (batch.num_nodes, 2)
        pos = torch.randn(*shape, generator=gen, dtype=torch.float64)
    options = dict(include_self=include_self, leaf_mask=mask, size_bias=size_bias)
    assert_equals_reference(q, k, v, batch, lifted, slots, pos, kernel=kernel, **options)


def test_ragged_gradients_equal_those_over_the_lifted_tree():
    batch = ragged(0)
    index = batch.tree_index()
    q, k, v = inputs(index.num_leaves, seed=5, grad=True)
    lifted = torch.zeros(index.num_leaves, dtype=torch.bool)
    lifted[[0, 4, 6, 8]] = True  # depth 2 and 3, a top node that is a leaf, a second tree
    mask = torch.ones_like(lifted)
    mask[[1, 9]] = False
    assert_gradients_equal(q, k, v, batch, lifted, 3, mask)


def test_runs_in_place_on_every_forest_as_views_where_it_can():
    """Every forest with a node below a root runs in place; equal-fanout forests and their
    embeddings below depth one as reshaped views, the others on their levels."""
    q = torch.randn(8, 2, 4)

    def views(tree):
        index = tree.tree_index()
        assert runs_lifted(index)
        return _as_views(index, q)

    assert views(window_forest([8, 8], (2, 4))) == (2, 4, 2)  # equal fanout, top-down
    assert views(window_forest([8, 5], (2, 4))) is not None  # embedded
    # a shorter tree sinks below a chain after its root, whose family would then be the
    # chain's (one member), not its top nodes': on the levels
    sunk = window_forest([8, 4], (2, 2)).tree_index()
    assert (
        sunk.padded is not None
        and sunk.padded.sunk
        and views(window_forest([8, 4], (2, 2))) is None
    )
    assert views(window_forest([8, 8], (8,))) is None  # leaves at depth 1
    assert views(from_nested([[0, 1, 2], [3, [4, 5]], 6])) is not None  # embedded
    assert views(from_nested([[0, 1], [2, [3, [4, [5, 6]]]]])) is None
    assert not runs_lifted(window_forest([1, 1], (2,)).tree_index())  # single leaves: no family


@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_half_precision_follows_float64(grad):
    """bf16 rows give bf16 outputs within bf16 rounding of the float64 ones (without
    gradients the passes, the hubs' family included, run in float32)."""
    lengths = [8, 8, 8]
    batch = window_forest(lengths, (2, 4))
    lifted = rows_of(lengths, [[0, 5], [], [1, 2, 3, 4, 6, 7]])
    q, k, v = inputs(sum(lengths), seed=2)
    options = dict(pos_emb=None, include_self=True, leaf_mask=None, scale=0.3)
    want = lifted_attention(q, k, v, batch.tree_index(), lifted, 7, **options)
    half = [t.bfloat16().requires_grad_(grad) for t in (q, k, v)]
    got = lifted_attention(*half, batch.tree_index(), lifted, 7, **options)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, rtol=0, atol=0.05)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kernel", ["dense", "edge"])
def test_half_precision_on_the_general_path_computes_in_float32(dtype, kernel):
    """On a ragged forest (its levels, the hubs' family between the passes) half inputs
    with large logits stay within their output rounding of float64 on the same rounded
    inputs, as in :func:`hierarchical_attention`'s general path."""
    batch = ragged(3)
    index = batch.tree_index()
    lifted = rows_of([8, 4, 3], [[0, 5], [1], []])
    q, k, v = inputs(index.num_leaves, seed=4)
    q, k, v = ((t * s).to(dtype) for t, s in ((q, 10.0), (k, 10.0), (v, 1.0)))
    options = dict(pos_emb=None, include_self=True, leaf_mask=None, kernel=kernel)
    want = lifted_attention(*(t.double() for t in (q, k, v)), index, lifted, 2, **options)
    got = lifted_attention(q, k, v, index, lifted, 2, **options)
    assert got.dtype == dtype and torch.isfinite(got).all()
    eps = torch.finfo(dtype).eps
    assert (got.double() - want).abs().max() <= 2 * eps * want.abs().max()


@pytest.mark.parametrize(
    "bad, error, match",
    [
        (dict(leaf_mask=torch.ones(16)), ValueError, r"leaf_mask must be a \[16\] bool tensor"),
        (dict(leaf_mask=torch.ones(15, dtype=torch.bool)), ValueError, "leaf_mask must be a"),
        (
            dict(lifted=torch.zeros(16, dtype=torch.long)),
            ValueError,
            r"lifted must be a \[16\] bool",
        ),
        (dict(q=torch.randn(15, 2, 4)), ValueError, "q and k must have the same shape"),
        (dict(x=torch.randn(15, 2, 4)), ValueError, "q has 15 rows but the hierarchy has 16"),
        (dict(x=torch.ones(16, 2, 4, dtype=torch.long)), TypeError, "one floating dtype"),
        (dict(pos_emb=torch.randn(5, 3)), ValueError, r"pos_emb must be \[num_nodes="),
    ],
)
def test_inputs_are_checked_as_hierarchical_attention_checks_them(bad, error, match):
    """The layers call the lifted op directly: its inputs get the op's checks (a float
    ``leaf_mask`` failed inside a bitwise ``and``, short rows in an assertion)."""
    index = window_forest([8, 8], (2, 2)).tree_index()
    args = dict(x=torch.randn(16, 2, 4), lifted=torch.zeros(16, dtype=torch.bool),
                leaf_mask=None, pos_emb=None)  # fmt: skip
    args.update(bad)
    x = args["x"]
    with pytest.raises(error, match=match):
        lifted_attention(args.get("q", x), x, x, index, args["lifted"], 1, pos_emb=args["pos_emb"],
                         include_self=True, leaf_mask=args["leaf_mask"])  # fmt: skip
