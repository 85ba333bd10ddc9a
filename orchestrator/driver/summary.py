"""The run's summary: what `summary.json` holds and the CLI prints last (strict JSON: null for a
loss that diverged)."""

from __future__ import annotations

from orchestrator.base import strict_json


def summarize(job, train_wall: float, wall: float, first_loss: float | None) -> dict:
    """The summary of a finished `TrainingJob`: final scores (scored now), the last evaluation,
    counts, timings, bytes its learners sent, events, recoveries, nodes and accelerators, skipped
    inputs, batches split or skipped for device memory, the checkpoint."""
    finals = job.snapshots.finals()
    last = job.evals[-1] if job.evals else {}
    samples = job.roster.samples()
    sent = {str(i): slot.stats.get("sent_bytes", 0) for i, slot in sorted(job.roster.live.items())}
    events: dict[str, int] = {}
    for event in job.events.recorded:
        events[event["kind"]] = events.get(event["kind"], 0) + 1
    return strict_json.finite({
        "name": job.spec.name,
        "job_id": job.job_id,
        **finals,
        "wer_dev": last.get("dev_wer"),
        "first_train_loss": round(first_loss, 4) if first_loss is not None else None,
        "final_train_loss": last.get("train_loss"),
        "steps": job.roster.max_step(default=last.get("step", 0)),
        "samples": samples,
        "epochs": last.get("epoch", 0),
        "wall_s": round(wall, 2),
        "startup_s": round(job.first_step_at - job.started_at, 3) if job.first_step_at else None,
        "train_wall_s": round(train_wall, 2),
        "samples_per_s": round(samples / max(train_wall, 1e-9), 2),
        "learners": len(job.roster),
        "group": job.group.name,
        "consensus_distance": last.get("consensus_distance"),
        "compression": job.spec.group.compression,
        "sent_bytes": sent,  # per live learner: what its group communication sent over the run
        "sent_bytes_per_s": round(sum(sent.values()) / max(train_wall, 1e-9)),
        "sent_bytes_per_sample": round(sum(sent.values()) / max(samples, 1), 1),
        # per live learner: what its group's kind counts in its process (`KindStates.counters`), by kind
        "group_counters": {str(i): slot.stats.get("group", {}) for i, slot in sorted(job.roster.live.items())},
        "events": events,
        "refused": dict(sorted(job.events.refused.items())),  # what learners refused of other processes, by reason
        "recoveries": job.recoveries,
        "nodes": nodes_used(job),
        "accelerators": job.group.by_accelerator(),
        "skipped_utterances": job.workload.skip_counts() if job.evals else {},
        # batches the live learners trained in parts, or skipped, short of device memory (memory_fit.py)
        "out_of_memory": {kind: sum(s.stats.get(f"oom_{kind}", 0) for s in job.roster.live.values())
                          for kind in ("splits", "skipped")},
        "checkpoint": job.checkpoint_location(),
    })


def nodes_used(job) -> list[dict]:
    """The inventory entries (`cluster.node_inventory`) of the nodes that hosted the job's learners,
    with those learners' ids and the share of a GPU each reserved (0: none); nodes that are gone
    by now keep only their id."""
    if not job.runtime.distributed:
        return []
    known = {n["node_id"]: n for n in job.runtime.node_inventory()}
    gpus = job.elastic.capacity.bundle.get("GPU", 0.0)
    return [{**known.get(node, {"node_id": node, "gone": True}), "learners": ids, "gpus_per_learner": gpus}
            for node, ids in job.roster.hosted.items()]
