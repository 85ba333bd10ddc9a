"""Shared fixtures: one small synthetic corpus per session (real espeak-ng speech in a temp dir), the
session's two-node Ray cluster, a private cluster for tests that add and remove nodes, and the
check that every test leaves the cluster it used as it found it. Collection fails unless every test
is marked with exactly one tier: `unit`, `ray` or `slow`. The builders tests share are in
`tests/builders.py`; the fakes of the control plane's unit tests in `tests/doubles.py`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.builders import SPLIT_MANIFESTS, end_job_threads

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # explicit: the test clusters are local and token-less
# pytest-xdist's workers share this machine's cores: each worker, and every process it starts (CLI
# runs, own_process children, in-process learners), gets its share as torch threads. A thread pool
# the size of the machine in every worker oversubscribes the cores: a one-learner training test
# took 43 s with two threads and 23 s with one beside two busy processes (12.6 s alone). Only a
# worker sets it: the controlling process imports this file first, and a value it set would reach
# the workers as if the user had set it (it did: each worker ran 2 threads, and the unit tier took
# as long on two workers as on one)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS",
                          str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

# every node of a test cluster: metrics reach each node's exporter every second (default 10 s), and
# a lost node is declared dead within ~3 s (Ray's defaults take ~30 s)
SYSTEM_CONFIG = {"metrics_report_interval_ms": 1000, "health_check_period_ms": 1000,
                 "health_check_failure_threshold": 3, "enable_worker_prestart": False,
                 "prestart_worker_first_driver": False}
LEFTOVER_GRACE_S = 15.0  # actors of a driver that just exited take Ray a moment to mark dead


CHILD = "CHORUS_TEST_IN_OWN_PROCESS"  # set in the process that runs an `own_process` test
CORPUS = "CHORUS_TEST_CORPUS"  # ... with the parent's corpus, so it is synthesized once
FAILURE = "CHORUS_TEST_FAILURE"  # ... and the file it writes a failure into as it happens


def pytest_runtest_logreport(report):
    """In an `own_process` child: a failure is written out at once (a crash of Ray at the child's
    exit would lose pytest's summary)."""
    if os.environ.get(FAILURE) and report.failed:
        with open(os.environ[FAILURE], "a") as f:
            f.write(f"{report.when}: {report.longreprtext}\n")


def _session_corpus(config) -> Path:
    """A 160-utterance corpus (train) with 20 each in dev, test and test-unseen, made once per
    run: with pytest-xdist, the first worker to need it makes it (under a file lock) in the
    folder its workers share, and the others read it."""
    if os.environ.get(CORPUS):
        return Path(os.environ[CORPUS])
    if not hasattr(config, "_chorus_corpus"):
        from filelock import FileLock

        from jobs.synth.corpus import synthesize

        base = config._tmp_path_factory.getbasetemp()
        shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
        out = shared / "corpus"
        with FileLock(str(shared / "corpus.lock")):
            if not (out / "corpus.json").is_file():
                # espeak-ng alone, whatever is installed: the same corpus on every machine (Festival's
                # engine has tests of its own in tests/jobs/synth/test_corpus.py)
                synthesize(out, utterances=160, eval_utterances=20, seed=7, workers=2, progress=False,
                           engines="espeak")
        config._chorus_corpus = out
    return config._chorus_corpus


@pytest.fixture(scope="session")
def corpus(request):
    """A 160-utterance corpus (train) with 20 each in dev, test and test-unseen."""
    return _session_corpus(request.config)


def _start_cluster(worker_resources: dict):
    """A `ray.cluster_utils.Cluster`: a head (2 CPUs, no dashboard) and one worker (2 CPUs plus
    `worker_resources`), the driver connected to it."""
    import ray
    from ray.cluster_utils import Cluster

    from orchestrator.cluster.local_head import free_port

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "_system_config": SYSTEM_CONFIG,
        # Ray's default agent port (52365) is left to whatever else runs Ray on this machine
        "dashboard_agent_listen_port": free_port()})
    cluster.session_worker = cluster.add_node(num_cpus=2, resources=worker_resources)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


@pytest.fixture(scope="session")
def ray_cluster():
    """A two-node Ray cluster on this machine for the whole session, 2 CPUs per node; the driver is
    connected to it. The worker node (`cluster.session_worker`) also offers 2 `learner_slot`s, a
    custom resource that elastic tests ask learners to hold. Tests that add or remove nodes use
    `private_cluster` instead."""
    import ray

    cluster = _start_cluster({"learner_slot": 2})
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="session")
def ray_session(ray_cluster):
    import ray

    return ray


@pytest.fixture
def private_cluster():
    """A cluster of the test's own, shaped like the session's, for tests that kill or add nodes.
    Such tests are marked `own_process`: they run in a pytest process of their own, so neither
    the session's cluster nor Ray's state in the session's process (one driver connecting to a
    second cluster and back exports its metrics twice) is touched."""
    import ray

    assert os.environ.get(CHILD), "a test with a private cluster must be marked own_process"
    cluster = _start_cluster({"learner_slot": 2})
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Run a test marked `own_process` as `python -m pytest NODEID` in a child process (with this
    session's corpus) and report its outcome here."""
    if item.get_closest_marker("own_process") is None or os.environ.get(CHILD):
        return None
    from _pytest.reports import TestReport

    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    env = {**os.environ, CHILD: "1", CORPUS: str(_session_corpus(item.config))}
    started = time.time()
    basetemp = item.config._tmp_path_factory.mktemp("own-process")  # inside ours: pytest prunes old ones
    failure = basetemp / "failure.txt"  # written by the child the moment its test fails
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header",
                           f"--basetemp={basetemp / 'tmp'}", item.nodeid],
                          env={**env, FAILURE: str(failure)}, capture_output=True, text=True, cwd=item.config.rootpath)
    passed = proc.returncode == 0
    why = (f"in its own process (exit {proc.returncode}):\n"
           + (failure.read_text() if failure.is_file() else "") + f"\n-- stdout --\n{proc.stdout[-4000:]}"
           + f"\n-- stderr --\n{proc.stderr[-4000:]}")
    for when in ("setup", "call", "teardown"):
        report = TestReport(item.nodeid, item.location, {}, "passed" if passed or when != "call" else "failed",
                            None if passed or when != "call" else why,
                            when, duration=time.time() - started if when == "call" else 0.0)
        item.ihook.pytest_runtest_logreport(report=report)
    # what this process set up for earlier tests (module and session fixtures) and the next test
    # does not share is torn down here, as pytest's own protocol does after a test's teardown:
    # without it, an own_process test last in its module left that module's fixtures standing
    # ("previous item was not torn down properly" at the next module's first test)
    item.session._setupstate.teardown_exact(nextitem)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


@pytest.fixture(autouse=True)
def leaves_the_cluster_as_found(request):
    """For tests on the session's cluster: afterwards no actor, placement group or node that the
    test made may remain, nor a resource it held (`orchestrator/testing/cluster.py`: what the
    benchmarks check after each of their runs too). Leftovers are removed either way, so one failing
    test is one red test; a test that passed but left something behind fails here."""
    if "ray_cluster" not in request.fixturenames and "ray_session" not in request.fixturenames:
        yield
        return
    from orchestrator.testing.cluster import described, holdings, settled_since, take_away

    cluster = request.getfixturevalue("ray_cluster")
    before = holdings(nodes=True)
    yield
    report = getattr(request.node, "rep_call", None)
    passed = report is not None and report.passed
    running = end_job_threads()
    leftovers = settled_since(before, LEFTOVER_GRACE_S)
    if leftovers:
        what = described(leftovers)
        take_away(leftovers, cluster)
        still = settled_since(before, LEFTOVER_GRACE_S)  # the next test starts on the cluster this one found
        if still:
            pytest.fail(f"the test left on the cluster: {what}; still there after removing it: {still}")
        if passed:
            pytest.fail(f"the test left on the cluster: {what}")
    if running and passed:
        pytest.fail(f"the test ended with its job(s) still running: {running}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item (the cluster check reads whether the test passed)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


# -- the tiers ------------------------------------------------------------------------------------
TIERS = ("unit", "ray", "slow")  # pyproject.toml says what each means; `make test-fast` runs `unit`


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Every collected test is in exactly one tier (before `-m` deselects any): collection fails
    naming each test that has none or several."""
    wrong = []
    for item in items:
        tiers = sorted({mark.name for mark in item.iter_markers() if mark.name in TIERS})
        if len(tiers) != 1:
            wrong.append(f"{item.nodeid}: {', '.join(tiers) or 'no tier'}")
    if wrong:
        raise pytest.UsageError(f"every test needs exactly one of the markers {', '.join(TIERS)}; "
                                f"{len(wrong)} test(s) do not:\n  " + "\n  ".join(wrong))
    _heaviest_first(items)


def pytest_collection_finish(session):
    """Under `--dist loadgroup`, the tests of an `xdist_group` must reach one worker: pytest-xdist
    marks them by a suffix of their node ids, which some pytest releases drop (pytest-xdist#1386);
    their module's fixtures (a Ray head, an S3 server) would then be set up on every worker."""
    if session.config.getoption("dist", "no") != "loadgroup" or not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid.rpartition("]")[2]]
    if lost:
        raise pytest.UsageError(f"pytest-xdist did not group {lost[0]} (and {len(lost) - 1} more) for --dist "
                                "loadgroup: this pytest drops its group suffix (pytest-xdist#1386)")


TIER_WEIGHT = {"slow": 30.0, "ray": 5.0, "unit": 0.1}  # rough seconds per test of each tier
OWN_PROCESS_WEIGHT = 20.0  # ... plus a process and a private cluster of its own


def _heaviest_first(items) -> None:
    """The tests with the most expected time first (by tier), a group's tests together at their
    group's total: `make test` runs pytest-xdist with `--dist loadgroup`, which hands each worker
    one test at a time (or a whole `xdist_group`, for tests that share a module's fixtures), so
    the long ones start first and the short ones fill the gaps at the end."""
    def cost(item) -> float:
        tier = next(m.name for m in item.iter_markers() if m.name in TIERS)
        return TIER_WEIGHT[tier] + (OWN_PROCESS_WEIGHT if item.get_closest_marker("own_process") else 0.0)

    def group(item) -> str:
        mark = item.get_closest_marker("xdist_group")
        return f"group:{mark.args[0] if mark.args else mark.kwargs['name']}" if mark else item.nodeid

    weight: dict[str, float] = {}
    for item in items:
        weight[group(item)] = weight.get(group(item), 0.0) + cost(item)
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-weight[group(item)], group(item), order[id(item)]))


@pytest.fixture
def stub_corpus(tmp_path) -> Path:
    """A folder shaped like the corpus's top level (a one-line manifest per split, and the
    LibriSpeech-layout split folders) without audio: enough for a spec's path checks, for tests
    of configuration that train nothing."""
    root = tmp_path / "stub-corpus"
    for key, manifest in SPLIT_MANIFESTS.items():
        (root / key.replace("_", "-")).mkdir(parents=True)
        (root / manifest).write_text('{"audio_filepath": "none.flac", "duration": 1.0, "text": "go"}\n')
    return root
