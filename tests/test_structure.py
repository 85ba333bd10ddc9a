"""The core stays easy to hold in one's head: small classes and functions, one home for
Ray-or-not and for group kinds, the orchestrator reaching the workload only through its registry.
Each test prints what it measured (run with -s to see the largest parts)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parents[1]
PACKAGES = ("orchestrator", "search", "jobs")
MAX_CLASS_LINES, MAX_FUNCTION_LINES = 200, 50


def _sources(*packages: str):
    for package in packages:
        yield from sorted((ROOT / package).rglob("*.py"))


def _definitions(package: str) -> list[tuple[int, str, str]]:
    """(lines, kind, where) of every class and function of a package."""
    found = []
    for path in _sources(package):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                where = f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"
                found.append((node.end_lineno - node.lineno + 1, kind, where))
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_class_over_200_lines_and_no_function_over_50(package):
    found = _definitions(package)
    for kind, limit in (("class", MAX_CLASS_LINES), ("function", MAX_FUNCTION_LINES)):
        largest = sorted((d for d in found if d[1] == kind), reverse=True)
        print(f"{package}: five largest ({kind}): " + "; ".join(f"{w} ({n})" for n, _, w in largest[:5]))
        over = [f"{w} ({n} lines)" for n, _, w in largest if n > limit]
        assert not over, f"over {limit} lines ({kind}): {over}"


def _grep(pattern: str, *packages: str) -> list[str]:
    regex = re.compile(pattern)
    return [f"{path.relative_to(ROOT)}:{i}: {line.strip()}" for path in _sources(*packages)
            for i, line in enumerate(path.read_text().splitlines(), 1) if regex.search(line)]


def test_ray_or_not_is_decided_in_the_runtime_only():
    hits = [h for h in _grep(r"\buse_ray\b", *PACKAGES, "bench") if not h.startswith("orchestrator/runtime.py")]
    assert hits == [], hits


def test_group_kinds_are_asked_in_groups_only():
    hits = [h for h in _grep(r"kind ==", *PACKAGES) if not h.startswith("orchestrator/groups/")]
    assert hits == [], hits


def test_the_orchestrator_reaches_jobs_only_through_the_workload_registry():
    imports = _grep(r"^\s*(from|import) jobs\b", "orchestrator", "search")
    assert imports == [], imports
    registry = _grep(r"\"jobs\.", "orchestrator", "search")
    assert registry and all(h.startswith("orchestrator/workload.py") for h in registry), registry


def test_every_module_says_what_it_owns():
    missing = [str(p.relative_to(ROOT)) for p in _sources(*PACKAGES)
               if p.name != "__init__.py" and ast.get_docstring(ast.parse(p.read_text())) is None]
    assert missing == [], missing
