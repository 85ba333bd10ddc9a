"""The job's secret (orchestrator/base/secret.py): tags prove it without revealing it, and it has no
written form: no JSON, no repr, no str."""

import json
import pickle

import pytest

from orchestrator.base import strict_json
from orchestrator.base.secret import JobSecret

pytestmark = pytest.mark.unit


def test_a_tag_proves_the_secret_for_exactly_its_parts():
    secret, other = JobSecret(), JobSecret()
    tag = secret.tag(b"link", b"nonce")
    assert secret.proves(tag, b"link", b"nonce")
    assert not secret.proves(tag, b"link", b"nonce2") and not other.proves(tag, b"link", b"nonce")
    assert secret.tag(b"ab", b"c") != secret.tag(b"a", b"bc")  # parts are length-prefixed


def test_the_secret_is_never_written():
    secret = JobSecret()
    key = secret._key
    assert key.hex() not in repr(secret) and key.hex() not in str(secret) and "hidden" in repr(secret)
    assert key.hex() not in f"{secret} {[secret]} {({'s': secret})}"
    with pytest.raises(TypeError):
        strict_json.dumps({"secret": secret})
    with pytest.raises(TypeError):
        json.dumps(secret)
    assert pickle.loads(pickle.dumps(secret)) == secret  # what Ray's calls carry to the job's own processes
    with pytest.raises(ValueError):
        JobSecret(b"short")
