"""The statistics of a comparison, the same for every benchmark, so that a sceptical reader can trust
each ratio the same way: contenders run interleaved (each repeat measures every contender once, in
an order that rotates by one from repeat to repeat, so a slow spell of this shared machine falls on
all of them; with repeats a multiple of the contenders each goes first equally often), at least
`MIN_REPEATS` repeats, summarised as median and interquartile range; a ratio of two medians is a
win only when the two IQRs do not overlap (otherwise it is called a tie).

Example:
    >>> runs = interleaved({"a": lambda r: 1.0 + r, "b": lambda r: 2.0 * (r + 1)}, repeats=5, progress=None)
    >>> summary(runs["a"])["median"], compare(summary(runs["b"]), summary(runs["a"]))["verdict"]
    (3.0, 'tie')
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping

MIN_REPEATS = 5


def interleaved(contenders: Mapping[str, Callable[[int], float]], repeats: int = MIN_REPEATS,
                progress: Callable[[str], None] | None = print) -> dict[str, list[float]]:
    """Runs each contender's measurement (called with the repeat's index) once per repeat; the order
    rotates by one each repeat. Returns every contender's values in repeat order."""
    if repeats < MIN_REPEATS:
        raise ValueError(f"repeats={repeats}: a comparison needs at least {MIN_REPEATS}")
    names = list(contenders)
    if not names:
        raise ValueError("no contenders to compare")
    runs: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name].append(float(contenders[name](repeat)))
        if progress is not None:
            progress(f"repeat {repeat + 1}/{repeats}: " + ", ".join(f"{n} {runs[n][-1]:.4g}" for n in names))
    return runs


def summary(values: list[float], digits: int = 6) -> dict:
    """Median, interquartile range (inclusive quartiles) and the values themselves."""
    if not values:
        raise ValueError("no values to summarise")
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return {"median": round(statistics.median(values), digits), "iqr": [round(q[0], digits), round(q[2], digits)],
            "runs": [round(v, digits) for v in values]}


def compare(a: dict, b: dict) -> dict:
    """`a`'s median over `b`'s (two `summary` results; None when `b`'s is 0) and whether that ratio
    is outside the noise: 'higher' or 'lower' when the IQRs are apart, 'tie' when they overlap."""
    ratio = round(a["median"] / b["median"], 4) if b["median"] else None
    if a["iqr"][0] > b["iqr"][1]:
        verdict = "higher"
    elif a["iqr"][1] < b["iqr"][0]:
        verdict = "lower"
    else:
        verdict = "tie"
    return {"ratio": ratio, "verdict": verdict}
