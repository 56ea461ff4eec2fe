"""Switches read from the environment."""

from __future__ import annotations

import os

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")


def env_flag(name: str, default: bool) -> bool:
    """Environment variable ``name`` as a switch: ``1``/``true``/``yes``/``on`` (any case)
    turn it on, ``0``/``false``/``no``/``off`` off; unset or anything else gives
    ``default``."""
    value = os.environ.get(name, "").strip().lower()
    return True if value in ON else False if value in OFF else default
