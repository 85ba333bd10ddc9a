"""Bad input is refused early and by name: a job with no usable utterances, data a learner cannot
read on its node, non-finite numbers in the JSON Chorus writes, a token file that is missing or
empty. Unit tier: no Ray cluster (one-learner jobs run in this process)."""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from jobs.sections import WorkloadConfig
from jobs.workload import AsrWorkload
from orchestrator.driver.job import TrainingJob
from tests.builders import make_spec, run_cli

ROOT = Path(__file__).parents[3]
TINY = ROOT / "jobs" / "configs" / "tiny.yaml"


def _missing(tmp_path: Path, name: str, n: int = 5) -> Path:
    """A manifest of `n` utterances whose audio files do not exist."""
    path = tmp_path / name
    path.write_text("".join(json.dumps({"audio_filepath": f"gone-{i}.flac", "duration": 1.0, "text": "go"}) + "\n"
                            for i in range(n)))
    return path


def _subset(corpus: Path, tmp_path: Path, split: str, n: int, copy: bool = False) -> Path:
    """A manifest of the first `n` utterances of `split`: absolute paths into the corpus, or (with
    `copy`) paths to copies of their audio next to the manifest (so a test may remove them)."""
    folder = tmp_path / f"{split}-{n}"
    folder.mkdir()
    rows = [json.loads(line) for line in (corpus / f"{split}.jsonl").read_text().splitlines()[:n]]
    for row in rows:
        source = corpus / row["audio_filepath"]
        if copy:
            (folder / source.name).write_bytes(source.read_bytes())
            row["audio_filepath"] = source.name
        else:
            row["audio_filepath"] = str(source)
    manifest = folder / f"{split}.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return manifest


BAD_INPUT = {"name": "bad-input", "optim": {"warmup_steps": 1}}  # for make_spec: lr and schedule at their defaults


# -- no usable utterances: refused before anything is placed ---------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("learners", [1, 2])
def test_train_without_usable_utterances_exits_1_before_ray_naming_manifest_and_reasons(tmp_path, learners):
    train = _missing(tmp_path, "train.jsonl")
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "empty", "data": {"train": str(train)}, "learners": learners,
                                    "budget": {"epochs": 1}}))
    out = tmp_path / "run"
    proc = run_cli("train", str(spec), "--out", str(out), timeout=300, cwd=ROOT)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == \
        f"Error: no usable training utterances in {train}: 5 skipped (missing audio file: 5)"
    assert "Traceback" not in proc.stderr
    assert "Ray dashboard" not in proc.stdout  # refused before Ray was started
    assert not (out / "summary.json").exists()


@pytest.mark.unit
@pytest.mark.parametrize("split, empty_how, expected", [
    ("dev", "no lines", "no usable dev utterances in {path}: it lists none"),
    ("test", "files missing", "no usable test utterances in {path}: 3 skipped (missing audio file: 3)"),
    ("test_unseen", "files missing", "no usable test_unseen utterances in {path}: 3 skipped (missing audio file: 3)"),
])
def test_a_given_eval_set_without_usable_utterances_is_an_error_naming_it(corpus, tmp_path, split, empty_how,
                                                                          expected):
    if empty_how == "no lines":
        path = tmp_path / f"{split}.jsonl"
        path.write_text("\n")
    else:
        path = _missing(tmp_path, f"{split}.jsonl", n=3)
    spec = make_spec(data__train=str(_subset(corpus, tmp_path, "train", 4)), **{f"data__{split}": str(path)},
                     **BAD_INPUT)
    with pytest.raises(ValueError, match=f"^{re.escape(expected.format(path=path))}$") as err:
        TrainingJob(spec, tmp_path / "run").run()
    assert type(err.value).__name__ == "DataError"
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.unit
def test_wer_over_zero_utterances_is_none_not_zero(corpus, tmp_path):
    dev = _subset(corpus, tmp_path, "dev", 2, copy=True)
    workload = AsrWorkload(WorkloadConfig(data={"train": dev}))
    for utterance in workload.corpus(dev).utterances:  # indexed while they were there
        utterance.path.unlink()
    result = workload.evaluate(workload.build_model(), dev)
    assert result["wer"] is None and result["utterances"] == 0 and result["skipped"] == 2


# -- learner-side skips --------------------------------------------------------------------------
def _corrupt(manifest: Path, n: int) -> None:
    """Cut the first `n` audio files of `manifest` short: their header still reads (the driver's
    index keeps them), their samples do not (a learner loading them skips them)."""
    for line in manifest.read_text().splitlines()[:n]:
        path = manifest.parent / json.loads(line)["audio_filepath"]
        path.write_bytes(path.read_bytes()[:1000])


@pytest.mark.unit
def test_files_a_learner_cannot_read_are_counted_in_the_summary(corpus, tmp_path):
    train = _subset(corpus, tmp_path, "train", 8, copy=True)
    _corrupt(train, 2)
    summary = TrainingJob(make_spec(data__train=str(train), **BAD_INPUT), tmp_path / "run").run()
    assert summary["skipped_utterances"] == {"unreadable audio file": 2}
    assert summary["samples"] == 6
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["skipped_utterances"] == \
        {"unreadable audio file": 2}


@pytest.mark.unit
def test_a_learner_that_can_read_none_of_its_shard_is_an_error(corpus, tmp_path):
    train = _subset(corpus, tmp_path, "train", 8, copy=True)
    _corrupt(train, 8)
    expected = (rf"^none of the 8 utterances of this learner's shard of {re.escape(str(train))} could be read on "
                r"host \S+ \(8 skipped \(unreadable audio file: 8\)\)$")
    with pytest.raises(ValueError, match=expected):
        TrainingJob(make_spec(data__train=str(train), **BAD_INPUT), tmp_path / "run").run()


@pytest.mark.ray
@pytest.mark.parametrize("corrupt", [2, 8])
def test_learners_on_ray_report_what_they_cannot_read(ray_session, corpus, tmp_path, corrupt):
    """Two gossip learners on the session's cluster: their skips reach the summary through their
    chunk stats; a learner that can read nothing fails the job with its own one-line message."""
    train = _subset(corpus, tmp_path, "train", 8, copy=True)
    _corrupt(train, corrupt)
    spec = make_spec(data__train=str(train), learners=2, group={"kind": "gossip"}, **BAD_INPUT)
    if corrupt == 2:
        summary = TrainingJob(spec, tmp_path / "run").run()
        assert summary["skipped_utterances"] == {"unreadable audio file": 2} and summary["samples"] == 6
        return
    with pytest.raises(ValueError) as err:  # Ray's RayTaskError(DataError), which `chorus train` unwraps
        TrainingJob(spec, tmp_path / "run").run()
    assert type(err.value.cause).__name__ == "DataError"
    assert re.fullmatch(r"none of the 4 utterances of this learner's shard of .* could be read on host \S+ "
                        r"\(4 skipped \(unreadable audio file: 4\)\)", str(err.value.cause))


@pytest.mark.unit
def test_a_learner_whose_node_sees_no_training_data_is_an_error(corpus, tmp_path):
    train = _subset(corpus, tmp_path, "train", 3, copy=True)
    workload = AsrWorkload(WorkloadConfig(data={"train": train}))
    for path in train.parent.glob("*.flac"):  # gone before this node indexed them
        path.unlink()
    with pytest.raises(ValueError, match=rf"^no usable training utterances in {re.escape(str(train))} on host \S+: "
                                         r"3 skipped \(missing audio file: 3\)$"):
        workload.batches(rank=0, world_size=1, epoch=0)


# -- strict JSON ---------------------------------------------------------------------------------
@pytest.mark.unit
def test_strict_json_writes_null_for_non_finite_numbers(tmp_path):
    from orchestrator.base.strict_json import dumps
    from orchestrator.driver.events import EventLog

    text = dumps({"loss": math.nan, "curve": [1.5, math.inf], "nested": {"x": -math.inf}, "pair": (2, math.nan)})
    assert json.loads(text) == {"loss": None, "curve": [1.5, None], "nested": {"x": None}, "pair": [2, None]}

    class Metrics:
        def event(self, kind):
            pass

    log = EventLog(tmp_path / "events.jsonl", Metrics(), started_at=0.0)
    log.emit("waiting", "waiting for capacity", free=math.inf)
    assert json.loads((tmp_path / "events.jsonl").read_text())["free"] is None


@pytest.mark.unit
def test_every_json_write_of_chorus_is_strict():
    """Every json.dump(s) in orchestrator/, search/ and jobs/ refuses NaN and Infinity (the strict
    helper maps them to null first); a new writer that does not fails here."""
    offenders = []
    for package in ("orchestrator", "search", "jobs"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("dump", "dumps") and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "json"
                        and not any(k.arg == "allow_nan" and getattr(k.value, "value", True) is False
                                    for k in node.keywords)):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"json.dump(s) without allow_nan=False (use orchestrator.base.strict_json): {offenders}"


# -- a token file that is missing or empty ---------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("content, what", [(None, "does not exist"), ("", "is empty"), (" \n", "is empty")])
@pytest.mark.parametrize("command", [["submit", str(TINY)], ["jobs", "list"]])
def test_a_missing_or_empty_token_file_is_one_line_before_connecting(tmp_path, content, what, command):
    from orchestrator.cli import main

    token = tmp_path / "auth_token"
    if content is not None:
        token.write_text(content)
    result = CliRunner().invoke(main, [*command, "--address", "http://127.0.0.1:9"],
                                env={"RAY_AUTH_TOKEN_PATH": str(token), "RAY_AUTH_TOKEN": None})
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"Error: RAY_AUTH_TOKEN_PATH names {token}, which {what}:")
    assert "ray get-auth-token" in lines[0]
