"""What Chorus says about a run's storage URI: the one error type of storage (`StorageError`, a
line naming the URI), whether an output is a URI, and `redact`, which removes from any text the
parts of a URI that are not for showing (credentials, query, fragment)."""

from __future__ import annotations

import re
from pathlib import Path

_USER_INFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^\s@?#]*@")
_QUERY = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s?#]*)[?#]\S*?(?=[\"'),;:.\]]*(?:\s|$))")


class StorageError(RuntimeError):
    """A URI that cannot be opened, read or written, or that another run holds; the message is
    one line naming it."""


def is_uri(out: str | Path) -> bool:
    return "://" in str(out)


def redact(text: str) -> str:
    """`text` — a URI, or a message with URIs in it — without what a URI carries that is not for
    showing: its user info (`key:secret@`), its query (`?endpoint_override=...&access_key=...`)
    and fragment. For every URI Chorus prints, logs or writes into a summary.

    Example:
        >>> redact("s3://key:secret@bucket/runs/x?endpoint_override=10.0.0.1:9000")
        's3://bucket/runs/x'
    """
    return _QUERY.sub(r"\1", _USER_INFO.sub(r"\1", str(text)))


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, redacted (pyarrow's messages quote the URI whole)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return redact(lines[0]) if lines else type(exc).__name__
