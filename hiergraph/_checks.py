"""Argument checks shared by the ops, the data builders and the layers."""

from __future__ import annotations

import math
import operator
from numbers import Integral, Real

import torch

from hiergraph._device import reads_values


def check_int(
    value, name: str, *, minimum: int = 1, optional: bool = False, lazy: bool = False
) -> None:
    """Raise unless ``value`` is an int ``>= minimum`` (``None`` too if ``optional``;
    ``-1``, "inferred on the first call", too if ``lazy``)."""
    if optional and value is None:
        return
    if isinstance(value, torch.SymInt):  # a size traced by torch.compile
        return
    is_int = isinstance(value, Integral) and not isinstance(value, bool)
    if is_int and (value >= minimum or (lazy and value == -1)):
        return
    wanted = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    if lazy:
        wanted += " or -1 (inferred on the first call)"
    if optional:
        wanted += " or None"
    raise (ValueError if is_int else TypeError)(f"{name} must be {wanted}, got {value!r}")


def check_bool(value, name: str) -> None:
    """Raise a ``TypeError`` unless ``value`` is a bool (Python's, NumPy's or a 0-d bool
    tensor): a flag given as a string or a number is refused rather than read by its truth
    value (``"no"`` is true)."""
    if isinstance(value, bool):
        return
    dtype = str(getattr(value, "dtype", ""))
    if dtype not in ("bool", "torch.bool") or getattr(value, "ndim", 1) != 0:
        raise TypeError(f"{name} must be a bool, got {value!r}")


def check_positive(value, name: str) -> None:
    """Raise unless ``value`` is a finite real number ``> 0`` (a radius, a temperature), or
    a one-element floating-point tensor holding one (a learned temperature; its value is
    read only where that is free, :func:`~hiergraph._device.reads_values`)."""
    number = isinstance(value, Real) and not isinstance(value, bool)
    if not number and not (
        isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point()
    ):
        raise TypeError(f"{name} must be a finite number > 0, got {value!r}")
    if isinstance(value, torch.Tensor) and not reads_values(value):
        return  # on an accelerator a host read would wait for every queued kernel
    x = float(value.detach()) if isinstance(value, torch.Tensor) else value
    if not (x > 0 and math.isfinite(x)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def check_probability(value, name: str) -> None:
    """Raise unless ``value`` is a number in ``[0, 1]`` (a dropout rate)."""
    if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")


def check_fractions(fractions) -> list[float]:
    """``fractions`` as a list of split fractions: numbers (NumPy's too, or a 1-D floating
    tensor's) in ``[0, 1]`` that sum to 1 (``TypeError`` for a non-number, ``ValueError``
    otherwise; a NaN or negative part used to pass the sum check and take every item)."""
    fractions = [_as_number(f) for f in fractions]
    if any(isinstance(f, bool) or not isinstance(f, Real) for f in fractions):
        raise TypeError(f"fractions must be numbers in [0, 1], got {fractions}")
    if not all(0 <= f <= 1 for f in fractions):
        raise ValueError(f"fractions must be numbers in [0, 1], got {fractions}")
    if not fractions or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"fractions must sum to 1, got {fractions}")
    return fractions


def _as_number(value):
    """A floating tensor of one element as its Python float; anything else as it is."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
        return value.item()
    return value


def as_int(value, what: str) -> int:
    """``value`` as an int, refused unless it is one: an int, a NumPy integer or a tensor of
    one integer (a float, a bool or a float tensor is not silently truncated)."""
    is_bool = isinstance(value, bool) or getattr(value, "dtype", None) in (torch.bool, bool)
    try:
        if not is_bool:
            return operator.index(value)
    except TypeError:
        pass
    raise TypeError(f"{what} must be an int, got {value!r}")


#: the largest seed a ``torch.Generator`` takes (``manual_seed`` of ``2**64`` overflows)
MAX_SEED = 2**64 - 1


def check_seed(value, name: str = "seed") -> int:
    """``value`` as a seed: an int (NumPy's too, :func:`as_int`) in ``[0, 2**64 - 1]``, the
    range of ``torch.Generator.manual_seed`` (``TypeError`` / ``ValueError`` naming ``name``;
    a negative seed, which torch would alias to a large one, is refused)."""
    seed = as_int(value, name)
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"{name} must be an int in [0, 2**64 - 1], got {seed}")
    return seed


def check_qkv_like(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise a ``TypeError`` unless the queries, keys and values share one (real)
    floating-point dtype, the one the attention computes in, and a ``ValueError`` unless
    they share one device."""
    if not (q.is_floating_point() and q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


def holds_integers(t: torch.Tensor) -> bool:
    """Whether tensor ``t`` holds integers (not floats, complex numbers or bools): ids,
    counts, positions of any integer width."""
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def described(value) -> str:
    """What an error message says was given: a tensor's dtype and shape, else the type's
    name."""
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {tuple(value.shape)}"
    return type(value).__name__


def refuse_where(bad: torch.Tensor, message: str, found=None) -> None:
    """Raise ``ValueError(message)`` where the one-element bool tensor ``bad`` is true: read
    on the host for a CPU tensor (``found()``, if given, adds what was found); on an
    accelerator or under ``torch.compile`` a device-side assertion instead (no host
    synchronisation: it fails the next call that waits for the device)."""
    if not reads_values(bad):
        torch._assert_async(~bad, message)
    elif bool(bad):
        raise ValueError(message if found is None else f"{message}: {found()}")


def check_ids(
    ids: torch.Tensor, count: int, what: str, name: str, *, device_assert: bool = True
) -> None:
    """Raise unless every value of ``ids`` lies in ``[0, count)`` (``name`` the argument
    that set ``count``, ``what`` the kind of id): one host read for CPU ids, a
    ``ValueError`` naming the range found; on an accelerator a device-side assertion (no
    host synchronisation: ids out of range would otherwise match nothing), unless
    ``device_assert`` is ``False`` (where the lookup they feed asserts on the device
    itself, as an embedding's does)."""
    if not ids.numel():
        return
    if reads_values(ids):
        low, high = torch.stack(torch.aminmax(ids)).tolist()
        if low < 0 or high >= count:
            raise ValueError(
                f"{what} ids span {low}..{high}; they must lie in [0, {name} = {count})"
            )
    elif device_assert:
        inside = ((ids >= 0) & (ids < count)).all()
        torch._assert_async(inside, f"{what} ids must lie in [0, {name} = {count})")
