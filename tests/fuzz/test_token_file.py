"""Fuzzing the Ray token file as `chorus submit` finds it (`orchestrator.cli.submit.find_token`, through
Ray's own loader: the file named by RAY_AUTH_TOKEN_PATH): any bytes. Own error: `SubmitError`, one
line naming the file and saying what to do. A token found is text that can go into a header."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from orchestrator.cli.submit import SubmitError, find_token
from tests.fuzz.fuzzing import Sandbox, fuzzed, one_input

pytestmark = pytest.mark.unit


@pytest.fixture
def token_loader(monkeypatch):
    """Ray's token loader, reading only what a test puts in RAY_AUTH_TOKEN_PATH; reset afterwards."""
    from ray._raylet import AuthenticationTokenLoader

    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    yield monkeypatch
    monkeypatch.undo()
    AuthenticationTokenLoader.instance().reset_cache()


@fuzzed(100)
@given(data=st.binary(max_size=80) | st.text(max_size=80).map(str.encode)
       | st.sampled_from([b"tok\n", b"  tok  ", b"\n\n", b"tok\x00en", b"tok\r\nen"]))
@example(data=b"\x80")  # not UTF-8: Ray's UnicodeDecodeError, a traceback
@example(data=b"\x00")  # a token of a control character, bound for an HTTP header
@example(data=b"\x1c")  # Python strips it as a space: an empty token
def test_a_token_file_gives_a_token_or_one_line_naming_it(tmp_path, token_loader, data):
    with Sandbox(tmp_path) as box:
        token_loader.setenv("HOME", str(box.run))  # no ~/.ray/auth_token of the machine's
        token_loader.setenv("RAY_AUTH_TOKEN_PATH", str(box.run / "auth_token"))
        (box.run / "auth_token").write_bytes(data)
        with one_input(SubmitError, starts=f"RAY_AUTH_TOKEN_PATH names {box.run / 'auth_token'}"):
            token, where = find_token()
            assert token and token.isprintable() and token == token.strip() and where == str(box.run / "auth_token")
