"""What a stack's record in the cluster says, written and read: plain data, no Pulumi (cluster.release and
cluster.verify read every stack's record)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common.names import RECORD_NODE_PREFIX, STACK_RECORD_KEY
from stack_config import NodeConfig


def exposed_by_node(nodes: Sequence[NodeConfig]) -> dict[str, list[str]]:
    """Node name -> its exposed UUIDs: all a stack's record says about it."""
    return {n.name: list(n.exposed_gpus) for n in nodes}


def record_data(stack: str, exposed: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """The record's data: `stack`, and one `node.<name>` key per node holding its exposed UUIDs, comma-separated.
    Exposed UUIDs only: the cluster must not learn a hidden GPU exists (the plugin's env names the exposed
    ones anyway); a stack checks its hidden UUIDs against the others' exposed ones. A key per node keeps
    the review's diff to one line per node."""
    return {STACK_RECORD_KEY: stack} | {
        f"{RECORD_NODE_PREFIX}{node}": ",".join(uuids) for node, uuids in exposed.items()
    }


@dataclass(frozen=True)
class Claim:
    """What one live record says: the stack, where the record is, and the GPUs each of its nodes exposes."""

    stack: str
    where: str
    nodes: Mapping[str, Sequence[str]]

    @classmethod
    def of(cls, config_map: Mapping[str, Any]) -> Claim:
        """A live record; one that cannot be read claims every node (`*`), so nothing is released on it."""
        metadata = config_map.get("metadata") or {}
        return cls.parse(config_map.get("data"), f"ConfigMap {metadata.get('namespace')}/{metadata.get('name')}")

    @classmethod
    def parse(cls, data: Any, where: str) -> Claim:
        if not isinstance(data, dict) or not isinstance(data.get(STACK_RECORD_KEY), str):
            return cls("<unreadable record>", where, {"*": []})
        nodes = {
            key.removeprefix(RECORD_NODE_PREFIX): [u for u in str(value).split(",") if u]
            for key, value in data.items()
            if key.startswith(RECORD_NODE_PREFIX)
        }
        return cls(data[STACK_RECORD_KEY], where, nodes)

    @classmethod
    def declared(cls, stack: str, nodes: Sequence[NodeConfig]) -> Claim:
        """The record this stack's program writes."""
        return cls.parse(record_data(stack, exposed_by_node(nodes)), "the stack file")

    def lists(self, node: str) -> bool:
        return node in self.nodes or "*" in self.nodes

    def gpus(self) -> dict[str, str]:
        """Exposed UUID -> the node that lists it."""
        return {uuid: node for node, uuids in self.nodes.items() for uuid in uuids}
