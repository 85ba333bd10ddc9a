"""The fault matrix's rows of hostile outsiders and inputs (bench/faults.py runs them with the
others, on its cluster, every node a process on this machine):

- `stranger-flood`: after the first evaluation, a stranger holding no token and no secret
  (`orchestrator/testing/stranger.py`), on the learners' own host, probes every port the job's
  learners listen on: TCPStore's protocol, 256 MiB of garbage, 500 connections of a few bytes.
  The row says what the learners refused, what Chorus's listeners kept after SETTLE_S (nothing),
  what a library's listeners kept (gloo keeps a stranger on a member's host: docs/security.md)
  and how much the learners' memory grew; the job must train on.
- `nan-peer`: a gossip partner (hierarchical: a node's leader) starts sending NaN weights (a fault
  installed in its process from outside, `orchestrator/testing/faulty_peer.py`); its partner must
  refuse them (`refused` events) and the job train on without a rollback.
- `hostile-bucket-shard`: the job's training data streams from shards in a bucket (moto's S3 on
  loopback), one of which holds members whose JSON lacks its text, mistypes or lies about its
  duration, and an id with dots, beside an index entry naming `../`; the bad ones must be skipped
  and counted by reason, the rest trained on.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

from jobs.data.audio_shards import INDEX, MALFORMED_MEMBER, NOT_PLAIN, write_audio_shards
from orchestrator.testing import exposure
from orchestrator.testing.faulty_peer import send_nan_weights
from orchestrator.testing.s3 import local_s3

SETTLE_S = 10.0  # Chorus's listeners are back to the connections they had within this
ROOT = Path(__file__).resolve().parents[1]


def _learner_pids(job_id: str) -> dict[int, tuple[str, int]]:
    """Pid -> (node address, the port of Ray's own gRPC server in it) of the job's live learners."""
    import ray._private.state as state

    return {a["Pid"]: (a["Address"]["IPAddress"], a["Address"]["Port"]) for a in state.actors().values()
            if a["State"] == "ALIVE" and (a["Name"] or "").startswith(f"{job_id}/learner-")}


def stranger_flood(row) -> None:
    row.start_job()
    job = row.first_evaluation()
    pids = _learner_pids(job.job_id)
    listening = {pid: exposure.listeners(pid) for pid in pids}
    targets = sorted({f"{pids[pid][0]}:{lis.port}" if lis.wildcard else lis.target
                      for pid, found in listening.items() for lis in found})
    before = {pid: (exposure.rss_bytes(pid), {lis.port: len(exposure.connections(pid, lis.port))
                                              for lis in listening[pid]}) for pid in pids}
    row.fault()
    proc = subprocess.run([sys.executable, "-m", "orchestrator.testing.stranger", *targets], cwd=ROOT,
                          capture_output=True, text=True, timeout=min(180.0, row.left_s()))
    probes = json.loads(proc.stdout.strip().splitlines()[-1])["targets"]
    owned = (row.handle_call(learner.handle, exposure.own_link_ports) for learner in row.live().values())
    chorus = {pid: set(ports) for pid, ports in owned}  # what the owner knows and the stranger does not

    def held(pid: int, port: int) -> int:
        return len(exposure.connections(pid, port)) - before[pid][1][port]
    row.wait("Chorus's listeners back to their connections", lambda: all(
        held(pid, port) <= 0 for pid in pids for port in chorus.get(pid, ()) if port in before[pid][1]),
        timeout=SETTLE_S)
    kept = {port: held(pid, port) for pid in pids for port in before[pid][1]
            if port not in chorus.get(pid, set()) | {pids[pid][1]}}
    growth = max((exposure.rss_bytes(pid) - before[pid][0]) / 2**20 for pid in pids)
    keys = sum(v == "ok" for r in probes.values() for v in r["tcpstore"].values())
    row.more_steps()
    refused = sum(sum(e["counts"].values()) for e in row.events("refused"))
    row.end_job()
    kept_total, found = sum(v for v in kept.values() if v > 0), sum(map(len, chorus.values()))
    row.note(f"{len(targets)} ports probed ({found} Chorus's): {keys} keys read or written, {refused} refusals "
             f"counted, Chorus's listeners kept 0, other listeners kept {kept_total} (gloo's: a stranger on a "
             f"member's host), RSS +{growth:.0f} MB at most; trained on")
    if keys:
        row.problem(f"{keys} TCPStore operations of the stranger succeeded")
    if growth > 32:
        row.problem(f"a learner's memory grew by {growth:.0f} MB")


def nan_peer(row) -> None:
    row.start_job()
    job = row.first_evaluation()
    faulty = job.roster.order[1] if row.group == "gossip" else job.node_groups[0][0]  # on the ring
    row.fault()
    row.handle_call(row.live()[faulty].handle, send_nan_weights)
    row.wait("a refusal", lambda: row.events("refused"), timeout=60)
    row.more_steps()
    row.end_job()
    refused = {}
    for event in row.events("refused"):
        for what, count in event["counts"].items():
            refused[what] = refused.get(what, 0) + count
    rollbacks = len(row.events("rollback"))
    row.note(f"learner {faulty} sent NaN: {sum(refused.values())} refusals ({', '.join(refused)}), "
             f"{rollbacks} rollbacks, trained on")
    if rollbacks:
        row.problem("the NaN weights reached a model (a rollback)")


def hostile_bucket_shard(row) -> None:
    import pyarrow.fs

    with contextlib.ExitStack() as stack:
        endpoint = stack.enter_context(local_s3())
        host, port = endpoint.split(":")
        train = f"s3://testing:testing@chorus/shards?endpoint_override={endpoint}&scheme=http"
        folder = row.dir / "shards"
        write_audio_shards(row.bench.corpus / "train.jsonl", folder, shard_mb=1)
        _add_hostile_shard(folder, row.bench.corpus)
        fs = pyarrow.fs.S3FileSystem(access_key="testing", secret_key="testing", scheme="http",
                                     endpoint_override=f"{host}:{port}")
        pyarrow.fs.copy_files(str(folder), "chorus/shards", destination_filesystem=fs)
        row.start_job(data={"train": train})
        row.first_evaluation()
        row.fault()
        row.more_steps()
        summary = row.end_job()
    reasons = summary.get("skipped_utterances") or {}
    row.note(f"skipped and counted: {json.dumps(reasons)}; trained on")
    for wanted in (MALFORMED_MEMBER, NOT_PLAIN):
        if not any(wanted in reason for reason in reasons):
            row.problem(f"nothing skipped as '{wanted}'")


def _add_hostile_shard(folder, corpus) -> None:
    """A shard of bad members (and one good one with a dotted id) and an index entry naming `../`."""
    first = json.loads((corpus / "train.jsonl").read_text().splitlines()[0])
    audio = (corpus / first["audio_filepath"]).read_bytes()
    suffix = "." + first["audio_filepath"].rsplit(".", 1)[1]
    members = [("no-text", {"duration": first["duration"]}), ("typed", {"text": 7, "duration": "long"}),
               ("lying", {"text": first["text"], "duration": 0.2}),
               ("spk.1.utt.7", {"text": first["text"], "duration": first["duration"]})]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for utt_id, meta in members:
            for name, data in ((utt_id + suffix, audio), (utt_id + ".json", json.dumps(meta).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    (folder / "hostile.tar").write_bytes(out.getvalue())
    index = json.loads((folder / INDEX).read_text())
    index["shards"] += [{"name": "hostile.tar", "utterances": len(members)}, {"name": "../escape.tar", "utterances": 3}]
    index["utterances"] += len(members) + 3
    (folder / INDEX).write_text(json.dumps(index, allow_nan=False))
