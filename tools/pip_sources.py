"""uv's flags for the package sources pip is configured with on this machine (pip.conf files and
PIP_* variables: index URLs, find-links folders, constraint files). `make install` installs with
uv, which reads no pip configuration; with these flags both resolve from the same places, so a
machine whose pip takes PyTorch from a local folder gives uv the same folder. Prints nothing where
pip is configured with nothing."""

from __future__ import annotations

import shlex
import subprocess
import sys

FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}


def configured() -> dict[str, list[str]]:
    """pip's configured values per option, in the order pip lists them (files, then variables)."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            check=True).stdout
    values: dict[str, list[str]] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        option = key.rpartition(".")[2]
        if option in FLAGS:
            for item in shlex.split(shlex.split(value)[0] if value else ""):
                if item not in values.setdefault(option, []):
                    values[option].append(item)
    return values


def uv_flags(values: dict[str, list[str]]) -> list[str]:
    flags = []
    for option, items in values.items():
        if option == "index-url":
            items = items[-1:]  # one index: a variable's overrides a file's
        for item in items:
            flags += [FLAGS[option], item]
    return flags


if __name__ == "__main__":
    print(shlex.join(uv_flags(configured())))
