"""uv's flags for the package sources pip is configured with on this machine (pip.conf files and
PIP_* variables: index URLs, find-links folders, constraint files). `make install` installs with
uv, which reads no pip configuration; with these flags both resolve from the same places, so a
machine whose pip takes PyTorch from a local folder gives uv the same folder.

pip merges the files of one version from every index and takes the most specific wheel; uv takes
a version's files from the first index that lists it (so with two local indexes, one holding a
package's `any` wheel and the other its `manylinux` one, uv could install the wheel without the
native library). A local (file://) index is therefore handed to uv as one flat folder of links to
all its files, beside the find-links folders, where uv chooses among all of them as pip does.
Prints nothing where pip is configured with nothing."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

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
    if len(values.get("index-url", [])) > 1:
        values["index-url"] = values["index-url"][-1:]  # one index: a variable's overrides a file's
    return values


def flatten(index_url: str, into: Path) -> None:
    """Links in `into` to every file a local PEP 503 index (`file://.../simple`) lists."""
    root = Path(unquote(urlparse(index_url).path))
    for page in root.glob("*/index.html"):
        for href in re.findall(r'href="([^"#]+)', page.read_text()):
            target = Path(unquote(urlparse(urljoin(page.as_uri(), href)).path))
            link = into / target.name
            if target.is_file() and not link.exists():
                link.symlink_to(target)


def uv_flags(values: dict[str, list[str]], flat: Path) -> list[str]:
    flags = []
    local = [url for option in ("index-url", "extra-index-url") for url in values.get(option, [])
             if url.startswith("file:")]
    if local:
        flat.mkdir(parents=True, exist_ok=True)
        for url in local:
            flatten(url, flat)
        flags += ["--find-links", str(flat)]
        if any(url.startswith("file:") for url in values.get("index-url", [])):
            flags.append("--no-index")  # pip reads no remote index either
    for option, items in values.items():
        for item in items:
            if not item.startswith("file:") or option == "find-links":
                flags += [FLAGS[option], item]
    return flags


if __name__ == "__main__":
    # the flat folder of links: argv[1] (the Makefile's is inside the venv it installs)
    print(shlex.join(uv_flags(configured(), Path(sys.argv[1]))))
