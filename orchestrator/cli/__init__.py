"""The `chorus` command, the composition root above the driver and the Tune layer (`search/`):
`app.py` holds the command group, and each module beside it adds its commands to it: `data.py`
(synth, features, shards, lm), `train.py` (train, sweep, eval), `remote.py` (submit, jobs) and
`dashboards.py` (dashboards install). `submit.py` is the Ray Jobs client behind `remote.py`.

`orchestrator.cli:main` (the `chorus` script) and `python -m orchestrator.cli` run it.
"""

from orchestrator.cli import dashboards, data, remote, train  # noqa: F401  (each adds its commands to main)
from orchestrator.cli.app import main

__all__ = ["main"]
