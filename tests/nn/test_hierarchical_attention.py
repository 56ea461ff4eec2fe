import pytest
import torch
from torch_geometric.data import Batch

from hiergraph.data import from_nested, window_hierarchy
from hiergraph.nn import FamilyPositionEncoder, HierarchicalSelfAttention
from hiergraph.ops import hierarchical_attention


def test_matches_manual_composition_with_types_and_positions():
    torch.manual_seed(0)
    h = from_nested(
        [[0, 1, 2], [3, [4, 5]]],
        x=torch.randn(6, 8, dtype=torch.float64),
        leaf_type=[0, 1, 0, 1, 1, 0],
    )
    attn = HierarchicalSelfAttention(
        8, 6, heads=2, head_channels=3, num_node_types=2, pos_channels=5, include_self=True
    ).double()
    pos = torch.randn(h.num_nodes, 5, dtype=torch.float64)
    out = attn(h.x, h, pos)
    types = h.node_type[:6]

    def proj(typed):  # HeteroLinear: weight [T, in, out], bias [T, out]
        w, b = typed.lin.weight, typed.lin.bias
        return torch.stack([h.x[i] @ w[t] + b[t] for i, t in enumerate(types.tolist())])

    q, k, v = (proj(lin).view(6, 2, 3) for lin in (attn.query, attn.key, attn.value))
    norm = torch.nn.functional.layer_norm
    q, k = norm(q, (3,)), norm(k, (3,))
    pw = attn.pos.lin.weight
    eps = torch.stack([pos[i] @ pw[d] for i, d in enumerate(h.domain.tolist())]).view(-1, 2, 3)
    ref = hierarchical_attention(q, k, v, h, pos_emb=eps, include_self=True)
    ref = attn.out(ref.reshape(6, 6))
    assert torch.allclose(out, ref, atol=1e-12)


def test_batched_equals_per_tree_and_attention_is_stochastic():
    torch.manual_seed(1)
    trees = [
        window_hierarchy(9, (3,), x=torch.randn(9, 8)),
        from_nested([[0, 1], 2], x=torch.randn(3, 8)),
    ]
    attn = HierarchicalSelfAttention(8, heads=4).eval()
    out = attn(Batch.from_data_list(trees).x, Batch.from_data_list(trees))
    assert torch.allclose(out[:9], attn(trees[0].x, trees[0]), atol=1e-6)
    assert torch.allclose(out[9:], attn(trees[1].x, trees[1]), atol=1e-6)
    _, theta = attn(trees[0].x, trees[0], return_attention=True)
    assert theta.shape == (4, 9, 9)
    assert torch.allclose(theta.sum(-1), torch.ones(4, 9), atol=1e-5)


def test_gradients_flow_to_all_parameters():
    h = window_hierarchy(16, (4,), x=torch.randn(16, 8))
    enc = FamilyPositionEncoder(4)
    attn = HierarchicalSelfAttention(8, heads=2, pos_channels=4)
    attn(h.x, h, enc(h)).square().sum().backward()
    for name, p in [*attn.named_parameters(), *enc.grid1d.named_parameters()]:
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_bad_arguments():
    h = window_hierarchy(4, (2,), x=torch.randn(4, 8))
    with pytest.raises(ValueError, match="include_self"):
        HierarchicalSelfAttention(8, causal=True)
    with pytest.raises(ValueError, match="pass pos_emb"):
        HierarchicalSelfAttention(8, pos_channels=4)(h.x, h)
    with pytest.raises(ValueError, match=r"x must be \[num_leaves=4"):
        HierarchicalSelfAttention(8)(h.x[:3], h)
    with pytest.raises(ValueError, match="type id"):
        HierarchicalSelfAttention(8, num_node_types=2)(h.x, _with_types(h, [0, 2, 0, 0]))


def _with_types(h, leaf_types):
    h = h.clone()
    h.node_type[: len(leaf_types)] = torch.tensor(leaf_types)
    return h
