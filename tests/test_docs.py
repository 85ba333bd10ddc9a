"""The docs stay true: docs/spec.md is what the spec models generate, docs/architecture.dot what the
tree draws, every YAML example in the README validates, the README stays short, and the docs'
relative links lead to files that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
DOCS = [README, ROOT / "bench" / "README.md", ROOT / "docs" / "architecture.md"]


def test_spec_reference_is_current():
    proc = subprocess.run([sys.executable, "docs/make_spec_docs.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_architecture_picture_is_drawn_from_the_tree():
    proc = subprocess.run([sys.executable, "docs/make_architecture.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _yaml_blocks(path: Path) -> list[str]:
    return re.findall(r"^```yaml\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def test_readme_yaml_examples_validate(tmp_path, monkeypatch):
    """A block with a `space` is a sweep spec (loaded as `chorus sweep` would); any other block is
    a part of a job spec, checked on top of the demo's tiny.yaml."""
    from orchestrator.driver.config import parse_spec
    from search.spec import load_sweep

    monkeypatch.chdir(ROOT)  # the examples name files relative to the repository
    blocks = _yaml_blocks(README)
    assert any("space" in yaml.safe_load(b) for b in blocks), "the README shows no sweep spec"
    for i, block in enumerate(blocks):
        raw = yaml.safe_load(block)
        if "space" in raw:
            path = tmp_path / f"readme_sweep_{i}.yaml"
            path.write_text(block)
            load_sweep(path, check_paths=False)
        else:
            tiny = yaml.safe_load((ROOT / "jobs" / "configs" / "tiny.yaml").read_text())
            parse_spec({**tiny, **raw}, f"README.md, yaml block {i + 1}", check_paths=False)


def test_readme_is_short_and_starts_with_the_quick_start():
    text = README.read_text()
    words = len(text.split())
    assert words <= 1500, f"README.md has {words} words (at most 1,500; figures go to bench/README.md)"
    sections = re.findall(r"^## (.+)$", text, flags=re.M)
    assert sections[0] == "Quick start", sections
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^```bash\n(.*?)^```", quick, flags=re.S | re.M)[0]
    assert [line.split("#")[0].strip() for line in commands.strip().splitlines()] == ["make demo", "make test"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_files(doc):
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"[a-z]+://|#|mailto:", target):
            continue
        if not (doc.parent / target.split("#")[0]).exists():
            missing.append(target)
    assert not missing, f"{doc.relative_to(ROOT)} links to files that do not exist: {missing}"
