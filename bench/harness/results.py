"""What a benchmark leaves behind, the same way for all of them: its result as JSON with a top-level
verdict (`passed`) beside its figure (a PNG of the same name), and the commit it measured."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def write_results(path: Path, result: dict, plot: Callable[[dict, Path], None]) -> None:
    """`result` as JSON at `path` (it must say `passed`), replaced whole, and its figure beside it (same
    name, .png)."""
    if not isinstance(result.get("passed"), bool):
        raise ValueError(f"{path.name}: a benchmark's result needs a top-level boolean 'passed'")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")  # a run killed while writing leaves the last whole result
    partial.write_text(json.dumps(result, indent=2) + "\n")
    partial.replace(path)
    plot(result, path.with_suffix(".png"))


def commit() -> str:
    """What a result was measured at: the checkout's HEAD (short hash), with "+uncommitted changes"
    after it when tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("+uncommitted changes" if git("status", "--porcelain",
                                                                              "--untracked-files=no") else "")
