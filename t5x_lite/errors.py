"""The error of a configuration that cannot work, and its one-line check of a choice.

A leaf module (it imports nothing from t5x_lite), so that the registries the config is
validated against (`t5x_lite.architectures`) and `t5x_lite.config` itself can both raise it.
"""
from __future__ import annotations

from typing import Any, Iterable


class ConfigError(ValueError):
    """A config field holds a value that cannot work; the message names the field."""


def require_choice(field: str, value: Any, allowed: Iterable[str]) -> None:
    """Raise `ConfigError` unless `value` is one of `allowed`; the message lists them."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(f"{field}={value!r} is not allowed; choose one of {', '.join(allowed)}")
