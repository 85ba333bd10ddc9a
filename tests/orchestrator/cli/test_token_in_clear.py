"""`chorus submit` and `chorus jobs` warn once, on stderr, before they send the cluster's token
over plain http:// to a host that is not this machine's loopback (`submit.token_in_clear`), and
show the address without its credentials. Nothing here connects anywhere."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from orchestrator.cli import main
from orchestrator.cli.submit import token_in_clear

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("address, warned", [
    ("http://10.0.0.5:8265", True),
    ("http://head.example.com:8265", True),  # a name may resolve anywhere
    ("HTTP://192.0.2.1:8265", True),
    ("http://[2001:db8::1]:8265", True),
    ("http://127.0.0.1:8265", False),
    ("http://127.8.9.10:8265", False),
    ("http://localhost:8265", False),
    ("http://[::1]:8265", False),
    ("https://head.example.com", False),  # encrypted
    ("10.0.0.5:6379", False),  # no scheme: Ray finds the dashboard's address itself
])
def test_a_token_over_plain_http_to_another_host_is_warned_about(address, warned):
    line = token_in_clear(address, "a-token")
    assert (line is not None) == warned, line
    assert token_in_clear(address, None) is None  # no token, nothing exposed
    if warned:
        assert "\n" not in line and "over plain http://" in line and "a-token" not in line


def test_chorus_submit_warns_once_on_stderr_without_the_addresss_credentials(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\nlearners: -1\n")  # refused here, before anything connects
    env = {"RAY_AUTH_TOKEN": "secret-token-123", "RAY_AUTH_TOKEN_PATH": None}
    address = "http://admin:hunter2@192.0.2.7:8265"
    first = CliRunner().invoke(main, ["submit", str(spec), "--address", address], env=env)
    second = CliRunner().invoke(main, ["submit", str(spec), "--address", address], env=env)
    assert first.exit_code == 1 and "Error: invalid spec: " in first.stderr, first.output
    warnings = [line for line in first.stderr.splitlines() if "warning" in line]
    assert warnings == ["chorus: warning: the Ray token goes to http://192.0.2.7:8265 over plain http://, readable "
                        "by anyone on the way: use an https:// address (a TLS proxy before the dashboard) or an SSH "
                        "tunnel to a loopback one (`ray dashboard cluster.yaml`)"]
    assert "warning" not in second.stderr  # once
    for text in (first.output, second.output):
        assert "hunter2" not in text and "secret-token-123" not in text
