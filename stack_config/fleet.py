"""Every stack file together: the checks no single stack can make.

A GPU UUID is the GPU's identity everywhere, so it belongs to at most one stack file (a UUID one stack
hides and another exposes is the worst case: the other stack's plugin hands it out). A node of one
cluster belongs to at most one stack: two plugins registering nvidia.com/gpu on one node leave the
kubelet with the later one's devices. The cluster is what the stack's `kubernetes:` keys name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from common.cli import stack_name_of
from stack_config.load import KUBERNETES, parse_project_config, read_stack_file


def rollout_order(paths: Iterable[Path]) -> list[str]:
    """Stack names by `hidden-gpu:rolloutWave`, then name."""
    waves = {stack_name_of(p): parse_project_config(read_stack_file(p)).rollout_wave for p in paths}
    return sorted(waves, key=lambda name: (waves[name], name))


@dataclass(frozen=True)
class Conflict:
    what: str
    stacks: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.what}: listed by {' and '.join(self.stacks)}"


def conflicts(paths: Iterable[Path]) -> list[Conflict]:
    """Every UUID and every (cluster, node) that more than one stack file lists; InvalidConfigError first
    for a file that is not a valid stack."""
    uuids: dict[str, list[str]] = {}
    nodes: dict[tuple[str, str], list[str]] = {}
    for path in paths:
        config = read_stack_file(path)
        stack = parse_project_config(config)
        cluster = " ".join(str(config.get(f"{KUBERNETES}{key}", "")) for key in ("kubeconfig", "context"))
        for node in stack.nodes:
            nodes.setdefault((cluster.strip(), node.name), []).append(path.name)
            devices = [*node.exposed_gpus, *node.hidden_gpus, *(m for ms in node.mig_devices.values() for m in ms)]
            for uuid in dict.fromkeys(devices):
                uuids.setdefault(uuid, []).append(path.name)
    found = [Conflict(f"GPU {uuid}", tuple(files)) for uuid, files in uuids.items() if len(files) > 1]
    found += [
        Conflict(f"node {node} of cluster '{cluster}'", tuple(files))
        for (cluster, node), files in nodes.items()
        if len(files) > 1
    ]
    return found
