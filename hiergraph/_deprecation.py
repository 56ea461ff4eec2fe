"""Renamed arguments: the mechanism of the deprecation policy (Conventions, "Renamed arguments").

A public argument that gets a new name keeps its old one working until
:data:`REMOVED_IN`: a call that passes the old keyword runs as if it had passed the new
one, and gets a :class:`FutureWarning` (shown by default, unlike ``DeprecationWarning``)
that names both and the release that drops the old name. Positional calls are unaffected
(a rename keeps the argument's position), and so are saved ``state_dict`` files (they hold
no argument names).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import TypeVar

#: The release from which renamed arguments' old names are refused.
REMOVED_IN = "0.3.0"

F = TypeVar("F", bound=Callable)


def renamed_arguments(**renames: str) -> Callable[[F], F]:
    """Decorates a function (or a class's ``__init__``) whose keyword arguments were
    renamed: ``renamed_arguments(old="new", ...)``.

    The old keyword is passed on as the new one, with a :class:`FutureWarning`; both at
    once raise a :class:`TypeError`. The decorated function keeps its signature (the new
    names) for :func:`inspect.signature` and the documentation.
    """

    def decorate(fn: F) -> F:
        name = fn.__qualname__.removesuffix(".__init__")

        @functools.wraps(fn)
        def call(*args, **kwargs):
            for old, new in renames.items():
                if old not in kwargs:
                    continue
                if new in kwargs:
                    raise TypeError(
                        f"{name}() got both {old!r} and {new!r}; {old!r} is the old name "
                        f"of {new!r}: pass {new!r} only"
                    )
                warnings.warn(
                    f"{name}(): the argument {old!r} is now called {new!r}; {old!r} stops "
                    f"working in hiergraph {REMOVED_IN}",
                    FutureWarning,
                    stacklevel=2,
                )
                kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return call

    return decorate


class renamed_attribute:  # (lower case: used like property)
    """A read-only attribute under its old name that returns the attribute ``new``, with a
    :class:`FutureWarning` naming both and the release that drops the old name (``why``, if
    given, says why it was renamed): ``old = renamed_attribute("new")`` in a class body."""

    def __init__(self, new: str, why: str = ""):
        self.new, self.why = new, why
        self.__doc__ = f"The old name of ``{new}`` (a ``FutureWarning``; until {REMOVED_IN})."

    def __set_name__(self, owner: type, name: str) -> None:
        self.old = name

    def __get__(self, obj, owner: type | None = None):
        if obj is None:
            return self
        why = f" ({self.why})" if self.why else ""
        warnings.warn(
            f"{type(obj).__name__}.{self.old} is now called {self.new}{why}; {self.old!r} "
            f"stops working in hiergraph {REMOVED_IN}",
            FutureWarning,
            stacklevel=2,
        )
        return getattr(obj, self.new)
