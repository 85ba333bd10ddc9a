"""The `chorus` command, the composition root above the driver and the Tune layer (`search/`):
`app.py` holds the command group, and each module beside it adds its commands to it: `train.py`
(train, sweep, eval), `transcribe.py` (transcribe), `remote.py` (submit, jobs) and `dashboards.py`
(dashboards install); the registered workloads add theirs (`asr`: synth, features, shards, lm, from `jobs/commands.py`).
`submit.py` is the Ray Jobs client behind `remote.py`.

`orchestrator.cli:main` (the `chorus` script) and `python -m orchestrator.cli` run it.
"""

from orchestrator.cli import dashboards, remote, train, transcribe  # noqa: F401  (each adds its commands to main)
from orchestrator.cli.app import main
from orchestrator.workload import workload_commands

for _command in workload_commands():
    main.add_command(_command)

__all__ = ["main"]
