"""Outputs that outlive the node: a run's `--out` at an S3 URI (`orchestrator.checkpoint.storage`, through
pyarrow.fs), against a real S3 API on loopback (moto's server). A job writes there, is stopped,
and resumes from the bucket alone with the same step count and curve. And URI runs lose nothing:
--overwrite deletes only the run's own files; one live run per URI (its lock, a lease a crashed
run's successor takes over); a failed last upload keeps the staging folder, and a resume from it
uploads it; no URI shown carries its credentials or query."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.checkpoint.rundir import RunDir
from orchestrator.checkpoint.storage import RunStorage
from orchestrator.checkpoint.uri_lock import LEASE_S, LOCK_OBJECT
from orchestrator.checkpoint.uris import StorageError, redact
from orchestrator.testing.s3 import KEYS, local_s3, uri
from tests.builders import linear_spec

ROOT = Path(__file__).resolve().parents[3]
TINY = {"data__samples": 64, "data__compute_seconds": 0.0}  # the linear workload's job, in a fraction of a second
pytestmark = pytest.mark.xdist_group("s3")  # one worker runs them all: they share the module's S3 server
SMALL_MODEL = {"subsample_channels": 8, "d_model": 32, "hidden": 32, "layers": 1}


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on a free loopback port with a bucket `chorus`: its endpoint
    ("127.0.0.1:PORT"); the AWS credentials it takes are set in this process's environment."""
    with local_s3() as endpoint:
        yield endpoint


def listed(endpoint: str, prefix: str) -> list[str]:
    import boto3

    reply = boto3.client("s3", endpoint_url=f"http://{endpoint}").list_objects_v2(Bucket="chorus", Prefix=prefix)
    # (pyarrow keeps an emptied folder as a `folder/` marker object: not a file)
    return sorted(o["Key"].removeprefix(prefix) for o in reply.get("Contents", []) if not o["Key"].endswith("/"))


def with_credentials(location: str) -> str:
    """`location` (an s3:// URI of the test's server) with the server's credentials in it."""
    return location.replace("s3://", f"s3://{KEYS['AWS_ACCESS_KEY_ID']}:{KEYS['AWS_SECRET_ACCESS_KEY']}@", 1)


def put(endpoint: str, *keys: str) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=f"http://{endpoint}")
    for key in keys:
        client.put_object(Bucket="chorus", Key=key, Body=key.encode())


@pytest.mark.unit
def test_a_run_folder_mirrored_to_s3_and_back(s3, tmp_path):
    storage = RunStorage(uri(s3, "unit/run"), staging=tmp_path / "a")
    storage.claim(resume=False, overwrite=False)
    storage.local.mkdir()
    (storage.local / "evals.jsonl").write_text('{"step": 1}\n')
    (storage.local / "checkpoint-1.pt").write_bytes(b"x" * 5_000_000)
    os.link(storage.local / "checkpoint-1.pt", storage.local / "checkpoint.pt")
    (storage.local / ".lock").write_text("pid 1")
    (storage.local / "tensorboard").mkdir()
    (storage.local / "tensorboard" / "events.out.tfevents.1").write_bytes(b"tb")
    storage.push()
    assert listed(s3, "unit/run/") == [LOCK_OBJECT, "checkpoint-1.pt", "evals.jsonl",  # its lock, no second copy
                                       "tensorboard/events.out.tfevents.1"]
    (storage.local / "checkpoint-2.pt").write_bytes(b"y" * 10)
    (storage.local / "checkpoint-1.pt").unlink()  # pruned: gone from the bucket too
    storage.push()
    storage.release()
    assert listed(s3, "unit/run/") == ["checkpoint-2.pt", "evals.jsonl", "tensorboard/events.out.tfevents.1"]

    with pytest.raises(StorageError, match=r"s3://chorus/unit/run already holds a run \(checkpoint-2.pt, "
                                           r"evals.jsonl, tensorboard/events.out.tfevents.1\): pass --resume to "
                                           r"continue it or --overwrite"):
        RunStorage(uri(s3, "unit/run"), staging=tmp_path / "b").claim(resume=False, overwrite=False)
    assert LOCK_OBJECT not in listed(s3, "unit/run/")  # the refused run's lock went with it
    put(s3, "unit/run/tensorboard/../../../escaped.txt", "unit/run/tensorboard/a/b")
    again = RunStorage(uri(s3, "unit/run"), staging=tmp_path / "c")  # elsewhere: nothing local reused
    again.claim(resume=True, overwrite=False)
    again.pull()
    again.release()
    assert sorted(p.name for p in again.local.iterdir()) == ["checkpoint-2.pt", "evals.jsonl", "tensorboard"]
    assert sorted(p.name for p in (again.local / "tensorboard").iterdir()) == ["events.out.tfevents.1"]  # not the
    # keys no run writes there (`put` below): a name leading out of the staging folder, a folder in a folder
    assert (again.local / "tensorboard" / "events.out.tfevents.1").read_bytes() == b"tb"
    assert (again.local / "checkpoint-2.pt").read_bytes() == b"y" * 10
    with pytest.raises(StorageError, match="s3://chorus/unit/none: no run there to resume"):
        RunStorage(uri(s3, "unit/none"), staging=tmp_path / "d").claim(resume=True, overwrite=False)


@pytest.mark.unit
def test_overwrite_at_a_uri_deletes_the_runs_own_files_and_nothing_else(s3, tmp_path):
    run_files = ["checkpoint-8.pt", "checkpoint-16.pt", "evals.jsonl", "evals.superseded.jsonl", "events.jsonl",
                 "summary.json", "state-16-0.pt", "state-16-1.pt", "model-16.pt", "state-start.pt", "curves.png",
                 "tensorboard/events.out.tfevents.1"]
    others = ["ow/run/notes.txt", "ow/run/data/keep.bin", "ow/run-2/checkpoint-1.pt", "ow/run-2/evals.jsonl",
              "ow/runs.txt"]
    put(s3, *[f"ow/run/{name}" for name in run_files], *others)
    with pytest.raises(StorageError, match=r"^s3://chorus/ow/run already holds a run \(checkpoint-16.pt, "):
        RunStorage(uri(s3, "ow/run"), staging=tmp_path / "a").claim(resume=False, overwrite=False)
    assert listed(s3, "ow/run/") == sorted(["data/keep.bin", "notes.txt", *run_files])  # refused: untouched

    storage = RunStorage(uri(s3, "ow/run"), staging=tmp_path / "b")
    storage.claim(resume=False, overwrite=True, job="new-1")
    assert listed(s3, "ow/") == sorted([f"run/{LOCK_OBJECT}", *(key.removeprefix("ow/") for key in others)])
    storage.release()
    assert listed(s3, "ow/") == sorted(key.removeprefix("ow/") for key in others)

    folder = tmp_path / "folder"  # the same files in a folder: the same ones go
    (folder / "data").mkdir(parents=True)
    for name in [*run_files, "notes.txt", "data/keep.bin"]:
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(name)
    run_dir = RunDir(folder)
    run_dir.claim(overwrite=True)
    run_dir.release()
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == [
        ".lock", "data/keep.bin", "notes.txt"]


CRASHING_RUN = """
import os, sys
from pathlib import Path
from orchestrator.checkpoint.storage import RunStorage
storage = RunStorage(sys.argv[1], staging=Path(sys.argv[2]))
storage.claim(resume=False, overwrite=False, job="crashed-1")
storage.local.mkdir()
(storage.local / "checkpoint-8.pt").write_bytes(b"8")
(storage.local / "evals.jsonl").write_text('{"step": 8}\\n')
storage.push()
print(os.getpid(), flush=True)
os._exit(0)  # a crash: no finally, nothing released
"""


@pytest.mark.unit
def test_a_second_run_on_a_uri_is_refused_and_a_crashed_runs_stale_lease_is_taken_over(s3, tmp_path, caplog):
    out = with_credentials(uri(s3, "lock/run"))
    crashed = subprocess.run([sys.executable, "-c", CRASHING_RUN, out, str(tmp_path / "a")], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert crashed.returncode == 0, crashed.stderr[-2000:]
    pid, host = int(crashed.stdout), socket.gethostname()
    assert listed(s3, "lock/run/") == [LOCK_OBJECT, "checkpoint-8.pt", "evals.jsonl"]  # its lock outlived it

    with pytest.raises(StorageError) as refused:  # its lease is live: a resume now is refused, in one line
        RunStorage(out, staging=tmp_path / "b").claim(resume=True, overwrite=False, job="early-2")
    line = str(refused.value)
    assert re.fullmatch(rf"s3://chorus/lock/run is in use by another run \(job crashed-1, pid {pid} on "
                        rf"{re.escape(host)} since [-\d]+ [:\d]+ UTC\): its lease expires at [-\d]+ [:\d]+ UTC "
                        r"\(in \d+ s\); wait for it to end or pick another --out", line), line

    # once the lease has run out (a clock LEASE_S on), the same user's resume takes the URI over, saying so
    later = RunStorage(out, staging=tmp_path / "c", clock=lambda: time.time() + LEASE_S + 1)
    with caplog.at_level(logging.WARNING, logger="chorus.checkpoint"):
        later.claim(resume=True, overwrite=False, job="resumed-3")
    [taken] = [r.getMessage() for r in caplog.records if r.name == "chorus.checkpoint"]
    assert re.fullmatch(rf"s3://chorus/lock/run: taking over the lock of job crashed-1, pid {pid} on "
                        rf"{re.escape(host)} since .+ UTC, whose lease expired at .+ UTC \(\d+ s ago\): "
                        "that run is gone", taken), taken
    later.pull()
    assert sorted(p.name for p in later.local.iterdir()) == ["checkpoint-8.pt", "evals.jsonl"]
    lock = json.loads(_read(s3, f"lock/run/{LOCK_OBJECT}"))
    assert (lock["job"], lock["pid"], lock["host"]) == ("resumed-3", os.getpid(), host)
    assert "testing" not in json.dumps(lock)  # no credentials in the lock either
    with pytest.raises(StorageError, match=r"^s3://chorus/lock/run is in use by another run \(job resumed-3, "):
        RunStorage(out, staging=tmp_path / "d").claim(resume=True, overwrite=False)
    later.release()
    assert LOCK_OBJECT not in listed(s3, "lock/run/")


@pytest.mark.unit
def test_a_run_whose_lease_was_taken_over_writes_nothing_more_there(s3, tmp_path):
    now = [time.time()]
    holder = RunStorage(uri(s3, "lost/run"), staging=tmp_path / "a", clock=lambda: now[0])
    holder.claim(resume=False, overwrite=False, job="stalled-1")
    expires = json.loads(_read(s3, f"lost/run/{LOCK_OBJECT}"))["expires"]
    now[0] += 100
    holder.lease.renew()  # (what its thread does every RENEW_S, and every push)
    assert json.loads(_read(s3, f"lost/run/{LOCK_OBJECT}"))["expires"] == pytest.approx(expires + 100)
    successor = RunStorage(uri(s3, "lost/run"), staging=tmp_path / "b", clock=lambda: now[0] + LEASE_S + 1)
    successor.claim(resume=False, overwrite=False, job="next-2")  # (the holder stalled past its lease)
    holder.local.mkdir()
    (holder.local / "evals.jsonl").write_text('{"step": 8}\n')
    with pytest.raises(StorageError, match=r"^s3://chorus/lost/run: this run lost its lock \(its lease ran out "
                                           r"unrenewed\) to job next-2, pid \d+ on .+; it writes nothing more there$"):
        holder.push()
    holder.release()  # leaves the successor's lock alone
    assert listed(s3, "lost/run/") == [LOCK_OBJECT]
    assert json.loads(_read(s3, f"lost/run/{LOCK_OBJECT}"))["job"] == "next-2"
    successor.release()
    assert listed(s3, "lost/run/") == []


class FailingUploads:
    """A run's filesystem whose uploads fail once the run has written its summary: the bucket gone
    at the very end of the run (a wrapper in the test, not a switch in Chorus)."""

    def __init__(self, fs, staging: Path):
        self._fs, self.staging = fs, staging

    def __getattr__(self, name):
        return getattr(self._fs, name)

    def open_output_stream(self, path: str, *args, **kwargs):
        if (self.staging / "summary.json").exists():
            raise OSError(f"When uploading part for key '{path}': connection refused")
        return self._fs.open_output_stream(path, *args, **kwargs)


@pytest.mark.unit
def test_a_failed_last_upload_keeps_the_staging_folder_and_a_resume_from_it_uploads_it(s3, tmp_path, monkeypatch):
    import tempfile

    from orchestrator.driver.job import TrainingJob

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the staging folder it keeps goes with the test
    out = uri(s3, "fail/run")
    job = TrainingJob(linear_spec(**TINY), out)
    staging = job.storage.local
    assert staging.parent == tmp_path and staging.name.startswith("chorus-staging-")
    job.storage.fs = FailingUploads(job.storage.fs, staging)
    with pytest.raises(StorageError) as failed:
        job.run()
    assert str(failed.value) == (
        f"s3://chorus/fail/run/curves.png: cannot write it (When uploading part for key 'chorus/fail/run/"
        f"curves.png': connection refused); the run's newest files are kept in {staging}: run the same command "
        f"with --resume --staging {staging} (not --overwrite) to upload them and go on to its budget")
    kept = sorted(p.name for p in staging.iterdir())
    step = json.loads((staging / "summary.json").read_text())["steps"]
    assert {f"checkpoint-{step}.pt", "evals.jsonl", "events.jsonl", "summary.json"} <= set(kept), kept
    at_uri = listed(s3, "fail/run/")
    assert "summary.json" not in at_uri and LOCK_OBJECT not in at_uri, at_uri  # not uploaded; the lock released

    resumed = TrainingJob(linear_spec(**TINY), out, resume=True, staging=staging).run()
    assert resumed["steps"] == step  # its budget was met: it uploads, and trains no further
    pictures = [name for name in listed(s3, "fail/run/") if name.startswith("tensorboard/events.out.tfevents.")]
    assert len(pictures) == 2  # the stopped run's event file and the resumed one's
    assert listed(s3, "fail/run/") == sorted([f"checkpoint-{step}.pt", "curves.png", "evals.jsonl", "events.jsonl",
                                              f"model-{step}.pt", f"state-{step}-0.pt", "state-start.pt",
                                              "summary.json", *pictures])
    assert _read(s3, "fail/run/evals.jsonl") == (staging / "evals.jsonl").read_text()
    assert json.loads(_read(s3, "fail/run/summary.json")) == resumed

    older = tmp_path / "older"  # a folder the URI has moved past is refused, not uploaded over it
    older.mkdir()
    (older / f"checkpoint-{step - 1}.pt").write_bytes(b"old")
    with pytest.raises(StorageError, match=rf"^{older} is older than s3://chorus/fail/run \(newest checkpoint: "
                                           rf"step {step - 1} against {step}\): resume from the URI alone"):
        TrainingJob(linear_spec(**TINY), out, resume=True, staging=older).run()
    assert "summary.json" in listed(s3, "fail/run/") and LOCK_OBJECT not in listed(s3, "fail/run/")


@pytest.mark.unit
def test_the_uri_lock_and_staging_folder_go_when_a_job_is_interrupted(s3):
    from orchestrator.driver.job import TrainingJob

    job = TrainingJob(linear_spec(**TINY), uri(s3, "interrupted/run"))
    job.interrupt()  # Ctrl-C: the loop raises KeyboardInterrupt at its first turn
    with pytest.raises(KeyboardInterrupt):
        job.run()
    assert LOCK_OBJECT not in listed(s3, "interrupted/run/") and not job.storage.local.exists()


@pytest.mark.unit
@pytest.mark.parametrize("shown, expected", [
    ("s3://key:secret@bucket/runs/x?endpoint_override=10.0.0.1:9000&scheme=http", "s3://bucket/runs/x"),
    ("s3://key:se/cret@bucket/x", "s3://bucket/x"),  # a secret with "/" in it, not URL-encoded
    ("Cannot parse URI: 's3://k:s@b/x?endpoint_override=h:1' at (3)", "Cannot parse URI: 's3://b/x' at (3)"),
    ("s3://bucket/x?access_key=a&secret_key=b: cannot open it", "s3://bucket/x: cannot open it"),
    ("gs://bucket/x#part, then", "gs://bucket/x, then"),
    ("http://user:pw@head:8265", "http://head:8265"),
    ("s3://bucket/runs/x", "s3://bucket/runs/x"),
    ("runs/a@b/x?y", "runs/a@b/x?y"),  # a folder: no URI in it
])
def test_redact_strips_a_uris_credentials_and_query_wherever_it_is_in_the_text(shown, expected):
    assert redact(shown) == expected


@pytest.mark.unit
def test_nothing_chorus_train_shows_or_writes_carries_the_uris_credentials_or_query(s3, tmp_path, caplog):
    from click.testing import CliRunner

    from orchestrator.cli import main

    spec = tmp_path / "job.yaml"
    spec.write_text(json.dumps(linear_spec(raw=True, **TINY)))
    out = with_credentials(uri(s3, "shown/run"))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}  # `train` sets its own
    try:
        with caplog.at_level(logging.INFO):
            ran = CliRunner().invoke(main, ["train", str(spec), "--out", out])
            again = CliRunner().invoke(main, ["train", str(spec), "--out", out])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert ran.exit_code == 0, ran.output
    summary = json.loads(ran.stdout.strip().splitlines()[-1])
    assert summary["checkpoint"] == f"s3://chorus/shown/run/checkpoint-{summary['steps']}.pt"
    assert "-> s3://chorus/shown/run\n" in ran.stdout  # the banner
    assert again.exit_code == 1 and again.stderr.startswith("Error: s3://chorus/shown/run already holds a run (")
    misplaced = CliRunner().invoke(main, ["train", str(spec), "--out", out, "--staging", str(tmp_path)])
    assert misplaced.exit_code == 1 and misplaced.stderr == (
        f"Error: --staging {tmp_path}: it continues a run at a URI from the folder a failed upload kept; pass it "
        "with --resume and that URI as --out\n")
    with pytest.raises(StorageError, match=r"^--out nosuch://bucket/x: cannot open it \(Unrecognized filesystem "
                                           r"type in URI: nosuch://bucket/x\)$"):
        RunStorage("nosuch://key:secret@bucket/x?token=abc")
    shown = [ran.output, again.output, misplaced.output, *(r.getMessage() for r in caplog.records),
             *(_read(s3, f"shown/run/{name}") for name in ("summary.json", "events.jsonl", "evals.jsonl"))]
    for text in shown:
        assert "testing@" not in text and "endpoint_override" not in text and "scheme=http" not in text, text


@pytest.mark.unit
def test_chorus_shards_writes_a_corpus_to_s3_and_it_streams_back_from_the_index(s3, corpus, tmp_path):
    from click.testing import CliRunner

    from jobs.data.audio_shards import AudioShards
    from jobs.data.manifests import DataError
    from jobs.sections import WorkloadConfig
    from jobs.workload import AsrWorkload
    from orchestrator.cli import main

    made = CliRunner().invoke(main, ["shards", str(corpus / "dev.jsonl"), "--out", uri(s3, "shards/dev"),
                                     "--shard-mb", "0.2"])
    assert made.exit_code == 0, made.output
    assert json.loads(made.output)["utterances"] == 20
    stored = listed(s3, "shards/dev/")
    assert {"shards.json", "texts.txt"} <= set(stored) and len(stored) == 2 + json.loads(made.output)["shards"] > 3
    shards = AudioShards(uri(s3, "shards/dev"))
    read = [u for name in shards.names for u in shards.read(name)]
    assert len(read) == 20 and all(u.waveform.numel() > 1000 and u.text for u in read)
    streamed = AsrWorkload(WorkloadConfig(data={"train": uri(s3, "shards/dev"), "max_batch_seconds": 10}))
    streamed.check_data()  # the index and a sample of the texts, from the bucket
    ids = [i for rank in range(2) for batch in streamed.batches(rank, 2, 0) for i in batch.ids]
    assert sorted(ids) == sorted(u.id for u in read)  # two learners streaming from S3: each utterance once
    with pytest.raises(DataError, match=r"^s3://chorus/shards/nothing: no shards.json there"):
        AsrWorkload(WorkloadConfig(data={"train": uri(s3, "shards/nothing")})).check_data()
    with_mel = CliRunner().invoke(main, ["shards", str(corpus / "dev.jsonl"), "--out", uri(s3, "shards/dev-mel"),
                                         "--features", "40"])
    assert with_mel.exit_code == 0 and json.loads(with_mel.output)["mel_bins"] == 40, with_mel.output
    mel = AudioShards(uri(s3, "shards/dev-mel"))
    assert all(u.log_mel.shape[1] == 40 for name in mel.names for u in mel.read(name))
    missing = CliRunner().invoke(main, ["shards", str(corpus / "dev.jsonl"), "--out", "nosuch://x/y"])
    assert missing.exit_code == 1 and missing.output.startswith("Error: nosuch://x/y: cannot open it")
    with pytest.raises(DataError, match="s3://chorus/shards/none: no shards.json there"):
        AudioShards(uri(s3, "shards/none"))


@pytest.mark.slow
def test_a_job_writes_to_s3_is_stopped_and_resumes_from_it_on_another_node(ray_cluster, s3, corpus, tmp_path):
    """The resumed run is started from the session cluster's worker node (by a Ray task placed
    there), in an empty staging folder: all it has is the bucket. It goes on from the
    checkpoint's step, and its curve is the stopped run's (less an evaluation whose checkpoint
    the stop cut short) followed by its own."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    spec = tmp_path / "job.yaml"
    spec.write_text(json.dumps({
        "name": "s3job", "seed": 0, "learners": 1, "cpus_per_learner": 1,
        "data": {"train": str(corpus / "train.jsonl"), "dev": str(corpus / "dev.jsonl"), "max_batch_seconds": 10},
        "model": SMALL_MODEL, "optim": {"lr": 0.003, "warmup_steps": 5, "schedule": "constant"},
        "budget": {"epochs": 1000, "wall_seconds": 300, "eval_every_seconds": 3}}))
    out = uri(s3, "runs/s3job")
    env = {**os.environ, **KEYS}

    def train(*extra: str, tmpdir: Path) -> subprocess.Popen:
        tmpdir.mkdir(exist_ok=True)
        return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "train", str(spec), "--out", out, *extra],
                                cwd=ROOT, env={**env, "TMPDIR": str(tmpdir)}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    first = train(tmpdir=tmp_path / "node-a")
    deadline = time.monotonic() + 180
    while sum(1 for line in listed(s3, "runs/s3job/") if line.startswith("checkpoint-")) < 2:
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-3000:]
        time.sleep(0.5)
    first.send_signal(signal.SIGINT)
    _, stderr = first.communicate(timeout=60)
    assert first.returncode == 130, stderr[-3000:]
    assert "the last checkpoint is s3://chorus/runs/s3job/checkpoint-" in stderr, stderr[-2000:]
    files = listed(s3, "runs/s3job/")
    assert {"evals.jsonl", "events.jsonl"} <= set(files) and "checkpoint.pt" not in files, files
    kept = _jsonl(s3, "runs/s3job/evals.jsonl")

    @ray.remote(num_cpus=0)
    def resume_here(command: list[str], environment: dict) -> tuple[str, int, str, str]:
        proc = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
        return ray.get_runtime_context().get_node_id(), proc.returncode, proc.stdout, proc.stderr

    worker = ray_cluster.session_worker.node_id
    (tmp_path / "node-b").mkdir()
    command = [sys.executable, "-m", "orchestrator.cli", "train", str(spec), "--out", out, "--resume",
               "--set", f"budget.epochs={int(kept[-1]['epoch']) + 2}"]
    node, code, stdout, stderr = ray.get(resume_here.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(worker, soft=False)).remote(
        command, {**env, "TMPDIR": str(tmp_path / "node-b")}), timeout=360)
    assert node == worker and node != ray.get_runtime_context().get_node_id()
    assert code == 0, stderr[-3000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["checkpoint"].startswith("s3://chorus/runs/s3job/checkpoint-"), summary["checkpoint"]
    curve = _jsonl(s3, "runs/s3job/evals.jsonl")
    names = listed(s3, "runs/s3job/")
    past = _jsonl(s3, "runs/s3job/evals.superseded.jsonl") if "evals.superseded.jsonl" in names else []
    kept = [e for e in kept if e not in past]
    assert curve[:len(kept)] == kept, (kept, curve)
    assert curve[-1]["step"] > kept[-1]["step"] and summary["steps"] == curve[-1]["step"], (curve, summary)
    assert "summary.json" in names and json.loads(_read(s3, "runs/s3job/summary.json")) == summary
    for node in ("node-a", "node-b"):  # the staging folders went with their runs
        assert not list((tmp_path / node).glob("chorus-staging-*")), node


def _read(endpoint: str, key: str) -> str:
    import boto3

    client = boto3.client("s3", endpoint_url=f"http://{endpoint}")
    return client.get_object(Bucket="chorus", Key=key)["Body"].read().decode()


def _jsonl(endpoint: str, key: str) -> list[dict]:
    return [json.loads(line) for line in _read(endpoint, key).splitlines() if line.strip()]
