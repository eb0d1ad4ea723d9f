"""Stack configs for tests: a valid baseline and the one-key changes the cases build on (the refused ones:
tests/support/rejections.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

EXPOSED = "GPU-5f3c1a2b-7d4e-4c1f-9a0b-1c2d3e4f5a6b"
HIDDEN = [
    "GPU-8a21c3d4-1e2f-4a3b-8c4d-5e6f7a8b9c0d",
    "GPU-0b1c2d3e-4f5a-4b6c-9d7e-8f9a0b1c2d3e",
]
FULLY_HIDDEN = [
    "GPU-c0ffee00-1111-4222-8333-444455556666",
    "GPU-deadbeef-7777-4888-9999-aaaabbbbcccc",
]


# The keys every stack needs outside hidden-gpu: its cluster, and no default provider.
CLUSTER: dict[str, Any] = {"kubernetes:context": "admin@test", "pulumi:disable-default-providers": ["kubernetes"]}
CLUSTER_YAML = "  kubernetes:context: admin@test\n  pulumi:disable-default-providers: [kubernetes]\n"


def valid_config() -> dict[str, Any]:
    """Two nodes, one exposing a GPU and one with every GPU hidden, plus a quota."""
    return {
        "kubernetes:context": "admin@test",
        "pulumi:disable-default-providers": ["kubernetes"],
        "hidden-gpu:nodes": [
            {"name": "gpu-node-01", "exposedGpus": [EXPOSED], "hiddenGpus": list(HIDDEN)},
            {"name": "gpu-node-02", "exposedGpus": [], "hiddenGpus": list(FULLY_HIDDEN)},
        ],
        "hidden-gpu:quotas": {"ml-team": 1},
        "hidden-gpu:devicePlugin": {"image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"},
    }


def write_stack(tmp_path: Path, config: dict[str, Any], name: str = "case") -> Path:
    """A stack file Pulumi.<name>.yaml holding `config`, as a person would write it."""
    path = tmp_path / f"Pulumi.{name}.yaml"
    path.write_text(yaml.safe_dump({"config": config}, sort_keys=False), encoding="utf-8")
    return path


def changed(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    config = valid_config()
    change(config)
    return config


def dra_allocated(config: dict[str, Any]) -> dict[str, Any]:
    """The config with DRA handing out every node's GPUs (`allocator: dra`), its settings written as the defaults."""
    nodes = [{**n, "allocator": "dra"} for n in config["hidden-gpu:nodes"]]
    return {**config, "hidden-gpu:nodes": nodes, "hidden-gpu:dra": {}}


def node(config: dict[str, Any], index: int = 0) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = config["hidden-gpu:nodes"]
    return nodes[index]


PARENT = "GPU-11111111-2222-4333-8444-555566667777"
MIG_A = "MIG-aaaaaaaa-2222-4333-8444-555566667777"
MIG_B = "MIG-bbbbbbbb-2222-4333-8444-555566667777"


def time_sliced(replicas: object = 4, **extra: Any) -> dict[str, Any]:
    return changed(lambda c: node(c).__setitem__("timeSlicing", {"replicas": replicas, **extra}))


def with_mig(
    strategy: str = "mixed", exposed: list[str] | None = None, hidden: list[str] | None = None
) -> dict[str, Any]:
    def change(config: dict[str, Any]) -> None:
        node(config).update(
            {
                "exposedGpus": [EXPOSED, *(exposed if exposed is not None else [MIG_A, MIG_B])],
                "hiddenGpus": [*HIDDEN, *(hidden or [])],
                "migStrategy": strategy,
                "migDevices": {PARENT: [MIG_A, MIG_B]},
            }
        )

    return changed(change)


def volume_mounts(config: dict[str, Any], accepted_by: str = "nodeConfig") -> None:
    """The hardened device-list mode, with the toolkit setting it needs provided by `accepted_by`."""
    config["hidden-gpu:devicePlugin"].update(
        {"deviceListStrategy": "volume-mounts", "volumeMountsAcceptedBy": accepted_by}
    )


def cluster_policy_patched(config: dict[str, Any]) -> None:
    """volume-mounts, with this stack's ClusterPolicy patch providing the toolkit setting."""
    volume_mounts(config, "clusterPolicy")
    config["hidden-gpu:clusterPolicy"] = {"patch": True}
