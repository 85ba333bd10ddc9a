"""Shared fixtures: one small synthetic corpus per session (real espeak-ng speech in a temp dir)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # explicit, as DESIGN.md asks; no test starts Ray yet


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A 160-utterance corpus (train) with 20 each in dev, test and test-unseen."""
    from jobs.synth import synthesize

    out = tmp_path_factory.mktemp("corpus")
    synthesize(out, utterances=160, eval_utterances=20, seed=7, workers=2, progress=False)
    return out


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for the session (4 logical CPUs on this 2-core machine, so three
    one-CPU learners and the driver fit)."""
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
