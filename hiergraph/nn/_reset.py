"""Re-initialising the parts of a layer, user-given modules included."""

from __future__ import annotations

from torch import nn


def reset(module: nn.Module | None) -> None:
    """Re-initialise ``module``: by its ``reset_parameters()`` where it has one, else each
    of its children in turn (as PyG's ``torch_geometric.nn.inits.reset``), and a
    :class:`torch.nn.MultiheadAttention`, which has none, by its own
    ``_reset_parameters()`` after its children (its input projections are its own
    parameters). ``None`` is left alone."""
    if module is None:
        return
    if hasattr(module, "reset_parameters"):
        module.reset_parameters()
        return
    for child in module.children():
        reset(child)
    if isinstance(module, nn.MultiheadAttention):
        module._reset_parameters()
