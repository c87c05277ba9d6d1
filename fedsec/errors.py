"""Errors of the ``fedsec`` face."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration is invalid; the message is one line and starts with the key at fault."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
