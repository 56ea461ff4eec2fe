"""Integrations with other libraries' models: zero-shot HSA inside pretrained Hugging Face
encoders, and an attention FLOP counter."""

from hiergraph.integrations.flops import (
    SCORE_FLOPS,
    block_attention_flops,
    flat_attention_flops,
    hsa_attention_flops,
)
from hiergraph.integrations.hf_bert import (
    HSASelfAttention,
    encoder_layers,
    hsa_hierarchies,
    inject_hsa,
    interleaved_layers,
    remove_hsa,
    sentence_hierarchy,
)
from hiergraph.integrations.hub_windows import padded_hub_window_hsa
from hiergraph.integrations.hubs import (
    hub_scores,
    hub_selection_flops,
    hub_window_hierarchies,
    hub_window_hierarchy,
    select_hubs,
)
from hiergraph.integrations.padded_attention import (
    padded_block_attention,
    padded_hsa,
    padded_window_hsa,
    valid_token_mask,
    window_hierarchies,
)

__all__ = [
    "SCORE_FLOPS",
    "HSASelfAttention",
    "block_attention_flops",
    "encoder_layers",
    "flat_attention_flops",
    "hsa_attention_flops",
    "hsa_hierarchies",
    "hub_scores",
    "hub_selection_flops",
    "hub_window_hierarchies",
    "hub_window_hierarchy",
    "inject_hsa",
    "interleaved_layers",
    "padded_block_attention",
    "padded_hsa",
    "padded_hub_window_hsa",
    "padded_window_hsa",
    "remove_hsa",
    "select_hubs",
    "sentence_hierarchy",
    "valid_token_mask",
    "window_hierarchies",
]
