import numpy as np
import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import Domain, Family, from_nested
from hiergraph.data.multimodal import (
    ImageField,
    MultimodalSchema,
    SequenceField,
    VectorField,
    image_patches,
    multimodal_hierarchy,
)
from hiergraph.nn import HierarchicalTransformerEncoder, TypedLinear, global_leaf_mean_pool

ATTRS = ("parent", "slot", "depth", "domain", "pos", "node_type", "is_leaf")


def schema(group_size=None):
    return MultimodalSchema(
        [
            ImageField("image", channels=3, patch_size=4, group_size=group_size),
            SequenceField("title", 5),
            SequenceField("description", 5),
            VectorField("hist", 7),
        ],
        node_types=[0, 1, 1, 2],
    )


def record(gen, tokens=(3, 4), image=(8, 12), hist=True):
    return {
        "image": torch.rand(3, *image, generator=gen, dtype=torch.float64) if image else None,
        "title": torch.randn(tokens[0], 5, generator=gen, dtype=torch.float64),
        "description": torch.randn(tokens[1], 5, generator=gen, dtype=torch.float64),
        "hist": torch.randn(7, generator=gen, dtype=torch.float64) if hist else None,
    }


def reference(rec, s):
    """The same tree written as a nested spec and built by from_nested (the slow reference)."""
    spec, rows, width, cursor = {}, [], s.in_channels, 0
    for key, field in enumerate(s.fields):
        value = rec.get(field.name)
        if value is None or value.numel() == 0:
            continue
        t = s.node_types[key]
        if isinstance(field, ImageField):
            patches, grid = image_patches(value, field.patch_size)
            ids = list(range(cursor, cursor + len(grid)))
            g = field.group_size
            if g is None:
                child = Family(ids, "2d", pos=grid.tolist(), node_type=t)
            else:
                groups = {}
                for i, (r, c) in zip(ids, grid.tolist(), strict=True):
                    groups.setdefault((r // g, c // g), []).append((i, (r % g, c % g)))
                child = Family(
                    [
                        Family([i for i, _ in m], "2d", [p for _, p in m], t)
                        for m in groups.values()
                    ],
                    "2d",
                    pos=list(groups),
                    node_type=t,
                )
            feats = patches
        elif isinstance(field, SequenceField):
            ids = list(range(cursor, cursor + value.size(0)))
            child, feats = Family(ids, "1d", node_type=t), value
        else:
            child, feats = cursor, value.unsqueeze(0)
        spec[key] = child
        rows.append(torch.nn.functional.pad(feats, (0, width - feats.size(1))))
        cursor += feats.size(0)
    x = torch.cat(rows)
    leaf_type = torch.cat(
        [torch.full((r.size(0),), s.node_types[k]) for k, r in zip(spec, rows, strict=True)]
    )
    return from_nested(spec, x=x, leaf_type=leaf_type)


@pytest.mark.parametrize("group_size", [None, 2, 3])
@pytest.mark.parametrize(
    "fields",
    [
        dict(),
        dict(hist=False),
        dict(image=None),
        dict(tokens=(0, 4)),
        dict(tokens=(2, 0), hist=False),
        dict(image=(4, 4), tokens=(0, 0), hist=False),
    ],
)
def test_matches_nested_reference(group_size, fields):
    s = schema(group_size)
    rec = record(torch.Generator().manual_seed(0), **fields)
    h = multimodal_hierarchy(rec, s)
    ref = reference(rec, s)
    for name in ATTRS:
        assert torch.equal(h[name], ref[name]), name
    assert torch.equal(h.x, ref.x)
    # modality: the key id of each node's field (inherited from its depth-1 ancestor)
    top = torch.arange(h.num_nodes)
    while bool((h.depth[top] > 1).any()):
        top = torch.where(h.depth[top] > 1, h.parent[top], top)
    expected = torch.where(h.depth == 0, -1, h.pos[top, 0])
    assert torch.equal(h.modality, expected)


def test_shapes_and_missing_fields():
    s = schema(group_size=2)
    gen = torch.Generator().manual_seed(1)
    h = s.build(record(gen))  # 8x12 image, 4x4 patches: 2x3 grid of 48-wide patches
    assert h.x.shape == (6 + 3 + 4 + 1, 48) and s.in_channels == 48
    assert h.num_nodes == 14 + 1 + 1 + 2 + 2  # leaves, root, image + 2 groups, 2 text nodes
    assert h.depth.max() == 3 and h.num_trees == 1
    assert h.node_type[h.is_leaf].tolist() == [0] * 6 + [1] * 7 + [2]
    assert h.domain[:6].eq(Domain.GRID2D).all() and h.domain[6:13].eq(Domain.GRID1D).all()
    assert h.domain[13] == Domain.KEY_VALUE and h.pos[13].tolist() == [3, 0]
    # missing fields keep the key ids of the others
    only_text = s.build({"description": torch.randn(2, 5)})
    assert only_text.num_nodes == 4 and only_text.pos[only_text.depth == 1].tolist() == [[2, 0]]
    assert only_text.x[:, 5:].eq(0).all()  # zero-padded to the widest field


def test_batching_records_with_different_fields():
    s = schema()
    gen = torch.Generator().manual_seed(2)
    trees = [
        s.build(record(gen)),
        s.build(record(gen, image=None)),
        s.build({"hist": torch.ones(7)}),
    ]
    b = Batch.from_data_list(trees)
    assert b.num_trees == 3 and b.x.size(0) == sum(t.x.size(0) for t in trees)
    assert torch.equal(b.modality, torch.cat([t.modality for t in trees]))


@pytest.mark.parametrize("swap", [False, True])
def test_dtype_is_promoted_over_all_fields(swap):
    fields = [VectorField("a", 3), SequenceField("b", 2)]
    s = MultimodalSchema(fields[::-1] if swap else fields)
    a = torch.tensor([1.0, 2.0, 3.0])  # float32
    b = torch.tensor([[1 + 1e-12, 2.0]], dtype=torch.float64)
    h = s.build({"a": a, "b": b})
    assert h.x.dtype == torch.float64
    assert h.x[h.modality[h.is_leaf] == s.keys["b"]][0, 0].item() == 1 + 1e-12
    assert s.build({"a": a, "b": b.float()}).x.dtype == torch.float32
    # integer fields alone still give the default float dtype
    ints = s.build({"a": torch.tensor([1, 2, 3]), "b": torch.tensor([[4, 5]])})
    assert ints.x.dtype == torch.get_default_dtype()


def test_image_patches_layout():
    img = torch.arange(2 * 4 * 6).reshape(2, 4, 6)
    patches, grid = image_patches(img, 2)
    assert patches.shape == (6, 8) and grid.tolist()[:4] == [[0, 0], [0, 1], [0, 2], [1, 0]]
    assert torch.equal(patches[4].view(2, 2, 2), img[:, 2:4, 2:4])
    for bad, error in ((0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="patch_size must be a positive int"):  # (0: a
            image_patches(img, bad)  # ZeroDivisionError before)


def test_per_type_projection_receives_its_leaves():
    """TypedLinear on the zero-padded x equals each field's own Linear on its unpadded leaves."""
    s = schema()
    h = s.build(record(torch.Generator().manual_seed(3)))
    h.x = h.x.float()
    lin = TypedLinear(s.in_channels, 6, s.num_node_types)
    out = lin(h.x, h.node_type[h.is_leaf])
    widths = {0: 48, 1: 5, 2: 7}
    for t, w in widths.items():
        rows = h.node_type[h.is_leaf] == t
        weight, bias = lin.lin.weight[t, :w], lin.type_bias[t]
        assert torch.allclose(out[rows], h.x[rows, :w] @ weight + bias, atol=1e-6)
    # and the other types' weights do not touch these leaves
    with torch.no_grad():
        lin.lin.weight[1:] += 1.0
    assert torch.equal(lin(h.x, h.node_type[h.is_leaf])[h.node_type[h.is_leaf] == 0], out[:6])


def test_bad_input():
    s = schema()
    with pytest.raises(ValueError, match="unknown field"):
        s.build({"caption": torch.randn(2, 5)})
    with pytest.raises(ValueError, match="every field of the record is missing"):
        s.build({"title": torch.zeros(0, 5), "image": None})
    with pytest.raises(ValueError, match="multiple of patch_size"):
        s.build({"image": torch.rand(3, 10, 8)})
    with pytest.raises(ValueError, match=r"must be \[3, H, W\]"):
        s.build({"image": torch.rand(1, 8, 8)})
    with pytest.raises(ValueError, match=r"must be \[T, 5\]"):
        s.build({"title": torch.randn(3, 4)})
    with pytest.raises(ValueError, match="non-finite"):
        s.build({"hist": torch.full((7,), float("nan"))})
    with pytest.raises(TypeError, match="field 'hist' must be real, got torch.complex64"):
        s.build({"hist": torch.zeros(7, dtype=torch.complex64)})
    with pytest.raises(TypeError, match="torch.Tensor or None"):
        s.build({"title": [[0.0] * 5]})
    with pytest.raises(ValueError, match="same leaf width"):
        MultimodalSchema([SequenceField("a", 3), SequenceField("b", 4)], node_types=[0, 0])
    with pytest.raises(ValueError, match="distinct"):
        MultimodalSchema([SequenceField("a", 3), VectorField("a", 3)])
    with pytest.raises(ValueError, match="patch_size must be a positive int"):
        ImageField("image", patch_size=0)


def test_node_types_are_ints():
    """``int()`` truncated 0.9 to 0 and read ``"1"`` as 1; NumPy ints are ints."""
    fields = [VectorField("a", 2), VectorField("b", 2)]
    for bad in ([0.9, 0.2], ["1", 0], [True, 0]):
        with pytest.raises(TypeError, match="each node type must be an int"):
            MultimodalSchema(fields, node_types=bad)
    assert MultimodalSchema(fields, node_types=[np.int64(1), 0]).node_types == [1, 0]


def test_training_smoke():
    """A 1-layer HSA encoder learns a label carried by the image only, with text as noise."""
    s = MultimodalSchema([ImageField("image", 1, patch_size=2), SequenceField("title", 4)])
    gen = torch.Generator().manual_seed(0)
    trees = []
    for i in range(48):
        y = i % 2
        img = torch.rand(1, 4, 4, generator=gen) + 0.5 * y
        t = s.build({"image": img, "title": torch.randn(1 + i % 3, 4, generator=gen)})
        t.y = torch.tensor([y])
        trees.append(t)
    b = Batch.from_data_list(trees)
    torch.manual_seed(0)
    enc = HierarchicalTransformerEncoder(s.in_channels, 16, 1, heads=2, num_node_types=2)
    head = torch.nn.Linear(16, 2)
    opt = torch.optim.Adam([*enc.parameters(), *head.parameters()], lr=1e-2)

    def loss_fn():
        return torch.nn.functional.cross_entropy(head(global_leaf_mean_pool(enc(b.x, b), b)), b.y)

    start = float(loss_fn().detach())
    for _ in range(40):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()
    assert float(loss_fn().detach()) < 0.5 * start
