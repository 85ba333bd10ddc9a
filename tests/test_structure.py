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
    hits = [h for h in _grep(r"\buse_ray\b", *PACKAGES, "bench") if not h.startswith("orchestrator/cluster/runtime.py")]
    assert hits == [], hits


def test_group_kinds_are_asked_in_groups_only():
    hits = [h for h in _grep(r"kind ==", *PACKAGES) if not h.startswith("orchestrator/groups/")]
    assert hits == [], hits


def _names_and_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every identifier and string of a module but its docstrings (prose may
    explain a kind by its name; code may not ask for one)."""
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            found.append((node.lineno, node.value))
        for text in (getattr(node, attr, None) for attr in ("id", "attr", "name", "arg", "asname")):
            if isinstance(text, str):
                found.append((getattr(node, "lineno", 0), text))
    return found


def kind_names_outside_their_plug_ins(root: Path = ROOT) -> list[str]:
    """Where the orchestrator's code (under `root`) names a group kind outside that kind's own
    module and the registry (a kind's module names no other kind either)."""
    from orchestrator.groups.registry import KINDS

    homes = {str(Path(*module.split("."))): kind for kind, module in KINDS.items()}  # a module, or a package
    registry = str(Path("orchestrator", "groups", "registry.py"))
    hits = []
    for path in sorted((root / "orchestrator").rglob("*.py")):
        where = str(path.relative_to(root))
        if where == registry or where.startswith(str(Path("orchestrator", "testing"))):
            continue
        own = homes.get(where[:-3]) or homes.get(str(path.parent.relative_to(root)))
        others = [k for k in KINDS if k != own]
        named = re.compile("|".join(others), re.I)
        hits += [f"{where}:{line}: {text[:60]!r}" for line, text in _names_and_strings(ast.parse(path.read_text()))
                 if named.search(text)]
    return hits


def test_no_group_kind_is_named_outside_its_plug_in_and_the_registry():
    hits = kind_names_outside_their_plug_ins()
    assert hits == [], hits


def test_a_kind_named_outside_its_plug_in_is_found(tmp_path):
    (tmp_path / "orchestrator" / "groups").mkdir(parents=True)
    (tmp_path / "orchestrator" / "groups" / "elsewhere.py").write_text(
        '"""Prose may say gossip."""\nfrom x import allreduce_step\nKIND = "hierarchical"\n')
    (tmp_path / "orchestrator" / "groups" / "gossip.py").write_text('KIND = "gossip"\nOTHER = "Allreduce"\n')
    (tmp_path / "orchestrator" / "groups" / "diloco").mkdir()  # a kind's package: its modules may name it
    (tmp_path / "orchestrator" / "groups" / "diloco" / "member.py").write_text('NAME = "diloco"\nX = "gossip"\n')
    assert kind_names_outside_their_plug_ins(tmp_path) == [
        "orchestrator/groups/diloco/member.py:2: 'gossip'", "orchestrator/groups/elsewhere.py:2: 'allreduce_step'",
        "orchestrator/groups/elsewhere.py:3: 'hierarchical'", "orchestrator/groups/gossip.py:2: 'Allreduce'"]


def test_the_orchestrator_reaches_jobs_only_through_the_workload_registry():
    imports = _grep(r"^\s*(from|import) jobs\b", "orchestrator", "search")
    assert imports == [], imports
    registry = _grep(r"\"jobs\.", "orchestrator", "search")
    assert registry and all(h.startswith("orchestrator/workload.py") for h in registry), registry


def test_jobs_data_pipeline_and_synthesizer_stand_apart_from_the_workload():
    """jobs/data and jobs/features know nothing of the workload that uses them; jobs/synth (the
    speech made for tests and demos) is imported by nothing that trains."""
    upward = _grep(r"^\s*(from|import) jobs\.(workload|linear|models|decode|ngram)\b", "jobs/data", "jobs/features")
    assert upward == [], upward
    synth = [h for h in _grep(r"^\s*(from|import) jobs\.synth\b", "jobs")
             if not h.startswith(("jobs/synth/", "jobs/commands.py"))]  # (`chorus synth` runs it)
    assert synth == [], synth


def test_every_class_docstring_begins_with_what_the_class_is():
    found = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name}" for path in _sources(*PACKAGES)
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
             and (ast.get_docstring(node) or "").lstrip().startswith("Args")]
    assert found == [], f"a class docstring that begins with Args: and no summary line: {found}"


def test_every_module_says_what_it_owns():
    missing = [str(p.relative_to(ROOT)) for p in _sources(*PACKAGES)
               if p.name != "__init__.py" and ast.get_docstring(ast.parse(p.read_text())) is None]
    assert missing == [], missing


MAX_MODULE_LINES = 400
# The orchestrator's packages, bottom to top: a module may import its own layer's and those below,
# never one above (`testing/` is outside: helpers for tests and benchmarks that may use anything).
# `search/` (the Tune layer) sits between the driver it runs trials with and the CLI.
LAYERS = {"base": 0, "workload": 0, "groups": 1, "learner": 2, "service": 3, "cluster": 3, "checkpoint": 3,
          "driver": 4, "search": 5, "cli": 6}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every module of `modules` that `path` imports, at the top or inside a function (a lazy
    import holds a circle open as well), with the packages whose `__init__` such an import runs."""
    found, me = set(), _module_name(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & modules
    # a package's own modules run its `__init__` anyway: that is no edge of theirs
    return {m for m in found if m != me and not me.startswith(m + ".")}


def _import_graph(*packages: str) -> dict[str, set[str]]:
    paths = list(_sources(*packages))
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, modules) for p in paths}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for after in sorted(graph.get(node, ())):
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in on_stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] == "search":
        return LAYERS["search"]
    return LAYERS.get(parts[1]) if parts[0] == "orchestrator" and len(parts) > 1 else None


def test_the_imports_of_the_orchestrator_and_search_form_no_circle():
    graph = _import_graph("orchestrator", "search")
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports between them")
    assert _circles(graph) == []


def test_a_circle_is_found_where_there_is_one():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return [f"{m} ({_layer(m)}) -> {t} ({_layer(t)})" for m, targets in sorted(graph.items())
            for t in sorted(targets) if None not in (_layer(m), _layer(t)) and _layer(t) > _layer(m)]


def test_an_import_up_the_layers_is_found():
    graph = {"orchestrator.groups.gossip": {"orchestrator.learner.replica", "orchestrator.base.flat"},
             "orchestrator.cli.app": {"orchestrator.driver.job", "search.sweep"}}
    assert _upward(graph) == ["orchestrator.groups.gossip (1) -> orchestrator.learner.replica (2)"]


def test_no_module_imports_a_package_above_its_layer():
    graph = _import_graph("orchestrator", "search")
    upward = _upward(graph)
    unplaced = [m for m in graph if _layer(m) is None and m not in ("orchestrator", "search")
                and not m.startswith("orchestrator.testing")]
    assert unplaced == [], f"modules in no layer: {unplaced}"
    assert upward == [], upward


def test_no_module_of_the_orchestrator_over_400_lines():
    sizes = sorted(((len(p.read_text().splitlines()), str(p.relative_to(ROOT))) for p in _sources("orchestrator")),
                   reverse=True)
    print("five largest modules: " + "; ".join(f"{w} ({n})" for n, w in sizes[:5]))
    assert [w for n, w in sizes if n > MAX_MODULE_LINES] == []
