"""A NaN in an input reaches the output of every op and layer, on PyTorch operations and in
the compiled CPU kernels: a diverging run shows as NaN, never as silently finite values.

The cases are those of :mod:`tests.test_host_sync` (every op and layer, prepared as a
training loop prepares them); one NaN goes into the first entry of the first input that is
not a parameter. Which outputs must turn NaN (those that depend on the entry) is checked
per kernel against the PyTorch operations in ``tests/ops/hsa/test_native*.py`` and
``tests/nn/test_hierarchical_kv_cache.py``.
"""

from __future__ import annotations

import pytest
import torch

from hiergraph.ops.hsa import native
from tests.test_host_sync import CASES, make_case

#: cases whose inputs are token ids or structure only (no float input to poison)
NO_FLOAT_INPUT = {"FamilyPositionEncoder", "HTEDecoder", "HTEDecoder-flat", "HTEDecoder.step",
                  "HTransformer1D"}  # fmt: skip


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "torch-ops"])
@pytest.mark.parametrize("name", [name for name in CASES if name not in NO_FLOAT_INPUT])
def test_a_nan_input_reaches_the_output(name, kernels):
    previous = native.set_enabled(kernels)
    try:
        case = make_case(name, "cpu")
        inputs = [
            t for t in case.grads if not isinstance(t, torch.nn.Parameter) and t.is_floating_point()
        ]
        with torch.no_grad():
            inputs[0].view(-1)[0] = float("nan")
        out = case.fn()
    finally:
        native.set_enabled(previous)
    out = out[0] if isinstance(out, tuple) else out
    assert out.isnan().any()


@pytest.mark.parametrize("name", sorted(NO_FLOAT_INPUT))
def test_the_cases_without_float_inputs_have_none(name):
    case = make_case(name, "cpu")
    assert not [
        t for t in case.grads if not isinstance(t, torch.nn.Parameter) and t.is_floating_point()
    ]
