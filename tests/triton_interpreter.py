"""Triton's interpreter without its repeated patching of ``triton.language``.

Under ``TRITON_INTERPRET=1`` a kernel launch patches ``triton.language`` (its builtins
become NumPy-backed functions) for the length of the launch; then every call of a
``@triton.jit`` helper inside the kernel patches it again: a walk over every member of the
language modules, about 2 ms a call, that finds them patched already. The HSA kernels call
helpers thousands of times per launch, so this was about half of their tests' time.
:func:`patch_once_per_launch` skips the repeated patching where the launch has patched the
modules the helper sees. Where Triton's interpreter lacks the two functions it wraps (a
version that reorganised them), it changes nothing.
"""

from __future__ import annotations

import contextvars
import functools
import inspect

#: the language modules patched in the running launch (``None``: no launch is running)
_patched: contextvars.ContextVar[set[int] | None] = contextvars.ContextVar(
    "triton_patched", default=None
)


class _Unchanged:
    """The patch scope of a call that patched nothing."""

    def restore(self) -> None:
        pass


def patch_once_per_launch() -> bool:
    """Wrap the interpreter's launch and patching; returns whether it could."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    executor = getattr(interpreter, "GridExecutor", None)
    patch = getattr(interpreter, "_patch_lang", None)
    if executor is None or patch is None or getattr(patch, "once_per_launch", False):
        return False
    launch = executor.__call__
    import triton.language as tl

    def languages(fn) -> set[int]:  # the modules _patch_lang patches for fn
        return {
            id(value)
            for value in fn.__globals__.values()
            if inspect.ismodule(value) and value in (tl, tl.core)
        }

    @functools.wraps(patch)
    def patch_lang(fn):
        done, wanted = _patched.get(), languages(fn)
        if done is not None and wanted <= done:
            return _Unchanged()
        if done is not None:
            done |= wanted
        return patch(fn)

    @functools.wraps(launch)
    def run_launch(self, *args, **kwargs):
        token = _patched.set(set())
        try:
            return launch(self, *args, **kwargs)
        finally:
            _patched.reset(token)

    patch_lang.once_per_launch = True
    interpreter._patch_lang = patch_lang
    executor.__call__ = run_launch
    return True
