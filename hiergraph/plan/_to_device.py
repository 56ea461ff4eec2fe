"""Moving a plan (a dataclass of index tensors and nested plans) to another device."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import TypeVar

from torch import Tensor

Plan = TypeVar("Plan")


def moved(plan: Plan, device, *, cached: tuple[str, ...] = (), **given) -> Plan:
    """A copy of the dataclass ``plan`` with every tensor and nested dataclass field, and
    every list or dict of them, moved to ``device`` (``.to(device)``); other fields are
    shared. ``given``: fields taken as they are instead (e.g. an index already moved).
    ``cached``: names of parts built on first use (``functools.cached_property``) that
    move along where ``plan`` has built them (else the copy builds them on first use)."""
    values = dict(given)
    for f in fields(plan):
        if f.name not in given:
            values[f.name] = _to(getattr(plan, f.name), device)
    copy = type(plan)(**values)
    for name in cached:
        if name in vars(plan):
            vars(copy)[name] = _to(vars(plan)[name], device)
    return copy


def _to(value, device):
    if isinstance(value, list):
        return [_to(v, device) for v in value]
    if isinstance(value, dict):
        return {key: _to(v, device) for key, v in value.items()}
    return value.to(device) if isinstance(value, Tensor) or is_dataclass(value) else value
