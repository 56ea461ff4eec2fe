"""What the kernels of :func:`~hiergraph.ops.hierarchical_attention` cost, in one unit.

The plans choose how a forest runs from these numbers: how a level's families are cut
into the dense blocks of the block kernel (:class:`~hiergraph.plan.family_block.FamilyBlock`)
and whether a forest is embedded in an equal-fanout one
(:class:`~hiergraph.plan.padded_forest.PaddedForest`). The unit is one slot of a gather
block: one member row of a family, gathered, attended and written back. Fitted on CPU
with 4 heads of 64 + 64 channels at 128–2K tokens per tree.
"""

BLOCK_COST = 110
"""A family block's fixed cost, in slots: the block kernel runs a fixed number of
operations per block (forward and backward), whatever the block holds."""

SLICE_SAVING = 0.25
"""What a slot of a slice block (a run of consecutive families of one size, read as a view)
saves against a gather slot: a run becomes a slice block when its slots save more than a
block costs, ``slots * SLICE_SAVING >= BLOCK_COST``, else its families join the gather
blocks."""

PADDING_COST = 0.8
"""What a leaf slot of a :class:`~hiergraph.plan.padded_forest.PaddedForest` costs on the
reshaped-view path, in gather slots of the block kernel."""

KERNEL_PADDING_COST = 0.55
"""What a leaf slot of a :class:`~hiergraph.plan.padded_forest.PaddedForest` costs when the
compiled CPU kernel (:mod:`hiergraph.ops.hsa.native`) runs it: 0.49–0.62 block-kernel slots
in forward+backward passes over padded batches of 64 × 128, 32 × 512 and 8 × 2048 tokens
(lengths uniform in ``[L/2, L]``, 2 threads), where PyTorch operations took 0.74–0.83."""

REFERENCE_WIDTH = 4 * (64 + 64)
"""Heads × (d + d_v) at which the costs were measured: a block's fixed cost is worth fewer
slots as the work per slot grows."""

ACCELERATOR_BLOCK_COST = 25_000
"""Off the CPU, a family block's fixed cost in padded leaf slots, at
:data:`ACCELERATOR_REFERENCE_WIDTH`: eager HSA there is launch-bound at a few blocks, and
a slot costs device time only. From one H200 run (forward+backward, bf16, 8 heads of 64):
the block kernel took 5.8 ms more than the embedding on a batch of 3 blocks (64 sequences
of 64–128 tokens, 12.0 vs 6.2 ms), about 1.9 ms per block, and a leaf slot about 70 ns
where HSA is device-bound (18.5 ms for 256K leaves). A model from one run, not a fit."""

ACCELERATOR_REFERENCE_WIDTH = 8 * (64 + 64)
"""Heads × (d + d_v) at which :data:`ACCELERATOR_BLOCK_COST` was measured."""
