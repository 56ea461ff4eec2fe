"""Moving a plan (a dataclass of index tensors and nested plans) to another device."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import TypeVar

from torch import Tensor

Plan = TypeVar("Plan")


def moved(plan: Plan, device, **given) -> Plan:
    """A copy of the dataclass ``plan`` with every tensor and nested dataclass field, and
    every list of them, moved to ``device`` (``.to(device)``); other fields are shared.
    ``given``: fields taken as they are instead (e.g. an index already moved)."""
    values = dict(given)
    for f in fields(plan):
        if f.name not in given:
            values[f.name] = _to(getattr(plan, f.name), device)
    return type(plan)(**values)


def _to(value, device):
    if isinstance(value, list):
        return [_to(v, device) for v in value]
    return value.to(device) if isinstance(value, Tensor) or is_dataclass(value) else value
