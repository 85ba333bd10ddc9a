"""A run's pictures, kept current at every evaluation: `curves.png` (train loss, dev loss and dev WER
against wall time and against samples trained, the learner count's changes marked) and TensorBoard
event files in `tensorboard/` (the same series, by samples trained), so that `tensorboard --logdir
runs/` shows runs, and sweep trials, side by side.

The picture is drawn in a thread of its own (matplotlib's object API, no pyplot), at most every
REDRAW_S seconds, the newest records winning, and replaced atomically; `close` draws the last. A resumed run's event
file starts where its checkpoint was, hiding what the stopped run logged after it (TensorBoard's
purge step).

Example:
    >>> pictures = RunPictures(Path("runs/tiny"), "tiny", resumed_samples=None)  # doctest: +SKIP
    >>> pictures.add({"samples": 175, "wall_s": 1.4, "train_loss": 98.1, "dev_loss": 68.4, "dev_wer": 100.0,
    ...               "learners": 2}, events=[])  # doctest: +SKIP
    >>> pictures.close()  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger("chorus.pictures")

CURVES = "curves.png"
TENSORBOARD = "tensorboard"
SERIES = (("train_loss", "train loss"), ("dev_loss", "dev loss"), ("dev_wer", "dev WER (%)"))
MEMBERSHIP = ("join", "leave", "failure", "drain")  # the events that change who trains
REDRAW_S = 10.0  # the picture is drawn at most this often (and at the end): a draw costs ~0.2 s of a core, and a
# job of short epochs evaluates every second or two on cores its learners need


class RunPictures:
    """`curves.png` and the TensorBoard events of the run in `out_dir` (named `name` in the picture).
    `resumed_samples`: the samples of the checkpoint a resumed run started from."""

    def __init__(self, out_dir: Path, name: str, resumed_samples: int | None = None):
        from tensorboardX import SummaryWriter

        self.out_dir, self.name = Path(out_dir), name
        purge = None if resumed_samples is None else resumed_samples + 1  # the checkpoint's own evaluation stays
        # tensorboardX names a file by the second and the host alone, and truncates one of that name: a resumed
        # run's writer opened in its stopped run's second emptied that run's events. Nanoseconds keep each
        # writer's file, in the order TensorBoard must read them (by name) for the purge to drop what it should.
        self.writer = SummaryWriter(str(self.out_dir / TENSORBOARD), purge_step=purge, flush_secs=10,
                                    filename_suffix=f".{time.time_ns()}")
        self._pending: tuple[list[dict], list[dict]] | None = None
        self._seen: list[tuple[float, float]] = []  # (time.time(), wall_s) of each record added here
        self._wake, self._closed = threading.Condition(), False
        self._painter = threading.Thread(target=self._paint_forever, name="curves.png", daemon=True)
        self._painter.start()

    def add(self, record: dict, records: list[dict], events: list[dict]) -> None:
        """An evaluation's `record` into the event file; the picture of all `records` so far (and the
        membership `events`) drawn anew."""
        for key, _ in SERIES:
            if record.get(key) is not None:
                self.writer.add_scalar(key, record[key], global_step=int(record["samples"]))
        self.writer.add_scalar("learners", record.get("learners", 0), global_step=int(record["samples"]))
        self.writer.flush()
        self._seen.append((time.time(), record["wall_s"]))
        marked = [{**e, "wall_s": self._wall_at(e["time"])} for e in events
                  if e.get("kind") in MEMBERSHIP and isinstance(e.get("time"), float | int)]
        with self._wake:
            self._pending = (list(records), marked)
            self._wake.notify()

    def _wall_at(self, when: float) -> float:
        """The curve's wall time (a resumed run's counts its earlier runs') at the moment `when` (an
        event's time.time()): from the record added nearest before it (else the first), a second a second."""
        at, wall = next((p for p in reversed(self._seen) if p[0] <= when), self._seen[0])
        return max(0.0, wall + when - at)

    def close(self) -> None:
        """Flush the event file and wait for the last picture; never raises (a full disk is logged)."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._painter.join(timeout=60)
        try:
            self.writer.close()
        except Exception as exc:  # noqa: BLE001 - the run's end must not fail on its pictures
            log.warning("tensorboard events not closed: %s", exc)

    def _paint_forever(self) -> None:
        drawn_at = -REDRAW_S
        while True:
            with self._wake:
                while not self._closed and (self._pending is None or time.monotonic() - drawn_at < REDRAW_S):
                    self._wake.wait(timeout=None if self._pending is None else REDRAW_S)
                pending, self._pending = self._pending, None
                if pending is None:
                    return
            drawn_at = time.monotonic()
            try:
                draw(self.out_dir / CURVES, self.name, *pending)
            except Exception as exc:  # noqa: BLE001 - a picture must never stop a run
                log.warning("curves.png not drawn: %s", exc)


def draw(path: Path, name: str, records: list[dict], events: list[dict]) -> None:
    """The curves of `records` (and `events`' times marked) as a PNG at `path`, replaced atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 6.4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 3)
    walls = [r["wall_s"] for r in records]
    samples = [r["samples"] for r in records]
    for column, (key, label) in enumerate(SERIES):
        points = [(r["wall_s"], r["samples"], r[key]) for r in records if r.get(key) is not None]
        for row, (x_index, x_label) in enumerate(((0, "wall time (s)"), (1, "samples trained"))):
            ax = axes[row][column]
            if points:
                ax.plot([p[x_index] for p in points], [p[2] for p in points], marker="o", ms=3, lw=1.2)
            for event in events:
                at = event["wall_s"] if row == 0 else _samples_at(event["wall_s"], walls, samples)
                ax.axvline(at, color="tab:red" if event["kind"] in ("failure", "leave") else "tab:green",
                           lw=0.8, ls="--", alpha=0.6)
            ax.set_xlim(left=0)
            ax.set_xlabel(x_label, fontsize=8)
            ax.set_ylabel(label, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    last = records[-1] if records else {}
    fig.suptitle(f"{name}: {len(records)} evaluations, {last.get('samples', 0)} samples, "
                 f"learners now: {last.get('learners', 0)}; dashed: a learner joined (green) or left (red)", fontsize=9)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, dpi=90, format="png")
    os.replace(tmp, path)


def _samples_at(wall_s: float, walls: list[float], samples: list[int]) -> float:
    """The samples trained at `wall_s`, interpolated between evaluations (0 before the first)."""
    before = [(w, s) for w, s in zip(walls, samples, strict=True) if w <= wall_s]
    after = [(w, s) for w, s in zip(walls, samples, strict=True) if w > wall_s]
    (w0, s0), (w1, s1) = (before[-1] if before else (0.0, 0)), (after[0] if after else (None, None))
    if w1 is None or w1 == w0:
        return float(s0)
    return s0 + (s1 - s0) * (wall_s - w0) / (w1 - w0)
