"""A job's secret: what proves, on every channel a learner opens, that the other end belongs to
the same job.

The driver makes a fresh one per job (a Tune trial is a job of its own) and hands it to its
learners and its service only as an argument of Ray calls (Ray's own, authenticated channel). It
is never written anywhere: it has no JSON form (`strict_json` refuses it), its `repr` hides it,
and no spec, log line, event, checkpoint or summary holds it. On the network only tags made with
it travel (HMAC-SHA256 over a fresh nonce and what the tag is for), never the key itself.

Example:
    >>> secret = JobSecret()
    >>> tag = secret.tag(b"link", b"nonce")
    >>> secret.proves(tag, b"link", b"nonce"), secret.proves(tag, b"link", b"other")
    (True, False)
    >>> repr(secret)
    'JobSecret(<hidden>)'
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_BYTES = 32  # 256 bits: HMAC-SHA256's block-sized key is more than a guess will ever find


class JobSecret:
    """A job's secret key; tags made with it prove membership without revealing it."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes | None = None):
        self._key = key if key is not None else secrets.token_bytes(KEY_BYTES)
        if len(self._key) < KEY_BYTES:
            raise ValueError(f"a job secret has at least {KEY_BYTES} bytes")

    def tag(self, *parts: bytes) -> bytes:
        """HMAC-SHA256 of `parts` (each length-prefixed, so no two lists of parts share a tag)."""
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in parts:
            mac.update(len(part).to_bytes(4, "big"))
            mac.update(part)
        return mac.digest()

    def proves(self, tag: bytes, *parts: bytes) -> bool:
        """Whether `tag` is this secret's tag of `parts` (compared in constant time)."""
        return hmac.compare_digest(tag, self.tag(*parts))

    def __repr__(self) -> str:
        return "JobSecret(<hidden>)"

    __str__ = __repr__

    def __reduce__(self):  # pickled only into Ray's calls to the job's own learners and service
        return (JobSecret, (self._key,))

    def __eq__(self, other) -> bool:
        return isinstance(other, JobSecret) and hmac.compare_digest(self._key, other._key)

    def __hash__(self) -> int:
        return hash(self.tag(b"hash"))
