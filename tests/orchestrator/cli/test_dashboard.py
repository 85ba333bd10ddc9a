"""The Grafana dashboard against the metrics in code, without a cluster: every series a panel
reads is one Chorus exports, every metric is on some panel, and the dashboard follows Ray's
conventions (a Prometheus datasource variable, a SessionName filter, a job filter) in every query.
(That every query returns data from a real Prometheus is tests/orchestrator/cluster/test_cluster.py's.)"""

from __future__ import annotations

import json

import pytest

from orchestrator.cli.dashboards import DASHBOARD, metric_names, panel_queries
from orchestrator.driver.metrics import METRICS, prometheus_names

pytestmark = pytest.mark.unit


def test_panels_read_only_metrics_that_chorus_exports_and_show_every_metric():
    read = set().union(*(metric_names(expr) for _, expr in panel_queries()))
    assert read <= prometheus_names(), f"the dashboard reads series no code exports: {read - prometheus_names()}"
    shown = {name for name in METRICS if any(s.startswith(f"ray_{name}") for s in read)}
    assert shown == set(METRICS), f"metrics on no panel: {set(METRICS) - shown}"


def test_the_dashboard_follows_rays_conventions():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"SessionName", "ChorusJob", "Sweep"} <= set(variables)
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert 'SessionName=~"$SessionName"' in target["expr"], panel["title"]
            assert ('chorus_job=~"$ChorusJob"' in target["expr"]) != ('chorus_sweep=~"$Sweep"' in target["expr"])
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for wanted in ("samples per second", "step time", "communication", "loss", "wer", "consensus",
                   "learners in the group", "membership", "trials by state", "best metric"):
        assert wanted in titles, wanted
