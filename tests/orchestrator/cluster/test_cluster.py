"""Chorus against a real Ray head node (`orchestrator/cluster/local_head.py`: `ray start --head` on loopback with
token authentication): `chorus submit` of a job and of a sweep through Ray Jobs, `chorus jobs`,
the errors a user meets (no token, a wrong token, an unknown job, an invalid spec), and the
Grafana dashboard's every panel query answered by Debian's Prometheus scraping that cluster."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from orchestrator.cli.dashboards import DASHBOARD, panel_queries
from orchestrator.cluster.local_head import BIN, HeadNode, free_port
from tests.builders import linear_spec, run_cli

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.xdist_group("ray-head")  # one worker runs them all: they share the module's head
SMALL_MODEL = ["model.subsample_channels=8", "model.d_model=32", "model.hidden=32", "model.layers=1"]


def _data(corpus) -> list[str]:
    from jobs.synth.corpus import data_overrides

    return data_overrides(corpus)


def _sets(pairs: list[str]) -> list[str]:
    return [arg for pair in pairs for arg in ("--set", pair)]


def chorus(*args, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """The installed `chorus` script, run in the project folder."""
    return run_cli(*args, entry_point=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.fixture(scope="module")
def head():
    node = HeadNode(cpus=4, token=True)
    yield node
    node.stop()
    assert node.pids() == [], "the head node's processes outlived it"


@pytest.fixture(scope="module")
def prometheus(head, tmp_path_factory):
    """Debian's Prometheus on Ray's generated scrape config of the head's session, or None when
    the `prometheus` binary is missing (the project's test setup installs it)."""
    binary = shutil.which("prometheus")
    if binary is None:
        yield None
        return
    config = head.session_dir / "metrics" / "prometheus" / "prometheus.yml"
    deadline = time.monotonic() + 60
    while not config.is_file() and time.monotonic() < deadline:  # Ray's dashboard writes it once it is up
        time.sleep(0.5)
    port = free_port()
    store = tmp_path_factory.mktemp("prometheus")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={store}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                            stderr=open(store / "prometheus.log", "w"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/-/ready", timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    yield {"url": url, "config": config, "started": time.time()}
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def submitted(head, prometheus, corpus, tmp_path_factory):
    """A 2-learner gossip job of tiny.yaml and a 2-trial sweep of the linear workload, each
    submitted with `chorus submit --follow` (with the head's token), one after the other: {"job":
    ..., "sweep": ...} CompletedProcesses. Both specs are in folders outside the project (the
    job's a copy of tiny.yaml): they travel on their own."""
    env = {**head.env, "RAY_AUTH_MODE": "disabled"}  # the client finds the token whatever the mode says
    out = tmp_path_factory.mktemp("submitted")  # "shared storage": the cluster's working dir is temporary
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "my.yaml"
    shutil.copy(ROOT / "jobs" / "configs" / "tiny.yaml", elsewhere)
    job = chorus("submit", str(elsewhere), "--address", head.address, "--follow", "--out", str(out / "job"),
                 *_sets(_data(corpus) + SMALL_MODEL + ["learners=2", "group.kind=gossip", "budget.epochs=2",
                                                       "data.max_batch_seconds=20", "optim.warmup_steps=5"]), env=env)
    sweep_spec = tmp_path_factory.mktemp("elsewhere") / "linear_sweep.yaml"
    sweep_spec.write_text(json.dumps({
        "name": "linear_sweep", "job": {k: v for k, v in linear_spec(raw=True).items() if k != "budget"},
        "method": "random", "trials": 2, "budget": {"max": 1, "min": 1}, "learners": 1, "driver_cpus": 0.5,
        "cpus_per_learner": 0.5, "space": {"optim.lr": {"type": "float", "low": 0.05, "high": 0.5, "log": True}}}))
    sweep = chorus("submit", str(sweep_spec), "--address", head.address, "--follow", "--out", str(out / "sweep"),
                   env=env)
    return {"job": job, "sweep": sweep, "env": env, "out": out, "spec": elsewhere}


def _summary(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, f"no summary JSON in the job's logs:\n{stdout[-3000:]}"
    return json.loads(lines[-1])


@pytest.mark.slow
def test_submit_a_job_follow_it_to_success_and_find_its_summary_in_its_logs(head, submitted, corpus):
    job = submitted["job"]
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    job_id = job.stdout.splitlines()[0]
    assert job_id.startswith("chorus-job-tiny-")
    assert f"{job_id} SUCCEEDED" in job.stderr
    summary = _summary(job.stdout)
    assert summary["learners"] == 2 and summary["group"] == "gossip" and summary["epochs"] > 0
    assert json.loads((submitted["out"] / "job" / "summary.json").read_text()) == summary
    # the test WER is the final averaged model's on the test split: `chorus eval` of the run's
    # checkpoint, here, recomputes it from its own decoding (the summary rounds to 2 decimals)
    evaluated = chorus("eval", str(submitted["out"] / "job" / "checkpoint.pt"), str(corpus / "test.jsonl"))
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    result = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert result["utterances"] == summary["utterances_test"] == 20
    assert result["wer"] == pytest.approx(summary["wer_test"], abs=0.005), (result, summary["wer_test"])

    # the same through `chorus jobs`: logs, status (with the job's metadata), list
    logs = chorus("jobs", "logs", job_id, "--address", head.address, env=submitted["env"])
    assert logs.returncode == 0 and _summary(logs.stdout) == summary
    status = chorus("jobs", "status", job_id, "--address", head.address, env=submitted["env"])
    info = json.loads(status.stdout.splitlines()[-1])
    assert info["status"] == "SUCCEEDED"
    assert info["metadata"] == {"job_name": "tiny (job)", "chorus_kind": "job", "chorus_spec": "tiny",
                                "chorus_spec_file": str(submitted["spec"])}
    listed = chorus("jobs", "list", "--address", head.address, env=submitted["env"])
    row = next(line for line in listed.stdout.splitlines() if line.startswith(job_id))
    assert row.split()[1:4] == ["SUCCEEDED", "job", "tiny"]

    # the project went up as the working dir, without what .gitignore excludes
    packages = [p for p in (head.session_dir / "runtime_resources" / "working_dir_files").iterdir() if p.is_dir()]
    assert any((p / "orchestrator" / "cli" / "app.py").is_file() for p in packages), \
        [list(p.iterdir()) for p in packages]
    uploaded = {q.relative_to(p).parts[0] for p in packages for q in p.iterdir()}
    assert not uploaded & {".venv", "data", "runs", ".git", "chorus.egg-info"}, uploaded


@pytest.mark.slow
def test_submit_a_sweep(submitted):
    sweep = submitted["sweep"]
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    assert sweep.stdout.splitlines()[0].startswith("chorus-sweep-linear_sweep-")
    summary = _summary(sweep.stdout)
    assert summary["trials"] == 2 and summary["best_metric"] is not None
    assert (submitted["out"] / "sweep" / "sweep_summary.json").is_file()


@pytest.mark.slow
def test_errors_are_one_clear_line(head, tmp_path, corpus):
    home = tmp_path / "home"
    home.mkdir()
    bare = {k: v for k, v in head.env.items() if not k.startswith("RAY_AUTH_TOKEN")} | {"HOME": str(home)}
    spec_args = ["jobs/configs/tiny.yaml", "--address", head.address, *_sets(_data(corpus))]

    no_token = chorus("submit", *spec_args, env=bare)
    assert no_token.returncode == 1 and "Traceback" not in no_token.stderr
    assert f"the cluster at {head.address} requires a token" in no_token.stderr
    assert "ray get-auth-token" in no_token.stderr and "RAY_AUTH_TOKEN" in no_token.stderr
    assert chorus("jobs", "list", "--address", head.address, env=bare).stderr == no_token.stderr

    wrong = chorus("submit", *spec_args, env=bare | {"RAY_AUTH_TOKEN": "0" * 32})
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    assert "refused the token from RAY_AUTH_TOKEN" in wrong.stderr

    with_token = bare | {"RAY_AUTH_TOKEN_PATH": str(head.token_file)}
    unknown = chorus("jobs", "status", "chorus-job-nope", "--address", head.address, env=with_token)
    assert unknown.returncode == 1 and unknown.stderr.strip() == (
        f"Error: no job chorus-job-nope on the cluster at {head.address} (`chorus jobs list` shows its jobs)")

    unreachable = chorus("jobs", "list", "--address", f"http://127.0.0.1:{free_port()}", env=with_token)
    assert unreachable.returncode == 1 and unreachable.stderr.startswith("Error: cannot reach Ray's dashboard")
    assert len(unreachable.stderr.strip().splitlines()) == 1

    # an invalid spec is rejected before any connection: even an unreachable cluster is not tried
    invalid = chorus("submit", "jobs/configs/tiny.yaml", "--address", f"http://127.0.0.1:{free_port()}",
                     "--set", "model.hiden=3", env=with_token)
    assert invalid.returncode == 1 and invalid.stderr.strip() == (
        "Error: invalid spec: jobs/configs/tiny.yaml: model.hiden (from --set): unknown key")


@pytest.mark.unit
def test_submit_checks_the_spec_here_but_not_the_clusters_data_paths():
    from orchestrator.cli.submit import validate
    from orchestrator.driver.config import SpecError

    elsewhere = [f"data.{s}=/cluster/shared/{s}.jsonl" for s in ("train", "dev", "test", "test_unseen")]
    assert validate(ROOT / "jobs/configs/tiny.yaml", elsewhere) == ("job", "tiny")
    assert validate(ROOT / "search/configs/bohb_tiny.yaml", [f"job.{s}" for s in elsewhere]) == ("sweep", "bohb_tiny")
    with pytest.raises(SpecError, match="method: unknown method 'bohbb'"):
        validate(ROOT / "search/configs/bohb_tiny.yaml", [f"job.{s}" for s in elsewhere] + ["method=bohbb"])


def _query_range(url: str, expr: str, start: float, end: float) -> list:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 5})
    reply = json.loads(urllib.request.urlopen(f"{url}/api/v1/query_range?{params}", timeout=30).read())
    assert reply["status"] == "success", reply
    return reply["data"]["result"]


def _as_grafana_would(expr: str) -> str:
    """The expression with the dashboard's variables at their defaults (All, a 1m window)."""
    return (expr.replace("$SessionName", ".*").replace("$ChorusJob", ".*").replace("$Sweep", ".*")
            .replace("$window", "1m"))


@pytest.mark.slow
def test_every_dashboard_panel_query_returns_data_from_prometheus(head, prometheus, submitted, tmp_path):
    if prometheus is None:
        pytest.skip("Debian's `prometheus` is not installed (make test installs it with apt-get; it could not here)")
    assert submitted["job"].returncode == 0 and submitted["sweep"].returncode == 0
    queries = panel_queries()
    assert len(queries) >= 12
    # over the runs' time, as Grafana asks; Prometheus scrapes every 10 s (Ray's config), so the
    # last values of the sweep may need one more scrape
    deadline, missing = time.monotonic() + 40, queries
    while missing and time.monotonic() < deadline:
        missing = [(title, expr) for title, expr in missing
                   if not _query_range(prometheus["url"], _as_grafana_would(expr), prometheus["started"], time.time())]
        if missing:
            time.sleep(2)
    assert not missing, f"panels without data: {missing}"

    # `chorus dashboards install` puts it where the session's Grafana provisioning loads dashboards
    installed = chorus("dashboards", "install", "--session-dir", str(head.session_dir))
    assert installed.returncode == 0, installed.stderr
    copy = head.session_dir / "metrics" / "grafana" / "dashboards" / "chorus_grafana_dashboard.json"
    assert f"as {copy}" in installed.stdout and "RAY_GRAFANA_HOST" in installed.stdout
    assert json.loads(copy.read_text()) == json.loads(DASHBOARD.read_text())


def _alive_on_head(head, what: str) -> list[dict]:
    """Ray's state API on the head's dashboard: its actors or placement groups still alive/created."""
    token = head.token_file.read_text().strip()
    state = {"actors": "ALIVE", "placement_groups": "CREATED"}[what]
    query = urllib.parse.urlencode({"limit": 1000, "filter_keys": "state", "filter_predicates": "=",
                                    "filter_values": state})
    request = urllib.request.Request(f"{head.address}/api/v0/{what}?{query}",
                                     headers={"Authorization": f"Bearer {token}"})
    reply = json.loads(urllib.request.urlopen(request, timeout=30).read())
    return reply["data"]["result"]["result"]


@pytest.mark.slow
@pytest.mark.parametrize("stopper", ["chorus jobs stop", "ray job stop"])
def test_a_submitted_job_stopped_by_chorus_or_ray_leaves_nothing_on_the_cluster(head, tmp_path, stopper):
    """A 2-learner gossip job of the tiny linear workload (this test is about the job's exit, not
    its speech), stopped once it has evaluated; `ray job stop` then `--resume` continues it."""
    env = {**head.env, "RAY_AUTH_MODE": "disabled"}
    spec = tmp_path / "stopped.yaml"
    spec.write_text(json.dumps(linear_spec(raw=True, name="stopped", learners=2, group={"kind": "gossip"})))
    submitted = chorus("submit", str(spec), "--address", head.address, "--out", str(tmp_path / "job"),
                       *_sets(["budget.epochs=10000", "budget.wall_seconds=300"]), env=env)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.splitlines()[0]
    deadline = time.monotonic() + 120
    # evaluated and checkpointed, as the job's --out shows (read here: no CLI process per poll)
    curve, checkpoint = tmp_path / "job" / "evals.jsonl", tmp_path / "job" / "checkpoint.pt"
    while not (curve.is_file() and curve.read_text().strip() and checkpoint.is_file()):
        assert time.monotonic() < deadline, "the job never evaluated"
        time.sleep(0.5)
    assert [a for a in _alive_on_head(head, "actors") if a["name"].startswith("stopped-")]
    if stopper == "ray job stop":
        stop = subprocess.run([str(BIN / "ray"), "job", "stop", "--address", head.address, job_id], env=head.env,
                              capture_output=True, text=True, timeout=60)
    else:
        stop = chorus("jobs", "stop", job_id, "--address", head.address, env=env)
    assert stop.returncode == 0, stop.stderr
    deadline = time.monotonic() + 10  # the job's learners and placement groups go within 10 s
    while time.monotonic() < deadline:
        left = {what: [item.get("name") for item in _alive_on_head(head, what) if (item.get("name") or "")
                       .startswith("stopped-")] for what in ("actors", "placement_groups")}
        if not any(left.values()):
            break
        time.sleep(1)
    assert not any(left.values()), left
    logs = chorus("jobs", "logs", job_id, "--address", head.address, env=env).stdout
    assert "Traceback" not in logs, logs[-3000:]
    if stopper == "chorus jobs stop":
        return
    # the checkpoint was kept: the same submission with --resume continues from it, to the end of the
    # epoch after the one it stopped in (every learner has steps left: at a mid-epoch stop, one may
    # already be at its epoch's end)
    kept = [json.loads(line) for line in (tmp_path / "job" / "evals.jsonl").read_text().splitlines()]
    assert kept, "no evaluation was kept"
    resumed = chorus("submit", str(spec), "--address", head.address, "--out", str(tmp_path / "job"),
                     "--resume", "--follow", *_sets([f"budget.epochs={int(kept[-1]['epoch']) + 2}"]), env=env)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-2000:]
    curve = [json.loads(line) for line in (tmp_path / "job" / "evals.jsonl").read_text().splitlines()]
    superseded = tmp_path / "job" / "evals.superseded.jsonl"  # an evaluation whose checkpoint the stop cut short
    past = [json.loads(line) for line in superseded.read_text().splitlines()] if superseded.is_file() else []
    kept = [e for e in kept if e not in past]
    assert curve[:len(kept)] == kept and curve[-1]["step"] > kept[-1]["step"], (kept, curve)
