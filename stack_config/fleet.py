"""Every stack file together: the checks no single stack can make.

A GPU UUID is the GPU's identity everywhere, so it belongs to at most one stack file (a UUID one stack
hides and another exposes is the worst case: the other stack's plugin hands it out). A node of one
cluster belongs to at most one stack: two plugins registering nvidia.com/gpu on one node leave the
kubelet with the later one's devices. The cluster is what the stack's `kubernetes:` keys name.

Stacks may share a cluster, but not what exists once per cluster under the same name in every stack: the
guard's policies (one set per cluster, so the stacks' guard settings and the plugin namespace it exempts must
be the same, or the last `up` silently rewrites the other's and its plugin pods are denied), a namespace's GPU
quota, a pool's RuntimeClass and the ClusterPolicy patch (each in one stack only).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from common.cli import stack_name_of
from stack_config.load import KUBERNETES, parse_project_config, read_stack_file
from stack_config.models import StackConfig


def rollout_order(paths: Iterable[Path]) -> list[str]:
    """Stack names by `hidden-gpu:rolloutWave`, then name."""
    waves = {stack_name_of(p): parse_project_config(read_stack_file(p)).rollout_wave for p in paths}
    return sorted(waves, key=lambda name: (waves[name], name))


@dataclass(frozen=True)
class Conflict:
    what: str
    stacks: tuple[str, ...]
    verb: str = "listed by"

    def __str__(self) -> str:
        return f"{self.what}: {self.verb} {' and '.join(self.stacks)}"


def _shared_cluster(cluster: str, stacks: dict[str, StackConfig]) -> list[Conflict]:
    """What stacks of one cluster would declare twice under one name (the module's docstring says which)."""
    found: list[Conflict] = []
    guards = {(s.guard.model_dump_json(), s.device_plugin.namespace) for s in stacks.values()}
    if len(guards) > 1:
        what = f"the guard of cluster '{cluster}' (one per cluster: guard settings and devicePlugin.namespace)"
        found.append(Conflict(what, tuple(stacks), "declared differently by"))
    once: dict[str, list[str]] = {}
    for file, stack in stacks.items():
        names = [f"the GPU quota of namespace {ns}" for ns in stack.quotas]
        names += [f"pool {node.pool}" for node in stack.nodes if node.pool and node.exposed_gpus]
        names += ["the ClusterPolicy patch"] if stack.cluster_policy.patch else []
        for name in dict.fromkeys(names):
            once.setdefault(f"{name} of cluster '{cluster}'", []).append(file)
    found += [Conflict(what, tuple(files), "declared by") for what, files in once.items() if len(files) > 1]
    return found


def conflicts(paths: Iterable[Path]) -> list[Conflict]:
    """Every UUID and every (cluster, node) that more than one stack file lists, and what stacks sharing a
    cluster would declare twice; InvalidConfigError first for a file that is not a valid stack."""
    uuids: dict[str, list[str]] = {}
    nodes: dict[tuple[str, str], list[str]] = {}
    clusters: dict[str, dict[str, StackConfig]] = {}
    for path in paths:
        config = read_stack_file(path)
        stack = parse_project_config(config)
        cluster = " ".join(str(config.get(f"{KUBERNETES}{key}", "")) for key in ("kubeconfig", "context")).strip()
        clusters.setdefault(cluster, {})[path.name] = stack
        for node in stack.nodes:
            nodes.setdefault((cluster, node.name), []).append(path.name)
            devices = [*node.exposed_gpus, *node.hidden_gpus, *(m for ms in node.mig_devices.values() for m in ms)]
            for uuid in dict.fromkeys(devices):
                uuids.setdefault(uuid, []).append(path.name)
    found = [Conflict(f"GPU {uuid}", tuple(files)) for uuid, files in uuids.items() if len(files) > 1]
    found += [
        Conflict(f"node {node} of cluster '{cluster}'", tuple(files))
        for (cluster, node), files in nodes.items()
        if len(files) > 1
    ]
    for cluster, stacks in clusters.items():
        found += _shared_cluster(cluster, stacks) if len(stacks) > 1 else []
    return found
