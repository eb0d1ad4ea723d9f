"""The pinned DRA kubelet plugin as the program declares it (issue 41): where it runs, what its container is given
and what it may reach. Run for real by tests/node/test_dra_claim.py (a stand-in in its image)."""

from __future__ import annotations

from typing import Any

from common.names import DRA_OFF_FEATURE_GATES, KUBELET_PLUGINS, KUBELET_PLUGINS_REGISTRY, dra_plugin_name
from common.tokens import Token
from offline.program import run_program
from tests.support.stacks import changed, dra_allocated, valid_config

EXPOSED_NODE = valid_config()["hidden-gpu:nodes"][0]


def daemon_sets(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r.inputs["metadata"]["name"]: r.inputs for r in run_program(config, "test").of_type(Token.DAEMONSET)}


def pinned(config: dict[str, Any]) -> dict[str, Any]:
    return daemon_sets(config)[dra_plugin_name(EXPOSED_NODE["name"])]


def test_it_sees_the_exposed_gpus_alone_and_unprivileged() -> None:
    spec = pinned(dra_allocated(valid_config()))["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(EXPOSED_NODE["exposedGpus"])
    assert env["FEATURE_GATES"] == ",".join(f"{gate}=false" for gate in DRA_OFF_FEATURE_GATES)
    assert container["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    # The kubelet's directories it must share, each its own mount and no propagation (the chart's Bidirectional
    # plugins directory is MPS's alone); the driver root read-only.
    paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    assert paths == {
        "plugins-registry": KUBELET_PLUGINS_REGISTRY,
        "plugin-dir": f"{KUBELET_PLUGINS}/gpu.nvidia.com",
        "cdi-root": "/var/run/cdi",
        "driver-root": "/",
    }
    assert not [m for m in container["volumeMounts"] if m.get("mountPropagation")]
    assert [m["name"] for m in container["volumeMounts"] if m.get("readOnly")] == ["driver-root"]
    assert spec["runtimeClassName"] == f"hidden-gpu-{EXPOSED_NODE['name']}"
    assert spec["serviceAccountName"] == dra_plugin_name(EXPOSED_NODE["name"])


def test_under_a_hardened_toolkit_it_asks_for_its_gpus_as_mounts() -> None:
    """`volume-mounts`: the toolkit may ignore the variable for an unprivileged pod, so the GPUs are asked for as
    /dev/null mounts too, as the device plugin's pod asks for its own."""
    hardened = dra_allocated(
        changed(
            lambda c: c.__setitem__(
                "hidden-gpu:devicePlugin",
                {"deviceListStrategy": "volume-mounts", "volumeMountsAcceptedBy": "nodeConfig"},
            )
        )
    )
    (container,) = pinned(hardened)["spec"]["template"]["spec"]["containers"]
    requested = [m["mountPath"] for m in container["volumeMounts"] if m["mountPath"].startswith("/var/run/nvidia-")]
    assert requested == [f"/var/run/nvidia-container-devices/{uuid}" for uuid in EXPOSED_NODE["exposedGpus"]]


def test_only_where_dra_hands_out_exposed_gpus() -> None:
    """A plugin node runs the device plugin instead; a node that hides every GPU runs neither."""
    assert not [name for name in daemon_sets(valid_config()) if "dra-kubelet-plugin" in name]
    names = daemon_sets(dra_allocated(valid_config()))
    assert [name for name in names if "dra-kubelet-plugin" in name] == [dra_plugin_name(EXPOSED_NODE["name"])]
    assert not [name for name in names if name.startswith("nvidia-device-plugin")]
