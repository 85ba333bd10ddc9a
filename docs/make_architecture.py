"""Draw docs/architecture.dot from the tree itself: one frame per package of `orchestrator/` (and
`search/`, `jobs/`), one box per module, the packages' imports as grey arrows counted by module
pairs, and the path of one spec to a learner's step in red, numbered as in architecture.md's
"Follow one spec". A module that is gone from the tree fails the drawing, so the picture cannot
drift from the code; `tests/test_docs.py` checks that the committed .dot is what this prints.

    python docs/make_architecture.py            # write docs/architecture.dot
    python docs/make_architecture.py --check    # exit 1 if it is not current
    dot -Tpng -Gdpi=100 docs/architecture.dot -o docs/architecture.png
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "architecture.dot"
# the frames, top to bottom, as the layers of tests/test_structure.py
FRAMES = [("orchestrator/cli", "cli/: the chorus command (composition root)"),
          ("search", "search/: sweeps on Ray Tune, every trial a TrainingJob"),
          ("orchestrator/driver", "driver/: the job's driver"),
          ("orchestrator/service", "service/: the job's service process"),
          ("orchestrator/cluster", "cluster/: where processes run"),
          ("orchestrator/checkpoint", "checkpoint/: what a run keeps"),
          ("orchestrator/learner", "learner/: one replica on one device (a Ray actor)"),
          ("orchestrator/groups", "groups/: how learners agree (no speech)"),
          ("orchestrator/base", "base/ and the workload protocol"),
          ("jobs", "jobs/: the speech workload; data/, features/, synth/ (never imports Ray or orchestrator/)")]
ROW = 4  # boxes in a row of a frame
WHOLE = ("search", "jobs")  # drawn as one box each: packages beside the orchestrator
LOOSE = {"orchestrator/workload.py": "orchestrator/base"}  # a module drawn in another package's frame
# the path of one spec to a learner's step: (from, to, label), as docs/architecture.md tells it
PATH = [("orchestrator/cli/train.py", "orchestrator/driver/config.py", "1 load_spec"),
        ("orchestrator/cli/train.py", "orchestrator/driver/job.py", "2 run()"),
        ("orchestrator/driver/job.py", "orchestrator/driver/elastic.py", "3 start"),
        ("orchestrator/driver/elastic.py", "orchestrator/cluster/capacity.py", "3 slots"),
        ("orchestrator/driver/elastic.py", "orchestrator/cluster/runtime.py", "3 start_learner"),
        ("orchestrator/cluster/runtime.py", "orchestrator/learner/service.py", "3 LearnerActor"),
        ("orchestrator/driver/job.py", "orchestrator/driver/group.py", "3 form"),
        ("orchestrator/driver/group.py", "orchestrator/groups/registry.py", "3 kind_of"),
        ("orchestrator/groups/registry.py", "orchestrator/groups/allreduce.py", "3 KIND.strategy, members"),
        ("orchestrator/driver/job.py", "orchestrator/driver/loop.py", "4 run()"),
        ("orchestrator/driver/loop.py", "orchestrator/learner/service.py", "4 run(steps)"),
        ("orchestrator/learner/service.py", "orchestrator/learner/replica.py", "5 timed_step"),
        ("orchestrator/learner/replica.py", "orchestrator/groups/allreduce.py", "5 member.step"),
        ("orchestrator/groups/allreduce.py", "orchestrator/workload.py", "5 loss, optimizer_step"),
        ("orchestrator/workload.py", "jobs/workload.py", "5 (registry)"),
        ("orchestrator/driver/loop.py", "orchestrator/driver/snapshots.py", "4 evaluate"),
        ("orchestrator/driver/snapshots.py", "orchestrator/checkpoint/snapshot.py", "4 Snapshot")]


def modules() -> dict[str, str]:
    """Every module drawn (its path) -> its frame; __init__ files and `testing/` are not drawn."""
    found = {}
    for frame, _ in FRAMES:
        for path in sorted((ROOT / frame).rglob("*.py") if frame in WHOLE else (ROOT / frame).glob("*.py")):
            if path.name not in ("__init__.py", "__main__.py"):
                found[str(path.relative_to(ROOT))] = frame
    return {**found, **LOOSE}


def _dotted(path: str) -> str:
    return path[:-3].replace("/", ".")


def imports_between_frames(drawn: dict[str, str]) -> Counter:
    """(frame, frame) -> how many module pairs import across them (lazy imports included)."""
    by_name = {_dotted(p): frame for p, frame in drawn.items()}
    pairs = set()
    for path, frame in drawn.items():
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            pairs |= {(path, name) for name in names if name in by_name and by_name[name] != frame}
    return Counter((drawn[a], by_name[b]) for a, b in pairs)


def _node(path: str) -> str:
    """A module's box, or for a package drawn whole (`WHOLE`) the package's."""
    top = path.split("/", 1)[0]
    return f"p_{top}" if top in WHOLE else "m_" + path[:-3].replace("/", "_")


def dot() -> str:
    drawn = modules()
    for a, b, _ in PATH:
        for end in (a, b):
            if end not in drawn:
                raise SystemExit(f"make_architecture: {end} (on the path of one spec) is not in the tree")
    lines = ["// Generated by docs/make_architecture.py from the tree: do not edit by hand.",
             "// Render: dot -Tpng -Gdpi=100 docs/architecture.dot -o docs/architecture.png",
             "digraph chorus {",
             '  graph [rankdir=TB, compound=true, fontname="Helvetica", fontsize=13, nodesep=0.15,',
             '         ranksep=0.5, pad=0.2, labelloc=t, label="Chorus: one frame per package, one box per module; '
             'grey: imports between packages (module pairs); red: one spec to a learner\'s step"];',
             '  node  [shape=box, style="rounded,filled", fillcolor="#ffffff", fontname="Helvetica", fontsize=10,'
             ' margin="0.08,0.03"];',
             '  edge  [fontname="Helvetica", fontsize=9, color="#9a9a9a", fontcolor="#777777"];']
    for i, (frame, label) in enumerate(FRAMES):
        members = [p for p, f in drawn.items() if f == frame]
        if frame in WHOLE:
            box = f'[label="{label}\\n({len(members)} modules)", fillcolor="#eef3e2"]'
            lines.append(f'  {_node(frame + "/.py")} {box};')
            continue
        lines += [f"  subgraph cluster_{i} {{", f'    label="{label}"; style="rounded"; color="#4a6fa5";'
                  ' fontcolor="#4a6fa5";']
        lines += [f'    {_node(p)} [label="{p.split("/", 1)[1] if "/" in p else p}"];' for p in members]
        lines += [f"    {_node(a)} -> {_node(b)} [style=invis];"  # rows of ROW boxes
                  for a, b in zip(members, members[ROW:], strict=False)]
        lines.append("  }")
    first = {frame: _node(next(p for p, f in drawn.items() if f == frame)) for frame, _ in FRAMES}

    def ends(frame: str, key: str) -> str:
        return "" if frame in WHOLE else f"{key}=cluster_{[f for f, _ in FRAMES].index(frame)}, "

    for (a, b), n in sorted(imports_between_frames(drawn).items()):
        lines.append(f'  {first[a]} -> {first[b]} [{ends(a, "ltail")}{ends(b, "lhead")}label="{n}"];')
    lines.append('  edge [color="#c0392b", fontcolor="#c0392b", penwidth=1.6, fontsize=9.5];')
    lines += [f'  {_node(a)} -> {_node(b)} [label="{label}"];' for a, b, label in PATH]
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    text = dot()
    if "--check" in sys.argv[1:]:
        if OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is not current: run python docs/make_architecture.py and render it")
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
