"""What the group tests share: learner actors of the tiny linear workload on a real Ray instance."""

import time

import pytest

from orchestrator.testing.groups import FixedLearners
from tests.builders import linear_spec


@pytest.fixture
def learners(ray_session):
    """Learner actors of the tiny linear workload (these tests are about the groups), placed
    with one static shard plan and one secret; `make.meeting()` is a meeting for their process
    group (`orchestrator/testing/groups.py`)."""
    workload = linear_spec(data__compute_seconds=0.005).workload_config.model_dump(mode="json")
    made = []

    def make(n):
        made.append(FixedLearners(f"test-{len(made)}-{time.time_ns()}", n, 1.0, "linear", workload))
        return made[-1].actors

    make.meeting = lambda: made[-1].meeting()
    yield make
    for fixed in made:
        fixed.release()
