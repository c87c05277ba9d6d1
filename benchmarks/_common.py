"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import json
import sys
from typing import Any


def emit(result: dict[str, Any]) -> None:
    """Print ``result`` as one JSON object on the last line of stdout."""
    sys.stdout.flush()
    print(json.dumps(result), flush=True)


def log(message: str) -> None:
    """Progress lines go to stderr so stdout ends with the JSON object."""
    print(message, file=sys.stderr, flush=True)
