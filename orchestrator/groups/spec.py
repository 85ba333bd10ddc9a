"""The job spec's `group` section (`GroupConfig`): what every kind of group shares (balance,
compression, topology, interface), the kind's name checked against the registry, and the kind's
own section (`group.<kind>:`) validated by the kind's own model (`GroupKind.options`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from orchestrator.groups.registry import DEFAULT, kind_of, names


class GroupConfig(BaseModel):
    """The `group` section: how the learners keep their models in agreement.

    Args:
    kind: how learners keep their models in agreement: one of the registered group kinds
        (`orchestrator/groups/registry.py`, each described below). A kind with options of its
        own takes them in a section named after it (`group: {kind: K, K: {...}}`), validated by
        the kind's own model.
    balance: adapt to learners of different speeds (measured samples/s), as the kind does it
        (sizes of shards and batches, positions on a ring).
    compression: what crosses the network between learners: `none` (float32), `bf16` (half the
        bytes) or `int8` (a quarter), always with error feedback (nothing rounded away is lost,
        only sent later): weight exchanges on links, and sums between hosts (summed host by host
        then).
    topology_aware: learners that share a host (a Ray node) are placed together: a ring keeps
        them next to each other, so most exchanges stay on the host; sums are taken on each host
        first and one sum per host crosses the network.
    interface: the network interface learners' process groups and links use on every node
        (e.g. `eth1`, as NCCL_SOCKET_IFNAME); left out, each learner uses the interface that holds
        its node's address (the one Ray gives the node), never what the host name resolves to.
    options: the kind's own section, as its model validated it (None: the kind has none).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    kind: str = Field(DEFAULT, json_schema_extra={"choices": names()})
    balance: bool = True
    compression: Literal["none", "bf16", "int8"] = "none"
    topology_aware: bool = True
    interface: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:@-]{1,15}$")
    options: Any = Field(None, exclude=True)

    @staticmethod
    def choices_doc() -> list[str]:
        """docs/spec.md's list of the kinds: each one's name and what its strategy says it is."""
        return [f"- `{name}`: " + " ".join((kind_of(name).strategy.__doc__ or "").split()) for name in names()]

    @staticmethod
    def kind_sections() -> list[tuple[str, type]]:
        """docs/spec.md's sections of the kinds' own options: (kind, its options model)."""
        return [(name, kind_of(name).options) for name in names() if kind_of(name).options is not None]

    @field_validator("kind")
    @classmethod
    def _registered(cls, kind: str) -> str:
        if kind not in names():
            raise PydanticCustomError("literal_error", "Input should be one of the group kinds: {kinds}",
                                      {"kinds": ", ".join(names())})
        return kind

    @model_validator(mode="before")
    @classmethod
    def _kind_section(cls, data: Any) -> Any:
        """The section named after the kind, validated by the kind's own model (`GroupKind.options`)."""
        if not isinstance(data, dict) or str(data.get("kind", DEFAULT)) not in names():
            return data  # not a section, or an unknown kind (`_registered` says so)
        data = dict(data)
        kind = kind_of(str(data.get("kind", DEFAULT)))
        section = data.pop(kind.name, None)
        if kind.options is None:
            if section is not None:
                raise ValueError(f"group kind {kind.name!r} takes no options (group.{kind.name})")
            return data
        try:
            data["options"] = kind.options.model_validate(section or {})
        except ValidationError as exc:  # its errors located under the section's key: group.<kind>.<key>
            raise ValidationError.from_exception_data(exc.title, [
                {"type": e["type"], "loc": (kind.name, *e["loc"]), "input": e["input"], "ctx": e.get("ctx", {})}
                for e in exc.errors()]) from None
        return data

    @model_serializer(mode="wrap")
    def _with_kind_section(self, handler) -> dict:
        """Dumped as a spec holds it: the kind's options under its name."""
        out = handler(self)
        if self.options is not None:
            out[self.kind] = self.options.model_dump()
        return out
