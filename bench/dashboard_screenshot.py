"""A screenshot of the Ray dashboard's Jobs page showing a Chorus job, for the README.

Starts a Ray head node on loopback (`orchestrator.cluster.local_head`), submits a short 2-learner gossip
job with `chorus submit --follow` (a corpus made by `jobs/synth/corpus.py` in a temp dir), and has
headless Chromium (Debian's `chromium`) render http://127.0.0.1:PORT/#/jobs. Writes
`docs/ray_dashboard_jobs.png` and `bench/results/dashboard_screenshot.json` (the job, its status,
the page's size). Not a timing benchmark: there is no baseline to compare against.

Run: PYTHONPATH=. .venv/bin/python bench/dashboard_screenshot.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHOT = ROOT / "docs" / "ray_dashboard_jobs.png"
RESULT = ROOT / "bench" / "results" / "dashboard_screenshot.json"


def main() -> None:
    from jobs.synth.corpus import synthesize
    from orchestrator.cluster.local_head import BIN, HeadNode

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        sys.exit("needs Debian's chromium: apt-get install -y chromium")
    work = Path(tempfile.mkdtemp(prefix="chorus-shot-"))
    head = HeadNode(cpus=4, token=False)  # loopback only; the browser needs no token cookie then
    try:
        synthesize(work / "corpus", utterances=160, eval_utterances=20, seed=7, workers=2, progress=False)
        sets = [f"data.{s.replace('-', '_')}={work / 'corpus' / f'{s}.jsonl'}"
                for s in ("train", "dev", "test", "test-unseen")]
        sets += ["learners=2", "group.kind=gossip", "budget.epochs=3", "data.max_batch_seconds=20"]
        submit = subprocess.run([str(BIN / "chorus"), "submit", "jobs/configs/tiny.yaml", "--address", head.address,
                                 "--follow", "--out", str(work / "out"), *[a for s in sets for a in ("--set", s)]],
                                cwd=ROOT, env=head.env, capture_output=True, text=True, timeout=900)
        job_id = submit.stdout.splitlines()[0] if submit.stdout else None
        SHOT.parent.mkdir(exist_ok=True)
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1920,760", "--virtual-time-budget=20000", f"--screenshot={SHOT}",
                        f"{head.address}/#/jobs"], check=True, capture_output=True, timeout=180)
        from PIL import Image

        size = Image.open(SHOT).size
        result = {"job": job_id, "submit_exit": submit.returncode,
                  "status": submit.stderr.strip().splitlines()[-1] if submit.stderr.strip() else None,
                  "screenshot": str(SHOT.relative_to(ROOT)), "size": size, "browser": browser}
        RESULT.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result))
    finally:
        head.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
