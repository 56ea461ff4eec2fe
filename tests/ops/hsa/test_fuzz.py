"""Fuzzing the builders and HSA end to end (hypothesis).

Random nested specs (any depth and branching, empty families, single children, tuples,
key-value dicts) and random parent vectors (any node numbering, slots with gaps and slots
near ``2**62`` / ``2**63``) go through :func:`~hiergraph.data.from_nested` or
:meth:`SignalHierarchy.from_parent`, optionally batched, and into
:func:`~hiergraph.ops.hierarchical_attention` with random options (float32/float64,
padding masks, position embeddings, ``include_self``, ``leaky_causal`` or ``causal``, both
kernels).

Every example is built either valid or broken in one known way. A broken one must raise a
``ValueError``/``TypeError`` with a message; a valid one must give a finite result equal to
the dense reference :func:`~hiergraph.ops.hierarchical_attention_matrix` (or
:func:`~hiergraph.ops.causal_hierarchical_attention_matrix`; float64: ``1e-10``; float32:
``2e-5``). The run's statistics (``--hypothesis-show-statistics``) count both outcomes.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from torch_geometric.data import Batch

from hiergraph.data import SignalHierarchy, from_nested
from hiergraph.ops import (
    causal_hierarchical_attention_matrix,
    hierarchical_attention,
    hierarchical_attention_matrix,
)

FUZZ = settings(
    max_examples=500,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TOL = {torch.float64: 1e-10, torch.float32: 2e-5}
LEAF = "leaf"  # placeholder in a drawn spec shape, numbered afterwards

# slots: small, with gaps, and near the top of int64 (sort keys built as
# ``parent_rank * slot_range + slot`` overflow there)
SLOT_VALUES = st.one_of(
    st.integers(0, 6),
    st.integers(0, 10**6),
    st.integers(2**62 - 4, 2**62 + 4),
    st.integers(2**63 - 6, 2**63 - 1),
    st.integers(0, 2**63 - 1),
)


class Case:
    """A drawn input: ``build()`` makes the hierarchy; ``broken`` names its defect (or ``None``);
    the repr shows the arguments (what hypothesis prints for a failing example)."""

    def __init__(self, build, broken, **args):
        self.build, self.broken, self.args = build, broken, args

    def __repr__(self) -> str:
        args = ", ".join(f"{key}={value!r}" for key, value in self.args.items())
        return f"Case(broken={self.broken!r}, {args})"


# ---------------------------------------------------------------- nested specs
SHAPES = st.recursive(
    st.just(LEAF),
    lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=4),
        st.lists(children, min_size=1, max_size=1),  # single child (unary chains)
        st.lists(children, min_size=1, max_size=3).map(tuple),
        st.lists(children, min_size=1, max_size=3).map(
            lambda c: {7 * i: x for i, x in enumerate(c)}
        ),
    ),
    max_leaves=16,
)


def _count_leaves(shape) -> int:
    if shape == LEAF:
        return 1
    items = shape.values() if isinstance(shape, dict) else shape
    return sum(_count_leaves(c) for c in items)


def _has_empty_family(shape) -> bool:
    if shape == LEAF:
        return False
    items = list(shape.values() if isinstance(shape, dict) else shape)
    return not items or any(_has_empty_family(c) for c in items)


def _replace_leaf(shape, index: int, new):
    """``shape`` with its ``index``-th leaf (depth first) replaced by ``new``."""
    count = [-1]

    def walk(node):
        if node == LEAF:
            count[0] += 1
            return new if count[0] == index else LEAF
        if isinstance(node, dict):
            return {key: walk(c) for key, c in node.items()}
        children = [walk(c) for c in node]
        return tuple(children) if isinstance(node, tuple) else children

    return walk(shape)


def _fill(shape, ids: list):
    """``shape`` with its leaves replaced by ``ids`` in depth-first order."""
    if shape == LEAF:
        return ids.pop(0)
    if isinstance(shape, dict):
        return {key: _fill(c, ids) for key, c in shape.items()}
    children = [_fill(c, ids) for c in shape]
    return tuple(children) if isinstance(shape, tuple) else children


@st.composite
def nested_cases(draw):
    shape = draw(SHAPES)
    num_leaves = _count_leaves(shape)
    in_order = draw(st.booleans())  # leaves numbered depth first (what causal=True needs)
    ids = list(range(num_leaves)) if in_order else draw(st.permutations(range(num_leaves)))
    if num_leaves > 1 and draw(st.integers(0, 15)) == 0:  # an empty family in place of a leaf
        shape = _replace_leaf(shape, draw(st.integers(0, num_leaves - 1)), [])
        num_leaves -= 1
        ids = [i for i in ids if i < num_leaves]
    broken = "empty family" if _has_empty_family(shape) else None
    defect = draw(st.sampled_from([None] * 16 + ["duplicate", "out_of_range", "negative", "str"]))
    if defect is not None and num_leaves and broken is None:
        i = draw(st.integers(0, num_leaves - 1))
        if defect == "duplicate" and num_leaves > 1:
            ids[i] = ids[(i + 1) % num_leaves]
        elif defect == "out_of_range":
            ids[i] = num_leaves + draw(st.integers(0, 2**40))
        elif defect == "negative":
            ids[i] = -draw(st.integers(1, 5))
        elif defect == "str":
            ids[i] = str(ids[i])
        else:
            defect = None
        broken = defect
    spec = _fill(shape, list(ids))
    with_x = draw(st.booleans())
    nan_x = with_x and num_leaves > 0 and broken is None and draw(st.integers(0, 19)) == 0
    if nan_x:
        broken = "non-finite x"

    def build():
        if not with_x:
            return from_nested(spec)
        x = torch.randn(num_leaves, 3)
        if nan_x:
            x[num_leaves - 1, 0] = float("nan")
        return from_nested(spec, x=x)

    return Case(build, broken, spec=spec, with_x=with_x, nan_x=nan_x)


# ---------------------------------------------------------------- parent vectors
@st.composite
def parent_cases(draw):
    n = draw(st.integers(1, 20))
    raw = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]  # node 0 is the root
    relabel = draw(st.permutations(range(n)))  # any node numbering
    parent = [0] * n
    for i in range(n):
        parent[relabel[i]] = -1 if raw[i] < 0 else relabel[raw[i]]
    children = {p: [c for c in range(n) if parent[c] == p] for p in range(n)}
    slot = None
    style = draw(st.sampled_from(["default", "small", "any"]))
    if style != "default":
        values = st.integers(0, n + 6) if style == "small" else SLOT_VALUES
        slot = [draw(values) for _ in range(n)]  # the root's slot is free
        for kids in children.values():
            if kids:
                distinct = draw(
                    st.lists(values, min_size=len(kids), max_size=len(kids), unique=True)
                )
                for c, s in zip(kids, distinct, strict=True):
                    slot[c] = s
    broken = None
    defect = draw(
        st.sampled_from(
            [None] * 20
            + ["two_roots", "cycle", "self_loop", "out_of_range", "dup_slot", "neg_slot"]
            + ["is_leaf", "slot_len", "float_parent", "float_slot"]
        )
    )
    root = parent.index(-1)
    others = [i for i in range(n) if i != root]
    if defect in ("two_roots", "self_loop", "out_of_range", "neg_slot") and others:
        u = draw(st.sampled_from(others))
        if defect == "two_roots":
            parent[u] = -1
        elif defect == "self_loop":
            parent[u] = u
        elif defect == "out_of_range":
            parent[u] = draw(st.sampled_from([n, n + 3, -2]))
        else:
            slot = slot if slot is not None else [0] * n
            slot[u] = -draw(st.integers(1, 2**62))
        broken = defect
    elif defect == "cycle":
        below = [u for u in others if any(parent[c] == u for c in range(n))]
        if below:
            u = draw(st.sampled_from(below))
            parent[u] = draw(st.sampled_from(children[u]))  # u -> its child -> u
            broken = defect
    elif defect == "dup_slot":
        families = [kids for kids in children.values() if len(kids) > 1]
        if families:
            kids = draw(st.sampled_from(families))
            slot = slot if slot is not None else list(range(n))
            slot[kids[1]] = slot[kids[0]]
            broken = defect
    elif defect == "is_leaf":
        broken = defect
    elif defect == "slot_len":
        slot = (slot if slot is not None else [0] * n) + [0]
        broken = defect
    elif defect in ("float_parent", "float_slot"):
        broken = defect

    def build():
        kwargs = {}
        parent_t = torch.tensor(parent, dtype=torch.float64 if defect == "float_parent" else None)
        if slot is not None:
            kwargs["slot"] = torch.tensor(slot, dtype=torch.long)
        if defect == "float_slot":
            kwargs["slot"] = torch.zeros(n, dtype=torch.float32)
        if defect == "is_leaf":  # claim that the root is a leaf (it has children when n > 1)
            is_leaf = torch.tensor([len(children[i]) == 0 for i in range(n)])
            is_leaf[root] = ~is_leaf[root]
            kwargs["is_leaf"] = is_leaf
        return SignalHierarchy.from_parent(parent_t, **kwargs)

    return Case(build, broken, parent=parent, slot=slot, defect=defect)


# ---------------------------------------------------------------- HSA options and check
@st.composite
def hsa_options(draw):
    causal = draw(st.sampled_from([None, None, None, "leaky", "leaky", "strict", "strict", "both"]))
    return {
        "dtype": draw(st.sampled_from([torch.float64, torch.float32])),
        "heads": draw(st.integers(1, 2)),
        # causal attention needs include_self: left out now and then
        "include_self": draw(st.booleans()) or (causal is not None and draw(st.integers(0, 5)) > 0),
        "causal": causal,
        "kernel": draw(st.sampled_from(["dense", "edge"])),
        "pos_emb": draw(st.sampled_from([None, "shared", "per_head"])),
        "mask": draw(st.sampled_from([None] * 4 + ["random"] * 3 + ["none_valid", "wrong_shape"])),
        "copies": draw(st.integers(1, 3)),  # batch the tree with itself and a window tree
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def _depth_first_leaves(tree) -> bool:
    """Whether the leaf order is a depth-first order (children in slot order)."""
    parent, slot, is_leaf = (t.tolist() for t in (tree.parent, tree.slot, tree.is_leaf))
    children = [[] for _ in parent]
    for node, p in enumerate(parent):
        if p != node:
            children[p].append(node)
    rank = {node: i for i, node in enumerate(n for n, leaf in enumerate(is_leaf) if leaf)}
    seen, stack = [], [node for node, p in enumerate(parent) if p == node][::-1]
    while stack:
        node = stack.pop()
        if is_leaf[node]:
            seen.append(rank[node])
        stack.extend(sorted(children[node], key=slot.__getitem__, reverse=True))
    return seen == sorted(seen)


def _reference(trees, q, k, v, pos_emb, leaf_mask, opts):
    """Dense reference, one tree at a time (trees of a batch never attend to each other)."""
    out, leaf0, node0 = [], 0, 0
    for tree in trees:
        leaves = slice(leaf0, leaf0 + tree.num_leaves)
        nodes = slice(node0, node0 + tree.num_nodes)
        pos = None if pos_emb is None else pos_emb[nodes]
        if opts["causal"] == "strict":
            theta = causal_hierarchical_attention_matrix(q[leaves], k[leaves], tree, pos_emb=pos)
        else:
            theta = hierarchical_attention_matrix(
                q[leaves], k[leaves], tree, pos_emb=pos,
                include_self=opts["include_self"], leaky_causal=opts["causal"] == "leaky",
                leaf_mask=None if leaf_mask is None else leaf_mask[leaves],
            )  # fmt: skip
        out.append(torch.einsum("hij,jhd->ihd", theta, v[leaves]))
        leaf0, node0 = leaf0 + tree.num_leaves, node0 + tree.num_nodes
    return torch.cat(out)


def run_case(case, opts):
    """Build, run HSA, and check: an error with a message for broken inputs, else the
    dense reference."""
    build, broken = case.build, case.broken
    if opts["causal"] == "both":
        broken = broken or "causal and leaky_causal"
    if opts["causal"] and not opts["include_self"]:
        broken = broken or "causal without include_self"
    if opts["causal"] == "strict" and opts["mask"] is not None:
        broken = broken or "causal with a leaf_mask"
    if opts["mask"] == "wrong_shape":
        broken = broken or "leaf_mask shape"
    try:
        tree = build()
        if opts["causal"] == "strict" and not _depth_first_leaves(tree):
            broken = broken or "causal with leaves out of depth-first order"
        trees = [tree] * opts["copies"]
        if opts["copies"] == 3:  # a different second tree (with x exactly when tree has it)
            x = None if tree.x is None else torch.randn(6, tree.x.size(1))
            trees[1] = from_nested([[0, 1], [2, [3, 4]], 5], x=x)
        hierarchy = tree if opts["copies"] == 1 else Batch.from_data_list(trees)
        gen = torch.Generator().manual_seed(opts["seed"])
        num_leaves, num_nodes, heads = hierarchy.num_leaves, hierarchy.num_nodes, opts["heads"]
        q, k, v = (
            torch.randn(num_leaves, heads, d, generator=gen, dtype=torch.float64) for d in (4, 4, 3)
        )
        pos_emb = {
            None: None,
            "shared": torch.randn(num_nodes, 2, generator=gen, dtype=torch.float64),
            "per_head": torch.randn(num_nodes, heads, 2, generator=gen, dtype=torch.float64),
        }[opts["pos_emb"]]
        leaf_mask = {
            None: None,
            "random": torch.rand(num_leaves, generator=gen) < 0.7,
            "none_valid": torch.zeros(num_leaves, dtype=torch.bool),
            "wrong_shape": torch.ones(num_leaves + 1, dtype=torch.bool),
        }[opts["mask"]]
        dtype = opts["dtype"]
        out = hierarchical_attention(
            q.to(dtype), k.to(dtype), v.to(dtype), hierarchy,
            pos_emb=None if pos_emb is None else pos_emb.to(dtype),
            include_self=opts["include_self"], leaf_mask=leaf_mask, kernel=opts["kernel"],
            causal=opts["causal"] in ("strict", "both"),
            leaky_causal=opts["causal"] in ("leaky", "both"),
        )  # fmt: skip
    except (ValueError, TypeError) as err:
        assert broken is not None, f"a valid input raised {err!r}"
        assert str(err).strip(), f"{type(err).__name__} without a message ({broken})"
        event(f"raised for: {broken}")
        return
    event("valid: compared with the dense reference")
    assert broken is None, f"a broken input ({broken}) was accepted"
    assert out.dtype == dtype and out.shape == v.shape
    assert torch.isfinite(out).all()
    ref = _reference(trees, q, k, v, pos_emb, leaf_mask, opts)
    torch.testing.assert_close(out.double(), ref, atol=TOL[dtype], rtol=0)


@FUZZ
@given(case=nested_cases(), opts=hsa_options())
def test_fuzz_from_nested(case, opts):
    run_case(case, opts)


@FUZZ
@given(case=parent_cases(), opts=hsa_options())
def test_fuzz_from_parent(case, opts):
    run_case(case, opts)
