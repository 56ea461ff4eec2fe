"""Every layer of :mod:`hiergraph.nn` re-draws all its parameters in ``reset_parameters``."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import hiergraph.nn as layers

BUILD = {
    "ConeAttention": lambda: layers.ConeAttention(8, 2),
    "ConeConv": lambda: layers.ConeConv(8, 4, heads=2, learn_gamma=True),
    "FamilyPositionEncoder": lambda: layers.FamilyPositionEncoder(8, graph_pe_dim=3),
    "GraphHSAConv": lambda: layers.GraphHSAConv(8, nn.Linear(8, 8), heads=2, gate=True),
    "GraphHSANet": lambda: layers.GraphHSANet(4, 8, 3, graph_pe_dim=2),
    "HMatrixAttention": lambda: layers.HMatrixAttention(8, 2),
    "HTEDecoder": lambda: layers.HTEDecoder(10, hidden_channels=8, num_layers=2, heads=2),
    "HTEDecoderLayer": lambda: layers.HTEDecoderLayer(8, 2, 16, 4, "hsa"),
    "HTELayer": lambda: layers.HTELayer(8, heads=2, pos_channels=4),
    "HTransformer1D": lambda: layers.HTransformer1D(10, embed_dim=8, num_layers=2, num_heads=2),
    "HierarchicalSelfAttention": lambda: layers.HierarchicalSelfAttention(8, heads=2,
                                                                          pos_channels=4),
    "HierarchicalTransformerEncoder": lambda: layers.HierarchicalTransformerEncoder(
        4, 8, num_node_types=2, pos_channels=4, heads=2
    ),
    "LearnableFourierFeatures": lambda: layers.LearnableFourierFeatures(2, 8),
    "MaskedAttentionConv": lambda: layers.MaskedAttentionConv(8, 4, heads=2, edge_dim=3),
    "TypedLinear": lambda: layers.TypedLinear(4, 8, num_types=3),
    "VCCEncoder": lambda: layers.VCCEncoder(2, 8, num_heads=2, local_layers=1),
}  # fmt: skip


def test_every_layer_is_listed():
    modules = {
        name for name in layers.__all__
        if inspect.isclass(getattr(layers, name)) and issubclass(getattr(layers, name), nn.Module)
    }  # fmt: skip
    assert modules == set(BUILD)


@pytest.mark.parametrize("name", sorted(BUILD))
def test_reset_parameters_redraws_every_parameter(name):
    torch.manual_seed(0)
    module = BUILD[name]()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.fill_(7.0)
    module.reset_parameters()
    stale = [n for n, p in module.named_parameters() if bool((p == 7.0).all())]
    assert stale == []
