"""The `diloco` kind: its options, its outer step (against torch's own SGD), its members on real
Ray learners, and jobs of it through the real driver."""


import pytest
import torch

from orchestrator.base import pieces
from orchestrator.cluster.runtime import fetch
from orchestrator.driver.config import SpecError, parse_spec
from orchestrator.driver.job import TrainingJob
from orchestrator.groups.diloco import DilocoOptions
from orchestrator.groups.diloco.member import DilocoMember, RoundClock
from orchestrator.groups.diloco.outer import OuterState, fragment_bounds
from orchestrator.groups.registry import call
from tests.builders import assert_nothing_left, linear_spec


@pytest.mark.unit
def test_options_default_to_the_papers_and_take_one_round_length():
    options = DilocoOptions()
    assert (options.inner_steps, options.round_seconds, options.outer_lr, options.momentum, options.nesterov,
            options.streaming.fragments) == (50, None, 0.7, 0.9, True, 1)
    assert DilocoOptions(round_seconds=20).inner_steps is None
    spec = parse_spec(linear_spec(raw=True, group={"kind": "diloco", "diloco": {"inner_steps": 8,
                                                                               "streaming": {"fragments": 4}}}))
    assert spec.group.options.inner_steps == 8 and spec.group.options.streaming.fragments == 4
    assert spec.model_dump()["group"]["diloco"]["streaming"] == {"fragments": 4}
    with pytest.raises(SpecError, match=r"group\.diloco.*not both"):
        parse_spec(linear_spec(raw=True, group={"kind": "diloco", "diloco": {"inner_steps": 8, "round_seconds": 5}}))
    with pytest.raises(SpecError, match=r"group\.diloco\.momentum"):
        parse_spec(linear_spec(raw=True, group={"kind": "diloco", "diloco": {"momentum": 1.0}}))


@pytest.mark.unit
def test_fragments_cover_the_weights_once():
    for n, f in ((10, 3), (7, 7), (1_000_003, 8)):
        bounds = fragment_bounds(n, f)
        assert bounds[0][0] == 0 and bounds[-1][1] == n and len(bounds) == f
        assert all(a < b and b == c for (a, b), (c, _) in zip(bounds, bounds[1:] + [(n, n)], strict=True))


def _chunks(clock: RoundClock, count: int) -> list[int]:
    """The inner steps of `count` chunks from step 0, as `DilocoMember.step` takes them (each sends its sync)."""
    steps, sizes = 0, []
    for _ in range(count):
        clock.begin(steps)
        taken = 0
        while not clock.over(taken):
            clock.took(0.001)
            taken += 1
        steps += taken
        sizes.append(taken)
        clock.restart()
    return sizes


@pytest.mark.unit
def test_a_warm_up_syncs_every_step_then_rounds_begin():
    """`warmup_steps` 3: the first three chunks are one inner step each (one sync a step), then
    rounds of `inner_steps` / F, or of `round_seconds` (one step ends such a warm-up chunk too)."""
    assert _chunks(RoundClock(DilocoOptions(inner_steps=4, warmup_steps=3), fragments=1), 5) == [1, 1, 1, 4, 4]
    assert _chunks(RoundClock(DilocoOptions(inner_steps=4, warmup_steps=2), fragments=2), 4) == [1, 1, 2, 2]
    assert _chunks(RoundClock(DilocoOptions(inner_steps=4), fragments=1), 2) == [4, 4]
    assert _chunks(RoundClock(DilocoOptions(round_seconds=3600, warmup_steps=2), fragments=1), 2) == [1, 1]
    spec = parse_spec(linear_spec(raw=True, group={"kind": "diloco", "diloco": {"warmup_steps": 200}}))
    assert spec.group.options.warmup_steps == 200 and DilocoOptions().warmup_steps == 0
    with pytest.raises(SpecError, match=r"group\.diloco\.warmup_steps"):
        parse_spec(linear_spec(raw=True, group={"kind": "diloco", "diloco": {"warmup_steps": -1}}))


class _Weights:
    """What `OuterState.begin` reads of a learner: its flat weights."""

    def __init__(self, flat):
        self.flat, self.numel = flat, flat.numel()

    def flat_weights(self):
        return self.flat.clone()


@pytest.mark.unit
@pytest.mark.parametrize("nesterov", [True, False])
def test_the_outer_step_is_torchs_sgd_on_the_pseudo_gradient(nesterov):
    """Fragment by fragment, the outer step is torch.optim.SGD(lr, momentum, nesterov) taking
    the mean pseudo-gradient as its gradient; a mean that is not finite is refused and changes nothing."""
    torch.manual_seed(0)
    start = torch.randn(10)
    outer = OuterState(None)
    outer.begin(_Weights(start), fragments=2)
    reference = torch.nn.Parameter(start.clone())
    sgd = torch.optim.SGD([reference], lr=0.7, momentum=0.9, nesterov=nesterov)
    options = DilocoOptions(nesterov=nesterov)
    for _ in range(4):
        mean = torch.randn(10)
        for a, b in fragment_bounds(10, 2):
            assert outer.outer_step(a, b, mean[a:b].clone(), options)
        reference.grad = mean.clone()
        sgd.step()
        assert torch.allclose(outer.global_weights, reference.detach(), atol=1e-6)
    before = (outer.global_weights.clone(), outer.momentum.clone())
    assert not outer.outer_step(0, 5, torch.tensor([1.0, float("nan"), 0.0, 0.0, 0.0]), options)
    assert torch.equal(outer.global_weights, before[0]) and torch.equal(outer.momentum, before[1])
    assert outer.counters()["refused"] == 1 and outer.syncs == 9
    saved = outer.state_dict()
    again = OuterState(None)
    again.begin(_Weights(torch.zeros(10)), fragments=2)
    again.load_state_dict(saved)
    assert torch.equal(again.global_weights, outer.global_weights) and torch.equal(again.momentum, outer.momentum)
    assert again.syncs == 9


@pytest.mark.ray
def test_members_sync_fragments_in_turn_and_end_on_the_same_global_weights(learners):
    """Two learners, rounds of 4 inner steps in 2 fragments: each chunk is half a round (2 inner
    steps) ending with one fragment's sync sent; after 6 chunks and `finish`, both hold the same
    weights, the global ones, moved from where they started, and each sent bytes."""
    actors = learners(2)
    meeting = learners.meeting()
    options = DilocoOptions(inner_steps=4, streaming={"fragments": 2})
    start = fetch(actors[0].weights.remote())
    fetch([a.join.remote(DilocoMember(i, 2, meeting, options)) for i, a in enumerate(actors)])
    for _ in range(6):
        stats = fetch([a.run.remote(100, None, None, 0.0) for a in actors])
        assert [len(s["step_seconds"]) for s in stats] == [2, 2]  # one chunk: half a round's inner steps
    fetch([call(a, "diloco", "finish") for a in actors])
    w0, w1 = fetch([a.weights.remote() for a in actors])
    assert torch.equal(w0, w1) and not torch.equal(w0, start)
    counters = fetch([a.counters.remote() for a in actors])
    # the 6th (fragment 1) landed at `finish`, which synced fragment 0's last 2 inner steps too
    assert [c["group"]["diloco"]["syncs"] for c in counters] == [7, 7]
    assert [c["group"]["diloco"]["rounds"] for c in counters] == [3, 3]
    assert all(c["sent_bytes"] > 0 for c in counters) and all(c["step"] == 12 for c in counters)
    fetch([a.close.remote() for a in actors])


@pytest.mark.ray
def test_a_learner_passes_an_epochs_end_alone_and_all_end_the_last_together(learners):
    """Rounds of 6 inner steps over parts of 16 batches, 2 epochs; learner 1 starts 12 batches
    into its part. Inside its first round it uses the part up and moves on to epoch 1 alone
    (learner 0 stays in epoch 0 and nobody waits); learner 0 does the same two rounds later. In
    the last epoch a learner whose part is used up takes no more steps; when neither has any
    left, both end it together. Every batch is trained once."""
    actors = learners(2)
    state = fetch(actors[1].state.remote())
    state["counters"]["position"] = 12
    fetch(actors[1].load_state.remote(pieces.put(state)))
    meeting = learners.meeting()
    options = DilocoOptions(inner_steps=6)
    fetch([a.join.remote(DilocoMember(i, 2, meeting, options, max_epochs=2)) for i, a in enumerate(actors)])
    chunks = [fetch([a.run.remote(100, None, 2, 0.0) for a in actors]) for _ in range(6)]
    assert [[len(s["step_seconds"]) for s in stats] for stats in chunks] == [
        [6, 6], [6, 6], [6, 6], [6, 2], [6, 0], [2, 0]]
    assert [[s["epoch"] for s in stats] for stats in chunks] == [[0, 1], [0, 1], [1, 1], [1, 1], [1, 1], [2, 2]]
    fetch([call(a, "diloco", "finish") for a in actors])
    counters = fetch([a.counters.remote() for a in actors])
    # five rounds' syncs, and `finish`'s for learner 0's last 2 steps (read after `finish`: a sync
    # lands asynchronously, and before it the fifth may still be in flight on either learner)
    assert [c["group"]["diloco"]["syncs"] for c in counters] == [6, 6]
    assert [c["step"] for c in counters] == [32, 20]
    w0, w1 = fetch([a.weights.remote() for a in actors])
    assert torch.equal(w0, w1)
    fetch([a.close.remote() for a in actors])


@pytest.mark.ray
def test_a_re_formed_group_sums_what_its_members_trained_and_starts_them_equal(learners):
    """A group re-formed mid-round (its members' syncs in flight land at the re-form; what they
    trained since is summed by the new group) starts every member on the same global weights,
    which took the outer step; an outer state's restore brings them and the momentum back."""
    actors = learners(2)
    options, meeting = DilocoOptions(inner_steps=3), learners.meeting()
    fetch([a.join.remote(DilocoMember(i, 2, meeting, options)) for i, a in enumerate(actors)])
    fetch([a.run.remote(100, None, None, 0.0) for a in actors])  # a round: its sync in flight
    odd = fetch(actors[1].state.remote())  # learner 1's outer state made different: it takes rank 0's
    odd["group"]["diloco"]["momentum"] = odd["group"]["diloco"]["momentum"] + 1.0
    fetch(actors[1].load_state.remote(pieces.put(odd)))
    meeting = learners.meeting()
    fetch([a.join.remote(DilocoMember(i, 2, meeting, options)) for i, a in enumerate(actors)])
    w0, w1 = fetch([a.weights.remote() for a in actors])
    assert torch.equal(w0, w1)
    states = fetch([a.state.remote() for a in actors])
    outer = [s["group"]["diloco"] for s in states]
    assert torch.equal(outer[0]["global"], w0) and torch.equal(outer[0]["momentum"], outer[1]["momentum"])
    assert float(outer[0]["momentum"].norm()) > 0 and outer[0]["syncs"] == 1
    assert float(outer[0]["momentum"].abs().max()) < 1.0  # rank 0's, not learner 1's changed one
    fetch([a.close.remote() for a in actors])


@pytest.mark.slow
def test_two_learner_diloco_job_trains_counts_its_rounds_and_leaves_nothing_behind(ray_session, tmp_path):
    spec = linear_spec(name="g-diloco", learners=2, budget__epochs=3, data__eval_splits=["dev"],
                       group={"kind": "diloco", "diloco": {"inner_steps": 4, "streaming": {"fragments": 2}}})
    records = []
    summary = TrainingJob(spec, tmp_path, report=records.append).run()
    assert [r["epoch"] for r in records] == [1, 2, 3]  # parts by speed: members pass epochs about together
    assert summary["learners"] == 2 and summary["samples"] == 3 * 512
    assert records[-1]["train_loss"] < records[0]["train_loss"]
    assert records[-1]["consensus_distance"] == 0.0  # the last evaluation's: every member on the global weights
    rounds = [c["diloco"]["rounds"] for c in summary["group_counters"].values()]
    assert rounds[0] == rounds[1] >= 2 * 3 * 16 // 4 // 2 - 2  # 16 batches a shard an epoch, 4 steps a round
    assert summary["sent_bytes_per_sample"] > 0
    assert_nothing_left(f"{summary['job_id']}/", placement_groups=2)


class _ResumedJob(TrainingJob):
    """The real job, which also keeps what its learners hold once its checkpoint is restored (before
    the group forms) beside what the checkpoint's files hold."""

    def _restore(self, checkpoint, slots):
        wall = super()._restore(checkpoint, slots)
        self.restored = {s.id: fetch(s.handle.state.remote())["group"]["diloco"] for s in slots}
        self.saved = {s.id: self.store.read(checkpoint.states[s.id]["file"])["group"]["diloco"] for s in slots}
        return wall


@pytest.mark.slow
def test_a_resumed_diloco_job_takes_its_checkpoints_outer_state_and_goes_on(ray_session, tmp_path):
    """A DiLoCo job stopped after 2 epochs, resumed for a third: its learners come back with the
    checkpoint's global weights, outer momentum and sync count, and the run goes on from there."""
    group = {"kind": "diloco", "diloco": {"inner_steps": 4, "streaming": {"fragments": 2}}}
    spec = {"name": "g-diloco-resume", "learners": 2, "data__eval_splits": ["dev"], "group": group}
    first = TrainingJob(linear_spec(budget__epochs=2, **spec), tmp_path).run()
    records = []
    resumed = _ResumedJob(linear_spec(budget__epochs=3, **spec), tmp_path, resume=True, report=records.append)
    summary = resumed.run()
    assert set(resumed.restored) == {0, 1}
    for learner_id, outer in resumed.restored.items():
        saved = resumed.saved[learner_id]
        assert float(saved["momentum"].norm()) > 0 and saved["syncs"] > 0
        assert torch.equal(outer["momentum"], saved["momentum"]) and torch.equal(outer["global"], saved["global"])
        assert outer["syncs"] == saved["syncs"]
    assert [r["epoch"] for r in records] == [3] and summary["samples"] == 3 * 512
    syncs_before = [c["diloco"]["syncs"] for c in first["group_counters"].values()]
    syncs_after = [c["diloco"]["syncs"] for c in summary["group_counters"].values()]
    assert all(a > b for a, b in zip(syncs_after, syncs_before, strict=True))  # counted on, not from 0
    assert_nothing_left(f"{summary['job_id']}/", placement_groups=2)
