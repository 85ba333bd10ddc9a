"""A real S3 API on loopback for the tests and the benchmarks: moto's server on a free port with a
bucket `chorus`, and the URIs Chorus's storage takes for it.

Example:
    >>> with local_s3() as endpoint:  # doctest: +SKIP
    ...     store = uri(endpoint, "runs/one")
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator

from orchestrator.cluster.local_head import BIN, free_port

KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1"}
START_TIMEOUT_S = 30


@contextlib.contextmanager
def local_s3() -> Iterator[str]:
    """moto's S3 server on a free loopback port with a bucket `chorus`: its endpoint
    ("127.0.0.1:PORT"). The AWS credentials it takes are set in this process's environment while
    it runs (child processes inherit them), and put back afterwards."""
    import boto3

    port = free_port()
    server = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    saved = {k: os.environ.get(k) for k in KEYS}
    os.environ.update(KEYS)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(f"moto's S3 server did not start on 127.0.0.1:{port}") from None
                time.sleep(0.2)
        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}").create_bucket(Bucket="chorus")
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def uri(endpoint: str, path: str) -> str:
    """The storage URI of `path` in the bucket behind `endpoint`."""
    return f"s3://chorus/{path}?endpoint_override={endpoint}&scheme=http"
