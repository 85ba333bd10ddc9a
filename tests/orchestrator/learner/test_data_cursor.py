"""A learner's place in the data (orchestrator/learner/data_cursor.py) and the remainders the planner keeps
(orchestrator/service/shards.py): a learner that leaves mid-epoch hands over what it had not read, the
first learner done with its own part takes it over, and the epoch's data is trained exactly once
over the learners — for batches planned from a manifest and for shards streamed from a folder; a
resumed cursor reads the adopted part from where it was."""

import pytest

from jobs.data.audio_shards import write_audio_shards
from jobs.sections import WorkloadConfig
from jobs.workload import AsrWorkload
from orchestrator.learner.data_cursor import DataCursor
from orchestrator.service.shards import ShardPlanner

pytestmark = pytest.mark.unit


def _ids(cursor: DataCursor, steps: int | None = None) -> list[str]:
    """The utterances of the next `steps` batches (None: to the end of the epoch), each committed."""
    ids = []
    while steps is None or steps > 0:
        batch = cursor.next_batch()
        if batch is None:
            break
        cursor.commit()
        ids += batch.ids
        steps = None if steps is None else steps - 1
    return ids


@pytest.fixture(scope="module")
def sources(corpus, tmp_path_factory):
    shards = tmp_path_factory.mktemp("cursor") / "shards"
    write_audio_shards(corpus / "train.jsonl", shards, shard_mb=0.2)
    return {"manifest": corpus / "train.jsonl", "shards": shards}


@pytest.mark.parametrize("source", ["manifest", "shards"])
def test_a_leavers_remainder_is_taken_over_and_every_utterance_read_once(sources, source):
    workload = AsrWorkload(WorkloadConfig(data={"train": sources[source], "max_batch_seconds": 10,
                                                "prefetch_batches": 1}), seed=0)
    planner = ShardPlanner([0, 1, 2])
    cursors = [DataCursor(workload, planner, i) for i in range(3)]
    read = _ids(cursors[2], steps=2)  # learner 2 reads two batches and leaves
    assert cursors[2].left() > 0
    assert planner.hand_over(2, cursors[2].state())
    assert planner.remainders == [[0, 2, 3, None, cursors[2].position]]
    read += _ids(cursors[0]) + _ids(cursors[1])  # learner 0 takes the remainder over when done with its own
    assert sorted(read) == sorted(u.id for u in AsrWorkload(WorkloadConfig(
        data={"train": sources["manifest"]})).train.utterances)  # every utterance once
    assert cursors[0].part == [0, 2, 3, None] and cursors[1].part is None and planner.remainders == []
    assert cursors[0].left() == 0 and cursors[1].left() == 0


def test_a_resumed_cursor_reads_an_adopted_part_from_where_it_was(sources):
    config = WorkloadConfig(data={"train": sources["shards"], "max_batch_seconds": 10, "prefetch_batches": 0})
    workload = AsrWorkload(config, seed=0)
    planner = ShardPlanner([0, 1])
    leaver, taker = DataCursor(workload, planner, 1), DataCursor(workload, planner, 0)
    first = _ids(leaver, steps=1)
    planner.hand_over(1, leaver.state())
    taken = []
    while taker.part is None:  # its own part, then the first batch of the remainder
        batch = taker.next_batch()
        taker.commit()
    taken += batch.ids + _ids(taker, steps=1)
    resumed = DataCursor(AsrWorkload(config, seed=0), ShardPlanner([0, 1]), 0)  # a resumed job: a new process
    resumed.load(taker.state())
    assert resumed.part == [0, 1, 2, None] and resumed.position == taker.position > 0
    whole = _ids(DataCursor(workload, ShardPlanner([0, 1]), 1))  # learner 1's part, as it would have read it
    assert first + taken + _ids(resumed) == whole


def test_the_planners_remainders_survive_its_state_and_only_a_part_with_something_left_is_kept():
    planner = ShardPlanner([3, 5])
    assert planner.assignment(5, 0) == (1, 2, None)
    assert not planner.hand_over(5, {"epoch": 0, "position": 9, "part": None, "left": 0})  # nothing left
    assert not planner.hand_over(7, {"epoch": 0, "position": 0, "part": None, "left": None})  # no part of it
    assert planner.hand_over(5, {"epoch": 0, "position": 4, "part": None, "left": 6})
    again = ShardPlanner()
    again.load(planner.state())
    assert again.adopt(3, 1) == [0, 1, 2, None, 4] and again.adopt(3, 1) is None
    assert planner.adopt(3, -1) is None  # a remainder of a later epoch than the asker's waits
