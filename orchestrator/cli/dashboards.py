"""Chorus's Grafana dashboard (`dashboards/chorus.json`): where Ray's Grafana provisioning of a
session loads dashboards from, installing it there (`chorus dashboards install`), and the queries
of its panels.

Ray's dashboard writes a Grafana provisioning folder for every session it starts
(`SESSION/metrics/grafana/provisioning`, regenerated at each start), whose dashboard provider
loads every JSON file of one folder: `install` copies `chorus.json` into that folder, so a
Grafana started with the session's `grafana.ini` shows it next to Ray's own dashboards.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import click
import yaml

from orchestrator.cli.app import main

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "chorus.json"
DEFAULT_SESSION = Path("/tmp/ray/session_latest")


class DashboardError(RuntimeError):
    """The dashboard cannot be installed; the message says why."""


def provisioned_folder(session_dir: Path) -> Path:
    """The folder of dashboards that Grafana's provisioning for `session_dir` loads."""
    provider = Path(session_dir) / "metrics" / "grafana" / "provisioning" / "dashboards" / "default.yml"
    if not provider.is_file():
        raise DashboardError(f"{provider}: not found; is {session_dir} the session folder of a Ray head node whose "
                             "dashboard is running (`ray start --head` writes it; default /tmp/ray/session_latest, "
                             "or TEMP_DIR/session_latest with --temp-dir)?")
    providers = (yaml.safe_load(provider.read_text()) or {}).get("providers") or []
    paths = [p.get("options", {}).get("path") for p in providers if p.get("options", {}).get("path")]
    if not paths:
        raise DashboardError(f"{provider}: no dashboard provider with a path")
    return Path(paths[0])


def install(session_dir: Path = DEFAULT_SESSION) -> Path:
    """Copy chorus.json where the session's Grafana provisioning loads it; returns the copy's path."""
    folder = provisioned_folder(session_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(DASHBOARD, folder / "chorus_grafana_dashboard.json"))


def panel_queries(dashboard: Path = DASHBOARD) -> list[tuple[str, str]]:
    """(panel title, PromQL expression) of every target of every panel."""
    data = json.loads(Path(dashboard).read_text())
    return [(panel["title"], target["expr"]) for panel in data["panels"] for target in panel.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """The Chorus series an expression reads."""
    return set(re.findall(r"\bray_chorus_[a-z_]+", expr))


@main.group()
def dashboards():
    """Chorus's Grafana dashboard."""


@dashboards.command("install")
@click.option("--session-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The Ray session folder of the head node [default: /tmp/ray/session_latest].")
def dashboards_install(session_dir):
    """Put dashboards/chorus.json where the Grafana provisioning Ray generated for the session loads it
    (run it on the head node after each `ray start --head`: Ray regenerates that folder)."""
    session = (session_dir or DEFAULT_SESSION).resolve()
    try:
        path = install(session)
    except DashboardError as exc:
        raise click.ClickException(str(exc)) from None
    metrics = session / "metrics"
    click.echo(f"chorus: installed the Chorus dashboard as {path}\n"
               f"  Prometheus: prometheus --config.file={metrics}/prometheus/prometheus.yml\n"
               f"  Grafana:    grafana-server --homepath /usr/share/grafana "
               f"--config {metrics}/grafana/grafana.ini web\n"
               "  So that Ray's dashboard embeds Grafana's panels, start the head with both hosts set, e.g.\n"
               "    RAY_GRAFANA_HOST=http://127.0.0.1:3000 RAY_PROMETHEUS_HOST=http://127.0.0.1:9090 ray start --head\n"
               "  (the addresses at which the head node reaches Grafana and Prometheus).")
