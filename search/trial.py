"""One sweep trial = one `TrainingJob` with its own learner group, run as a Ray Tune function
trainable.

Tune reserves the whole trial in one placement group (`trial_resources`): bundle 0 for the
trial's driver (this function: it runs the job loop; its job's service, which evaluates the
averaged model, runs beside it on the same node) and one bundle per learner, which the job
places its learner actors in (`capacity.BundlePool`). So
concurrent trials never hold more than the cluster has, and a trial never waits for learners
that another trial holds.

The job writes to a scratch folder (`trial_scratch`), one per start of the trial (so the
process of an earlier start that is still dying, e.g. after its sweep's driver was killed,
never touches the files of the new one), removed when the trial finishes (and by the sweep, on
its own node, for trials that Hyperband stopped). Each evaluation (one per epoch)
is reported to Tune with that folder as the checkpoint (`checkpoint.pt` with every learner's
state, the curve, `trial.json`; its `curves.png` and `tensorboard/` go to the trial's folder of
the sweep's output instead, beside Tune's own event file); a paused trial resumes from it with
`TrainingJob(resume=True)`,
with as many learners as its placement group now has (rung-aware scaling). The last epoch is
reported after the job's `summary.json` (test WER included) is written, so it is part of the
last checkpoint: Tune stops a trial at its last report.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from pathlib import Path


def trial_resources(sweep, learners: int, use_gpus: bool):
    """The PlacementGroupFactory of a trial with `learners` learners."""
    from ray.tune import PlacementGroupFactory

    from orchestrator.cluster.capacity import learner_bundle

    gpus = (sweep.job.get("gpus_per_learner") or 1.0) if use_gpus else 0.0
    learner = learner_bundle(sweep.learner_cpus, gpus, sweep.job.get("learner_resources") or {})
    return PlacementGroupFactory([{"CPU": sweep.driver_cpus}] + [learner] * learners, strategy="PACK")


def trial_scratch(trial_name: str) -> Path:
    """The folder of a trial's job folders (one per start), on the node it runs on. Not in
    Tune's trial folder: Tune copies that folder to the sweep's storage, and what matters of the
    job is in its checkpoints already."""
    return Path(tempfile.gettempdir()) / "chorus-trials" / trial_name


def _new_start_folder(trial_name: str) -> Path:
    """A fresh job folder for this start; earlier starts' folders go (what matters of them is
    in the checkpoint this start resumes from)."""
    trial = trial_scratch(trial_name)
    for earlier in trial.glob("start-*"):
        shutil.rmtree(earlier, ignore_errors=True)
    out = trial / f"start-{uuid.uuid4().hex[:12]}"
    out.mkdir(parents=True)
    return out


def _trial_state(path: Path, resumed: bool) -> dict:
    """The trial's own counters across its starts (kept beside its job's checkpoint)."""
    state = json.loads(path.read_text()) if path.is_file() else {
        "starts": 0, "learner_seconds": 0.0, "wall_s": 0.0, "resumed_at_epochs": []}
    if resumed:
        state["resumed_at_epochs"].append(state.get("epochs", 0))
    state["starts"] += 1
    return state


def run_trial(config: dict, sweep_raw: dict) -> None:
    """The trainable: train the trial's job, reporting every epoch with a checkpoint."""
    from ray import tune

    from orchestrator.base import strict_json
    from orchestrator.cluster.capacity import BundlePool
    from orchestrator.cluster.runtime import RayRuntime
    from orchestrator.driver.job import TrainingJob
    from search.spec import SweepSpec

    sweep = SweepSpec.model_validate(sweep_raw)
    context = tune.get_context()
    pool = BundlePool.of_current_trial()
    learners = len(pool.indices)
    trial_name = Path(context.get_trial_dir()).name
    out = _new_start_folder(trial_name)
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        checkpoint.to_directory(str(out))
    state_path = out / "trial.json"
    state = _trial_state(state_path, resumed=checkpoint is not None)
    spec = sweep.trial_spec(config, learners, f"{sweep.name}-{context.get_trial_id()}")
    held: dict | None = None

    def report(record: dict) -> None:
        nonlocal held
        state["learner_seconds"] += max(0.0, record["wall_s"] - state["wall_s"]) * learners
        state["wall_s"], state["epochs"] = record["wall_s"], record["epoch"]
        state_path.write_text(strict_json.dumps(state))
        metrics = {**record, "learners": learners, "learner_seconds": round(state["learner_seconds"], 2),
                   "starts": state["starts"]}
        if record["epoch"] >= sweep.budget.max - 1e-9:
            held = metrics  # the last epoch: reported with the summary, below
            return
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(str(out)))

    # one checkpoint file: Tune persists the folder at every report (and copies hard links as files)
    job = TrainingJob(spec, out, report=report, resume=checkpoint is not None, runtime=RayRuntime(), pool=pool,
                      keep_checkpoints=1, pictures_dir=Path(context.get_trial_dir()))  # beside Tune's own files
    summary = job.run()
    final = held or {**(job.evals[-1] if job.evals else {}), "learners": learners,
                     "learner_seconds": round(state["learner_seconds"], 2), "starts": state["starts"]}
    final.update({f"wer_{split}": summary.get(f"wer_{split}") for split in spec.workload_config.final_splits})
    final["finished"] = True
    tune.report(final, checkpoint=tune.Checkpoint.from_directory(str(out)))
    shutil.rmtree(out, ignore_errors=True)  # persisted as the checkpoint: the working copy can go
    try:
        out.parent.rmdir()  # only when empty: another start's folder is its own
    except OSError:
        pass
