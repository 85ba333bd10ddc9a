"""Strict JSON, for every JSON Chorus writes (summaries, evaluation and event logs, what the CLI
prints): NaN and Infinity are not JSON, so a non-finite float is written as `null` (a loss that
diverged, a rate over nothing), and `allow_nan=False` makes any other way in an error.

Example:
    >>> dumps({"final_train_loss": float("nan"), "wer_test": 12.5})
    '{"final_train_loss": null, "wer_test": 12.5}'
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """`value` with every non-finite float in it (at any depth of dicts, lists and tuples) made None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, **kwargs) -> str:
    """json.dumps of `finite(value)`, refusing anything non-finite left."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)
