"""Chorus's Grafana dashboard (`dashboards/chorus.json`): where Ray's Grafana provisioning of a
session loads dashboards from, installing it there, and the queries of its panels.

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

import yaml

DASHBOARD = Path(__file__).resolve().parents[1] / "dashboards" / "chorus.json"
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
