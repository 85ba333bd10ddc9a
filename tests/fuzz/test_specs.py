"""Fuzzing the readers of what a user writes: job specs (`orchestrator.driver.config.load_spec`), their
`--set` overrides, and sweep specs (`search.spec.load_sweep`, with `--set job.*` and `space.*`).
Own error: `SpecError`, a line for each problem, the first naming the spec file (a job spec's
every line names it, with the key). A spec that loads is a model of the spec, and the same dump
loads again to the same spec."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from orchestrator.driver.config import JobSpec, SpecError, load_spec, parse_spec
from search.spec import load_sweep
from tests.fuzz.fuzzing import JSON_VALUES, Sandbox, edited, fuzzed, one_input

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parents[2]
TINY = (ROOT / "jobs" / "configs" / "tiny.yaml").read_text()
SWEEP = (ROOT / "search" / "configs" / "bohb_tiny.yaml").read_text().replace(
    "job: jobs/configs/tiny.yaml", f"job: {ROOT / 'jobs' / 'configs' / 'tiny.yaml'}")
KEYS = ["name", "seed", "learners", "data.train", "data.max_batch_seconds", "optim.lr", "optim.schedule",
        "model.hidden", "model.tokenizer", "model.tokenizer.kind", "group.kind", "budget.epochs", "features",
        "simulate.slowdown", "learner_resources", "accelerator_types", "decoding.warps", "a.b.c", ""]
VALUES = st.sampled_from(["[1, 2", "a: b: c", "@x", "{a: 1", "!!python/object:os.system x", "*alias", "&a [*a]",
                          "0x1F", ".nan", "-.inf", "1e999", "null", "~", "[]", "'", '"\\x"', "\t", "é", "2"]) \
    | st.text(max_size=12)
OVERRIDES = st.lists(st.builds(lambda key, value: f"{key}={value}", st.sampled_from(KEYS) | st.text(max_size=8),
                               VALUES) | st.text(max_size=10), max_size=3)


def _dumps_again(spec: JobSpec, where: str) -> None:
    again = parse_spec(spec.model_dump(mode="json"), where, check_paths=False)
    assert again == spec


@fuzzed(200)
@given(text=edited(TINY.encode(), 4) | st.binary(max_size=100), overrides=OVERRIDES)
@example(text=TINY.encode(), overrides=["optim.lr=[1, 2"])  # was PyYAML's traceback
@example(text=b"data: [unclosed\n", overrides=[])  # was a message of five lines
@example(text=b"name: \xff\n", overrides=[])  # not UTF-8: was a UnicodeDecodeError's traceback
@example(text=TINY.encode(), overrides=["optim.a\nb=1"])  # a key holding a newline broke the line
@example(text=b"\x80", overrides=[])  # was a UnicodeDecodeError's traceback
@example(text=b"\x00", overrides=[])  # was PyYAML's message of several lines
@example(text=TINY.encode(), overrides=["\x1b=@"])  # a key's control character went into the message
def test_a_job_spec_file_loads_or_is_refused_naming_the_file_and_key(tmp_path, text, overrides):
    with Sandbox(tmp_path) as box:
        path = box.run / "job.yaml"
        path.write_bytes(text)
        with one_input(SpecError, starts=f"{path}: ", per_problem=True) as outcome:
            _dumps_again(load_spec(path, overrides, check_paths=False), str(path))
        if outcome.error is not None:
            assert all(line.startswith(f"{path}: ") for line in str(outcome.error).split("\n"))


def _set_in(raw: dict, path: list[str], value) -> dict:
    node = raw
    for part in path[:-1]:
        node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
    node[path[-1]] = value
    return raw


@fuzzed(100)
@given(changes=st.lists(st.tuples(st.sampled_from(KEYS[:-1]).map(lambda k: k.split(".")) | st.lists(
    st.text(max_size=6) | st.integers(), min_size=1, max_size=3), JSON_VALUES), max_size=3))
@example(changes=[(["\ud7fc"], 1)])  # a key of an unassigned character went into the message as it was
@example(changes=[(["learner_resources"], {"\x1f": -1})])  # ... and a control character in a validator's message
def test_a_spec_of_any_values_is_a_spec_or_refused_naming_each_key(changes):
    raw = yaml.safe_load(TINY)
    for path, value in changes:
        raw = _set_in(raw, path, value)
    with one_input(SpecError, starts="fuzz.yaml: ", per_problem=True) as outcome:
        _dumps_again(parse_spec(raw, "fuzz.yaml", check_paths=False), "fuzz.yaml")
    if outcome.error is not None:
        assert all(line.startswith("fuzz.yaml: ") for line in str(outcome.error).split("\n"))


@fuzzed(60)
@given(text=edited(SWEEP.encode(), 3), overrides=st.lists(st.builds(
    lambda where, key, value: f"{where}{key}={value}", st.sampled_from(["", "job.", "space."]),
    st.sampled_from(KEYS + ["optim.lr.high", "optim.lr.type", "model.hidden.choices", "method", "budget.max",
                            "trials", "metric"]), VALUES), max_size=3))
@example(text=SWEEP.encode(), overrides=["space.optim.lr.high=[1, 2"])  # was PyYAML's traceback
@example(text=SWEEP.encode(), overrides=["name=@x"])  # was PyYAML's traceback
@example(text=SWEEP.replace("job: /", "job: .").encode(), overrides=[])  # its error named the job file, not the sweep
def test_a_sweep_spec_loads_or_is_refused_naming_the_file(tmp_path, text, overrides):
    with Sandbox(tmp_path) as box:
        path = box.run / "sweep.yaml"
        path.write_bytes(text)
        with one_input(SpecError, starts=f"{path}: ", per_problem=True):
            sweep = load_sweep(path, overrides, check_paths=False)
            assert sweep.trials >= 1 and sweep.space.corners()
