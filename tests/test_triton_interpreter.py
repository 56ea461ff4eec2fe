"""The test suite's Triton interpreter patches ``triton.language`` once per launch
(:mod:`tests.triton_interpreter`), and kernels that call helpers compute what they did."""

import os

import pytest
import torch

from tests.conftest import triton_runs_kernels

if os.environ.get("TRITON_INTERPRET") != "1" or not triton_runs_kernels():
    pytest.skip(
        "runs where Triton (3.7 or newer: older interpreters write no CPU tensor) interprets "
        "kernels (no GPU)",
        allow_module_level=True,
    )
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402


@triton.jit
def _twice(x):
    return x + x


@triton.jit
def _plus_one(x):
    return _twice(x) - x + 1  # a helper that calls a helper


@triton.jit
def _with_helpers(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    tl.store(out_ptr + i, _twice(_plus_one(x)) + tl.exp(x * 0.0), mask=i < n)


@triton.jit
def _inline(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    tl.store(out_ptr + i, 2 * (x + 1) + tl.exp(x * 0.0), mask=i < n)


def test_helpers_do_not_patch_the_language_again(monkeypatch):
    """A launch of three programs, each calling helpers four times, patches as often as a
    launch without helpers; both compute 2 (x + 1) + 1, and the language is restored."""
    assert getattr(interpreter._patch_lang, "once_per_launch", False)  # conftest installed it
    builtins = {name: getattr(tl, name) for name in ("load", "store", "exp", "arange")}
    patched = []
    patch_builtin = interpreter._patch_builtin
    monkeypatch.setattr(
        interpreter, "_patch_builtin", lambda *a: patched.append(a) or patch_builtin(*a)
    )
    x = torch.arange(10, dtype=torch.float32)
    counts = []
    for kernel in (_inline, _with_helpers):
        out = torch.empty_like(x)
        kernel[(3,)](x, out, 10, BLOCK=4)
        torch.testing.assert_close(out, 2 * (x + 1) + 1)
        counts.append(len(patched))
        patched.clear()
    assert counts[0] > 0 and counts[1] == counts[0]
    assert all(getattr(tl, name) is fn for name, fn in builtins.items())
