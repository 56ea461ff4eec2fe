"""``from_nested`` at any depth, on cyclic specs, and against the former recursive walk."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hiergraph.data import Domain, Family, from_nested, nested

ATTRS = ("parent", "is_leaf", "depth", "slot", "node_type", "domain", "pos", "edge_index")


class _RecursiveBuilder(nested._Builder):
    """The former recursive walk (fails past ~1,000 levels), kept as the reference."""

    def visit(self, spec, parent, slot, domain, pos, depth) -> None:
        node = {"parent": parent, "slot": slot, "domain": int(domain), "pos": pos, "depth": depth}
        node_id = len(self.nodes)
        self.nodes.append(node)
        if isinstance(spec, (bool, str, bytes)) or not isinstance(
            spec, (int, nested.Sequence, nested.Mapping, Family)
        ):
            if hasattr(spec, "__index__") and not isinstance(spec, bool):
                spec = int(spec)
            else:
                raise TypeError(
                    f"a nested spec holds ints (leaves), lists, dicts or Family objects; got "
                    f"{type(spec).__name__}"
                )
        if isinstance(spec, int):
            node.update(row=spec, node_type=0)
            self.leaf_rows.append(spec)
            return
        node.update(row=None, node_type=spec.node_type if isinstance(spec, Family) else 0)
        children, child_domain, child_pos = self._family(spec)
        if len(children) == 0:
            raise ValueError(
                f"an internal node at depth {depth} has no children, so no leaves below it; "
                "remove the empty family"
            )
        for i, (child, p) in enumerate(zip(children, child_pos, strict=True)):
            self.visit(child, node_id, i, child_domain, p, depth + 1)


def _outcome(builder_cls, monkeypatch, spec, **kwargs):
    """``from_nested``'s result (or its error) and the builder's node records."""
    built = []

    class Recording(builder_cls):
        def __init__(self, *args):
            super().__init__(*args)
            built.append(self)

    with monkeypatch.context() as m:
        m.setattr(nested, "_Builder", Recording)
        try:
            h = from_nested(spec, **kwargs)
        except (TypeError, ValueError) as err:
            return (type(err), str(err)), built[0].nodes
    return {key: h[key] for key in ATTRS}, built[0].nodes


def _same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return a == b


def _specs():
    """Nested specs of every kind: lists, tuples, dicts (int and str keys), Family on every
    domain with explicit positions, empty families, bad leaves; leaf rows 0..L-1 permuted
    afterwards (or left repeated / out of range) by the test."""
    # mostly valid leaves: ints 0..35, and now and then a bad one
    leaf = st.integers(0, 39).map(lambda i: i if i < 36 else ["a", 1.5, True, None][i - 36])

    def family(children):
        def make(draw_domain, data):
            n = len(children)
            if draw_domain == "2d":
                pos = [(i // 2, i % 2) for i in range(n)]
            elif draw_domain in ("kv", "graph"):
                pos = [3 * i + 1 for i in range(n)]
            else:
                pos = None
            return Family(children, draw_domain, pos=pos, node_type=data)

        return st.builds(
            make, st.sampled_from(["1d", "2d", "set", "kv", "graph"]), st.integers(0, 3)
        )

    def extend(inner):
        kids = st.lists(inner, min_size=1, max_size=4)
        return st.one_of(
            kids,
            kids.map(tuple),
            st.dictionaries(st.sampled_from(["a", "b", 5, 7]), inner, min_size=1, max_size=3),
            kids.flatmap(family),
            st.sampled_from([[], {}, Family([])]),  # empty families
        )

    return st.recursive(leaf, extend, max_leaves=25)


def _renumber(spec, counter):
    """The spec with its int leaves renumbered 0, 1, 2, … in visiting order."""
    if isinstance(spec, bool) or not isinstance(spec, (int, list, tuple, dict, Family)):
        return spec
    if isinstance(spec, int):
        counter.append(len(counter))
        return counter[-1]
    if isinstance(spec, list):
        return [_renumber(c, counter) for c in spec]
    if isinstance(spec, tuple):
        return tuple(_renumber(c, counter) for c in spec)
    if isinstance(spec, dict):
        return {k: _renumber(v, counter) for k, v in spec.items()}
    kids = [_renumber(c, counter) for c in spec.children]
    return Family(kids, spec.domain, pos=spec.pos, node_type=spec.node_type)


@given(_specs(), st.booleans(), st.randoms(use_true_random=False))
@settings(max_examples=300, deadline=None)
def test_same_result_as_the_recursive_walk(spec, renumber, rng):
    if renumber:  # a valid spec: rows 0..L-1 in a random order
        rows: list[int] = []
        spec = _renumber(spec, rows)
        perm = list(range(len(rows)))
        rng.shuffle(perm)
        spec = _renumber_with(spec, perm)
    kwargs = {"keys": {"a": 0, "b": 1}}
    with pytest.MonkeyPatch.context() as monkeypatch:
        new, new_nodes = _outcome(nested._Builder, monkeypatch, spec, **kwargs)
        old, old_nodes = _outcome(_RecursiveBuilder, monkeypatch, spec, **kwargs)
    assert _same(new, old)
    assert new_nodes == old_nodes


def _renumber_with(spec, perm):
    """Replace leaf ``i`` by ``perm[i]``."""
    if isinstance(spec, bool) or not isinstance(spec, (int, list, tuple, dict, Family)):
        return spec
    if isinstance(spec, int):
        return perm[spec]
    if isinstance(spec, list):
        return [_renumber_with(c, perm) for c in spec]
    if isinstance(spec, tuple):
        return tuple(_renumber_with(c, perm) for c in spec)
    if isinstance(spec, dict):
        return {k: _renumber_with(v, perm) for k, v in spec.items()}
    kids = [_renumber_with(c, perm) for c in spec.children]
    return Family(kids, spec.domain, pos=spec.pos, node_type=spec.node_type)


def test_same_result_as_the_recursive_walk_on_examples(monkeypatch):
    grid = Family([0, 1, 2, 3], "2d", pos=[(0, 0), (0, 1), (1, 0), (1, 1)], node_type=2)
    examples = [
        ([[2, 0], [1, Family([3, 4], "set")]], {"x": torch.randn(5, 3)}),
        ({"image": grid, "title": [4, 5]}, {"keys": {"image": 0, "title": 1}}),
        ([[0, 1, 2], [3, 4], [[5, 6], 7]], {"x": torch.randn(8, 4)}),
        (0, {"x": torch.ones(1, 2)}),
        ((1, (0, Family([3, 2], "graph", pos=[7, 2]))), {"leaf_type": [0, 1, 0, 1]}),
        ([[0, 1], []], {}),
        ([0, [1, "a"]], {}),
        ([0, 0, 1], {}),
    ]
    for spec, kwargs in examples:
        new = _outcome(nested._Builder, monkeypatch, spec, **kwargs)
        old = _outcome(_RecursiveBuilder, monkeypatch, spec, **kwargs)
        assert _same(new[0], old[0]) and new[1] == old[1], spec


def _chain(levels: int, wrap=list):
    """``levels`` nested containers around leaf 0, each with a sibling leaf after it."""
    spec = 0
    for i in range(levels):
        spec = wrap([spec, i + 1])
    return spec


@pytest.mark.parametrize(
    "wrap",
    [list, tuple, lambda c: {0: c[0], 1: c[1]}, lambda c: Family(c, "set", node_type=1)],
    ids=["list", "tuple", "dict", "family"],
)
def test_five_thousand_levels(wrap):
    levels = 5000
    h = from_nested(_chain(levels, wrap), x=torch.randn(levels + 1, 2))
    assert h.num_leaves == levels + 1 and h.num_nodes == 2 * levels + 1 and h.num_trees == 1
    assert int(h.depth.max()) == levels and int(h.depth[0]) == levels
    # leaf i + 1 is the second child of the container i levels above leaf 0
    assert h.depth[1 : levels + 1].tolist() == list(range(levels, 0, -1))
    assert h.slot[1 : levels + 1].eq(1).all() and int(h.slot[0]) == 0
    assert torch.equal(h.parent[0], h.parent[1])
    internal = h.parent[1 : levels + 1]
    assert torch.equal(h.parent[internal[:-1]], internal[1:])  # a chain up to the root


def test_deep_single_path():
    spec = 0
    for _ in range(5000):
        spec = [spec]
    h = from_nested(spec)
    assert h.num_nodes == 5001 and int(h.depth[0]) == 5000
    assert h.domain[0] == Domain.GRID1D and h.domain[int(h.parent[-1])] == Domain.GRID1D


def test_cyclic_spec_raises():
    selfref = [0, 1]
    selfref.append(selfref)
    with pytest.raises(ValueError, match="cyclic: the list at depth 1 .* ancestor at depth 0"):
        from_nested(selfref)

    deep = [0, [1, [2]]]
    deep[1][1].append(deep[1])
    with pytest.raises(ValueError, match="cyclic: the list at depth 3 .* ancestor at depth 1"):
        from_nested(deep)

    record = {"a": [0]}
    record["b"] = [1, record]
    with pytest.raises(ValueError, match="cyclic: the dict"):
        from_nested(record, keys={"a": 0, "b": 1})

    fam = Family([0, 1], "set")
    fam.children.append([2, fam])
    with pytest.raises(ValueError, match="cyclic: the Family"):
        from_nested(fam)


def test_shared_subtrees_are_not_cycles():
    shared = [0, 1]
    # a subtree used twice is not a cycle: its leaves are, as before, used twice
    with pytest.raises(ValueError, match="more than one leaf"):
        from_nested([shared, [shared]], x=torch.randn(2, 2))


def test_family_changed_after_creation():
    fam = Family([0, 1], "1d", pos=[0, 1])
    fam.children.append(2)
    with pytest.raises(ValueError, match="3 children but 2 positions"):
        from_nested(fam)


def test_integer_like_ids_are_read_and_other_numbers_refused():
    """NumPy integers and one-element integer tensors are ids; floats, bools and float
    tensors are refused, not truncated (``tensor(1.9)`` was row 1, positions 0.9 and 0.1
    both 0)."""
    import numpy as np

    h = from_nested([[torch.tensor(0), np.int64(1)], [2]], x=torch.randn(3, 2))
    assert h.num_leaves == 3 and torch.equal(h.x, from_nested([[0, 1], [2]], x=h.x).x)
    refused = [
        ([[torch.tensor(1.9), 0]], {}, "a leaf .* must be an int, got tensor"),
        ([[torch.tensor(True), 0]], {}, "a leaf .* must be an int, got tensor"),
        ([Family([0, 1], pos=[0.9, 0.1])], {}, "a position must be an int, got 0.9"),
        ([Family([0, 1], "2d", pos=[(0, 0.5), (1, 1)])], {}, "a position must be an int"),
        ([Family([0, 1], node_type=1.5)], {}, "node_type must be an int, got 1.5"),
        ({"a": [0], "b": [1]}, {"keys": {"a": 0, "b": 1.0}}, "the id of key 'b' must be an int"),
        ([[0, 1], [2]], {"leaf_type": [0.5, 1, 1]}, "leaf_type must hold integers"),
    ]
    for spec, kwargs, match in refused:
        with pytest.raises(TypeError, match=match):
            from_nested(spec, **kwargs)


def test_dict_keys_with_one_key_id_are_refused():
    """Two keys of a dict family mapped to one id: siblings at one position, refused."""
    with pytest.raises(ValueError, match="keys 'a' and 'b' .* both have key id 0"):
        from_nested({"a": 0, "b": 1}, keys={"a": 0, "b": 0})
    with pytest.raises(ValueError, match="keys 3 and 'c' .* both have key id 3"):
        from_nested({3: 0, "c": 1}, keys={"c": 3})
    h = from_nested({"a": 0, "b": 1}, keys={"a": 0, "b": 1})  # distinct ids are fine
    assert h.pos[:2, 0].tolist() == [0, 1]


def test_leaf_ints_out_of_range_are_explained_as_rows_of_x():
    """Token ids as leaves (a common first try) get a message that says what a leaf int is
    (it said only "leaf index 5 is out of range for 5 feature rows")."""
    with pytest.raises(
        ValueError,
        match=r"^leaf index 5 is out of range for 5 leaves \(without x, the leaf ints must be "
        r"0 \.\. L-1\): a leaf int is the row of x that the leaf carries, not a token id$",
    ):
        from_nested([[5, 3, 9], [2, 7]])
    with pytest.raises(ValueError, match=r"^leaf index 5 is out of range for 2 rows of x: "):
        from_nested([0, 5], x=torch.randn(2, 2))
