"""cluster/declared.py: verify compares the objects around the plugins with desired/, the same functions the components
declare them from; a hand edit that widens a pod, a role or a policy is a mismatch naming the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from cluster.declared import check_declared, declared, key_of
from common.tokens import Token
from offline.program import run_program
from stack_config import parse_project_config, read_stack_file
from tests.support.stacks import changed, node

ROOT = Path(__file__).resolve().parent.parent
STACKS = [
    ROOT / "stacks" / "Pulumi.prod.yaml",
    ROOT / "stacks" / "Pulumi.dev.yaml",
    ROOT / "tests/golden/Pulumi.every.yaml",
]
KINDS = {
    Token.DAEMONSET: "DaemonSet",
    Token.CONFIG_MAP: "ConfigMap",
    Token.SERVICE_ACCOUNT: "ServiceAccount",
    Token.CLUSTER_ROLE: "ClusterRole",
    Token.CLUSTER_ROLE_BINDING: "ClusterRoleBinding",
    Token.NETWORK_POLICY: "NetworkPolicy",
    Token.RUNTIME_CLASS: "RuntimeClass",
}
EVERY = read_stack_file(STACKS[2])


def rendered(config: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """What `up` of the stack leaves, as one LIST per kind reads it back (no kind on the items)."""
    found = {}
    for resource in run_program(config, "every").kubernetes_objects:
        if resource.type in KINDS:
            obj = copy.deepcopy(resource.inputs)
            found[key_of({**obj, "kind": KINDS[resource.type]})] = obj
    return found


@pytest.mark.parametrize("stack_file", STACKS, ids=[p.stem for p in STACKS])
def test_what_the_program_declares_is_what_verify_expects(stack_file: Path) -> None:
    """One source: every object desired/ gives verify is one the program declares, field for field; only the stack
    record's ConfigMap (checked by `stack record`) is the program's alone."""
    config = read_stack_file(stack_file)
    live = rendered(config)
    checks = list(check_declared(parse_project_config(config), live))
    assert [c for c in checks if not c.ok] == []
    expected = {key_of(obj) for objects in declared(parse_project_config(config)).values() for obj in objects}
    assert {k for k in live if not k[2].startswith("hidden-gpu-stack-")} == expected


def mismatches(config: dict[str, Any], live: dict[tuple[str, str, str], dict[str, Any]]) -> dict[str, str]:
    stack = parse_project_config(config)
    return {c.what: c.actual for c in check_declared(stack, live) if not c.ok}


def plugin_of(live: dict[tuple[str, str, str], dict[str, Any]], name: str) -> dict[str, Any]:
    return live[("DaemonSet", "hidden-gpu-system", name)]


def test_a_hand_edit_of_a_pinned_daemonset_is_named_by_its_field() -> None:
    live = rendered(EVERY)
    plugin = plugin_of(live, "nvidia-device-plugin-gpu-node-01")
    pod = plugin["spec"]["template"]["spec"]
    pod["volumes"].append({"name": "dev", "hostPath": {"path": "/dev"}})
    pod["containers"][0]["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]
    pod["containers"][0]["envFrom"] = [{"configMapRef": {"name": "gpus"}}]
    pod["hostPID"] = True
    exporter = plugin_of(live, "dcgm-exporter-gpu-node-01")["spec"]["template"]["spec"]
    exporter["containers"][0]["image"] = "example.com/dcgm-exporter:latest"
    found = mismatches(EVERY, live)
    assert set(found) == {
        "DaemonSet hidden-gpu-system/nvidia-device-plugin-gpu-node-01",
        "DaemonSet hidden-gpu-system/dcgm-exporter-gpu-node-01",
    }
    said = found["DaemonSet hidden-gpu-system/nvidia-device-plugin-gpu-node-01"]
    assert "spec.template.spec.volumes names " in said and ",dev" in said
    assert "spec.template.spec.containers[nvidia-device-plugin].securityContext " in said
    assert "spec.template.spec.containers[nvidia-device-plugin].envFrom " in said
    assert "spec.template.spec.hostPID True" in said
    assert found["DaemonSet hidden-gpu-system/dcgm-exporter-gpu-node-01"] == (
        "spec.template.spec.containers[dcgm-exporter].image example.com/dcgm-exporter:latest"
    )


def test_the_api_servers_defaults_and_canonical_quantities_are_not_differences() -> None:
    live = rendered(EVERY)
    plugin = plugin_of(live, "nvidia-device-plugin-gpu-node-01")
    pod = plugin["spec"]["template"]["spec"]
    pod |= {"dnsPolicy": "ClusterFirst", "restartPolicy": "Always", "hostNetwork": False}
    container = pod["containers"][0]
    container |= {"terminationMessagePath": "/dev/termination-log"}
    container["resources"]["limits"]["cpu"] = "0.5"  # the stack's 500m, as another client may write it
    plugin["metadata"]["labels"]["extra"] = "yes"
    # How the provider applies an object (pulumi.com/patchForce, ...) is not the object's state: a provider or a
    # harness that drops those annotations leaves nothing to report.
    policy = live[("NetworkPolicy", "hidden-gpu-system", "nvidia-device-plugin-no-network")]
    assert policy["metadata"].pop("annotations")
    assert mismatches(EVERY, live) == {}


def test_a_widened_role_an_opened_policy_and_a_changed_config_are_named() -> None:
    live = rendered(EVERY)
    role = live[("ClusterRole", "", "hidden-gpu-nvidia-dra-kubelet-plugin-gpu-node-04")]
    role["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})
    policy = live[("NetworkPolicy", "hidden-gpu-system", "nvidia-device-plugin-no-network")]
    policy["spec"]["egress"] = [{}]
    config = live[("ConfigMap", "hidden-gpu-system", "nvidia-device-plugin-gpu-node-02-config")]
    config["data"]["config.yaml"] = config["data"]["config.yaml"].replace("replicas: 4", "replicas: 40")
    del live[("NetworkPolicy", "hidden-gpu-system", "hidden-gpu-operands-metrics-only")]
    # A class that lands its pods on every node (the nvidia handler where no plugin decides which GPUs they get).
    del live[("RuntimeClass", "", "hidden-gpu-pool-shared")]["scheduling"]["nodeSelector"]
    found = mismatches(EVERY, live)
    assert found.pop("RuntimeClass hidden-gpu-pool-shared") == "scheduling.nodeSelector <unset>"
    assert found["ClusterRole hidden-gpu-nvidia-dra-kubelet-plugin-gpu-node-04"].startswith("rules [{")
    assert found["NetworkPolicy hidden-gpu-system/nvidia-device-plugin-no-network"] == "spec.egress [{}]"
    assert found["ConfigMap hidden-gpu-system/nvidia-device-plugin-gpu-node-02-config"].startswith("data {")
    assert found["NetworkPolicy hidden-gpu-system/hidden-gpu-operands-metrics-only"] == "<missing>"
    assert len(found) == 4


def test_an_adopted_plugin_is_compared_where_it_was_made() -> None:
    """A taken-over DaemonSet stays in its own namespace, with its own selector and container name: verify reads it
    there, as the program declares it."""
    adopt = {"namespace": "kube-system", "name": "nvidia-device-plugin-pinned", "matchLabels": {"name": "pinned"},
             "container": "nvidia-device-plugin-ctr"}  # fmt: skip
    config = changed(lambda c: node(c).__setitem__("adoptDevicePlugin", adopt))
    live = rendered(config)
    assert ("DaemonSet", "kube-system", "nvidia-device-plugin-pinned") in live
    assert mismatches(config, live) == {}
    live[("DaemonSet", "kube-system", "nvidia-device-plugin-pinned")]["spec"]["selector"]["matchLabels"] = {"a": "b"}
    assert mismatches(config, live) == {
        "DaemonSet kube-system/nvidia-device-plugin-pinned": "spec.selector.matchLabels.name <unset>"
    }


def test_what_reaches_a_gpu_beside_the_declared_fields_is_named() -> None:
    """Fields the stack leaves out on purpose: a CDI annotation in a pod template, an init container naming every
    GPU in a DaemonSet that has none, a command in place of the image's own."""
    live = rendered(EVERY)
    exporter = plugin_of(live, "dcgm-exporter-gpu-node-01")["spec"]["template"]
    exporter["metadata"]["annotations"]["cdi.k8s.io/gpu"] = "nvidia.com/gpu=all"
    exporter["spec"]["initContainers"] = [{"name": "all", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]
    plugin = plugin_of(live, "nvidia-device-plugin-gpu-node-01")["spec"]["template"]
    plugin["spec"]["containers"][0]["args"] = ["--device-list-strategy=envvar"]
    plugin["metadata"]["annotations"] = {"kubectl.kubernetes.io/restartedAt": "2026-12-06T00:00:00Z"}  # a restart
    found = mismatches(EVERY, live)
    said = found.pop("DaemonSet hidden-gpu-system/dcgm-exporter-gpu-node-01").split("; ")
    assert said[0] == "spec.template.metadata.annotations.cdi.k8s.io/gpu nvidia.com/gpu=all"
    assert said[1].startswith("spec.template.spec.initContainers [{")
    assert found == {
        "DaemonSet hidden-gpu-system/nvidia-device-plugin-gpu-node-01": (
            "spec.template.spec.containers[nvidia-device-plugin].args ['--device-list-strategy=envvar']"
        )
    }


def test_a_policy_or_binding_beside_the_stacks_that_widens_it_is_named() -> None:
    """NetworkPolicies add up, so another one in the plugin namespace may open what the stack's close; another
    ClusterRoleBinding may give the DRA plugin's account more than its role."""
    live = rendered(EVERY)
    opened = {"metadata": {"name": "allow-all", "namespace": "hidden-gpu-system"}, "spec": {"podSelector": {}}}
    live[("NetworkPolicy", "hidden-gpu-system", "allow-all")] = opened
    account = {"kind": "ServiceAccount", "name": "hidden-gpu-nvidia-dra-kubelet-plugin-gpu-node-04",
               "namespace": "hidden-gpu-system"}  # fmt: skip
    admin = {"metadata": {"name": "dra-admin"}, "roleRef": {"name": "cluster-admin"}, "subjects": [account]}
    live[("ClusterRoleBinding", "", "dra-admin")] = admin
    assert mismatches(EVERY, live) == {
        "other NetworkPolicies in hidden-gpu-system": "allow-all",
        f"other ClusterRoleBindings of ServiceAccount hidden-gpu-system/{account['name']}": "dra-admin",
    }
