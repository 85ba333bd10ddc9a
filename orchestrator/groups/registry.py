"""The registry of group kinds: `group.kind` -> the module that holds that kind's `GroupKind`
(`kind.py`) as `KIND`. A kind is added with one module and one line here (or, from outside the
tree, `register`). Modules load on first use: asking for one kind loads no other.
"""

from __future__ import annotations

import importlib

from orchestrator.groups.kind import GroupKind

KINDS = {
    "allreduce": "orchestrator.groups.allreduce",
    "gossip": "orchestrator.groups.gossip",
    "hierarchical": "orchestrator.groups.hierarchical",
    "diloco": "orchestrator.groups.diloco",
}
DEFAULT = "allreduce"
_registered: dict[str, GroupKind] = {}


def names() -> list[str]:
    return sorted({*KINDS, *_registered})


def register(kind: GroupKind) -> None:
    """Add a kind from outside the tree (a test's, a user's package); in the processes that use it
    (learners too: register it where their code is imported, e.g. in the module that defines it)."""
    _registered[kind.name] = kind


def kind_of(name: str) -> GroupKind:
    """The plug-in of `group.kind: name`; ValueError naming the known kinds if there is none."""
    if name in _registered:
        return _registered[name]
    if name not in KINDS:
        raise ValueError(f"unknown group kind {name!r}: known kinds are {', '.join(names())}")
    return importlib.import_module(KINDS[name]).KIND


def call(handle, kind: str, name: str, *args):
    """`kind`'s call `name` on the learner behind `handle` (its `member_call`), on the concurrency
    group the kind runs it on (`GroupKind.call_groups`); returns the object ref."""
    group = kind_of(kind).call_groups.get(name)
    method = handle.member_call.options(concurrency_group=group) if group else handle.member_call
    return method.remote(kind, name, *args)
