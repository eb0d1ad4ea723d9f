"""The CrossGuard policies on what the program runs, called directly with arguments built from rendered objects
(tests/support/policy_pack.py): every stack passes them all; a device plugin, a pinned operand or the DRA kubelet
plugin that is privileged, reads every GPU or runs on more than one node is refused, whatever its image is called;
so are an operator runtime class, a plugin node without its label patch, a type no component creates, an identity
wider than the DRA plugin's, a GPU both a plugin and a DeviceClass serve, and a DeviceClass that selects more than
listed UUIDs. The pack's checks of the access guard are tests/test_policy_guard.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pulumi_policy import StackValidationArgs
from pulumi_policy.policy import PolicyResource

from common.cli import stack_files
from common.names import runtime_class_name
from common.tokens import Token
from offline import render
from offline.program import Declared, run_program
from policy.rules import (
    RESOURCE_VALIDATORS,
    device_class_selects_uuids_only,
    no_operator_runtime_class,
    one_allocator_per_gpu,
    plugin_devices_are_uuids,
    plugin_nodes_have_label_patch,
    plugin_pinned_to_one_node,
    plugin_unprivileged,
)
from tests.support.objects import only, plugins
from tests.support.policy_pack import Collected, policy_resource, resource_args
from tests.support.stacks import EXPOSED, changed, dra_allocated, valid_config, with_mig

STACK_FILES = stack_files()


def violations(validator: Any, resource_type: str, props: dict[str, Any]) -> list[str]:
    found = Collected()
    validator(resource_args(resource_type, props), found)
    return list(found)


def stack_violations(resources: list[PolicyResource]) -> list[str]:
    found = Collected()
    plugin_nodes_have_label_patch(StackValidationArgs(resources), found)
    one_allocator_per_gpu(StackValidationArgs(resources), found)
    return list(found)


@pytest.fixture(scope="module")
def daemonset() -> Declared:
    return only(plugins(run_program(valid_config(), "test")))


def plugin_container(props: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = props["spec"]["template"]["spec"]["containers"][0]
    return container


# The shipped stacks, and the one with every optional child (a DeviceClass among them).
EVERY = [*STACK_FILES, Path(__file__).resolve().parent / "golden" / "Pulumi.every.yaml"]


@pytest.mark.parametrize("stack_file", EVERY, ids=[p.name for p in EVERY])
def test_every_stack_passes_every_policy(stack_file: Path) -> None:
    rendered = render.render(stack_file)
    for resource in rendered.run.kubernetes_objects:
        for _, validator in RESOURCE_VALIDATORS.values():
            assert violations(validator, resource.type, resource.inputs) == [], resource.name
    assert stack_violations([policy_resource(r) for r in rendered.run.kubernetes_objects]) == []


def test_privileged_plugin(daemonset: Declared) -> None:
    assert violations(plugin_unprivileged, daemonset.type, daemonset.inputs) == []
    props = copy.deepcopy(daemonset.inputs)
    plugin_container(props)["securityContext"]["privileged"] = True
    assert violations(plugin_unprivileged, daemonset.type, props) == [
        "device plugin container 'nvidia-device-plugin' is privileged: it would see every GPU"
    ]


def test_sys_admin_only_with_mig(daemonset: Declared) -> None:
    props = copy.deepcopy(daemonset.inputs)
    plugin_container(props)["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]
    assert "adds SYS_ADMIN without a MIG strategy" in violations(plugin_unprivileged, daemonset.type, props)[0]
    mig = next(r for r in run_program(with_mig("mixed"), "test").resources if r.type.endswith("DaemonSet"))
    assert plugin_container(mig.inputs)["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]
    assert violations(plugin_unprivileged, mig.type, mig.inputs) == []


@pytest.mark.parametrize("value", ["all", "0", "0,1", "GPU-5f3c1a2b", "", "none"])
def test_visible_devices_must_be_uuids(daemonset: Declared, value: str) -> None:
    assert violations(plugin_devices_are_uuids, daemonset.type, daemonset.inputs) == []
    props = copy.deepcopy(daemonset.inputs)
    env = plugin_container(props)["env"]
    next(e for e in env if e["name"] == "NVIDIA_VISIBLE_DEVICES")["value"] = value
    assert len(violations(plugin_devices_are_uuids, daemonset.type, props)) == 1


def test_visible_devices_missing(daemonset: Declared) -> None:
    props = copy.deepcopy(daemonset.inputs)
    plugin_container(props)["env"] = [
        e for e in plugin_container(props)["env"] if e["name"] != "NVIDIA_VISIBLE_DEVICES"
    ]
    assert violations(plugin_devices_are_uuids, daemonset.type, props) == [
        "device plugin does not set NVIDIA_VISIBLE_DEVICES: the image's own ENV=all exposes every GPU"
    ]


def test_plugin_pinned_to_one_node(daemonset: Declared) -> None:
    assert violations(plugin_pinned_to_one_node, daemonset.type, daemonset.inputs) == []
    for replaced in (
        {"nodeSelector": {"nvidia.com/gpu.present": "true"}},  # every GPU node
        {"nodeSelector": {"kubernetes.io/hostname": "gpu-node-01"}},  # a label, which need not be the name
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": ["gpu-node-01", "gpu-node-02"]}
                                ]
                            }
                        ]
                    }
                }
            }
        },
    ):
        props = copy.deepcopy(daemonset.inputs)
        del props["spec"]["template"]["spec"]["affinity"]
        props["spec"]["template"]["spec"].update(replaced)
        assert len(violations(plugin_pinned_to_one_node, daemonset.type, props)) == 1, replaced


def test_a_daemonset_that_is_not_a_device_plugin_is_ignored(daemonset: Declared) -> None:
    """A log shipper: another image, another name label, no mount of the kubelet's device-plugin directory."""
    props = copy.deepcopy(daemonset.inputs)
    plugin_container(props)["image"] = "fluent/fluent-bit:3.1"
    props["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] = "fluent-bit"
    pod = props["spec"]["template"]["spec"]
    pod["volumes"] = [v for v in pod.get("volumes", []) if "device-plugins" not in str(v)]
    pod.pop("initContainers", None)  # the plugin's wait, in the plugin's image
    plugin_container(props)["securityContext"]["privileged"] = True
    del props["spec"]["template"]["spec"]["affinity"]
    for _, validator in RESOURCE_VALIDATORS.values():
        assert violations(validator, daemonset.type, props) == []


@pytest.mark.parametrize("operand", ["dcgm-exporter", "gpu-feature-discovery"])
def test_a_pinned_operand_is_held_to_the_plugins_rules(operand: str) -> None:
    """hidden-gpu's GFD and dcgm-exporter read GPUs as the plugin does: privileged, given `all`, or on every node,
    each is refused as a plugin would be."""
    run = run_program(
        changed(lambda c: c["hidden-gpu:nodes"][0].__setitem__("operands", {"gpuFeatureDiscovery": "pinned"})), "test"
    )
    declared = next(d for d in run.of_type(Token.DAEMONSET) if d.name.endswith(operand))
    assert [violations(v, declared.type, declared.inputs) for _, v in RESOURCE_VALIDATORS.values()] == [
        [] for _ in RESOURCE_VALIDATORS
    ]
    props = copy.deepcopy(declared.inputs)
    container = plugin_container(props)
    container["securityContext"]["privileged"] = True
    next(e for e in container["env"] if e["name"] == "NVIDIA_VISIBLE_DEVICES")["value"] = "all"
    del props["spec"]["template"]["spec"]["affinity"]
    assert len(violations(plugin_unprivileged, declared.type, props)) == 1
    assert len(violations(plugin_devices_are_uuids, declared.type, props)) == 1
    assert len(violations(plugin_pinned_to_one_node, declared.type, props)) == 1


@pytest.mark.parametrize("name", ["nvidia", "nvidia-cdi", "nvidia-legacy"])
def test_operator_runtime_class_names(name: str) -> None:
    runtime_class = Token.RUNTIME_CLASS
    assert (
        violations(
            no_operator_runtime_class,
            runtime_class,
            {"metadata": {"name": runtime_class_name("gpu-node-01")}, "handler": "nvidia"},
        )
        == []
    )
    assert violations(no_operator_runtime_class, runtime_class, {"metadata": {"name": name}, "handler": "nvidia"}) == [
        f"RuntimeClass '{name}' is created and owned by the GPU Operator"
    ]


def test_plugin_node_needs_its_label_patch() -> None:
    resources = run_program(valid_config(), "test").kubernetes_objects
    assert stack_violations([policy_resource(r) for r in resources]) == []
    without_patch = [
        policy_resource(r)
        for r in resources
        if not (r.type.endswith("NodePatch") and r.inputs["metadata"]["name"] == "gpu-node-01")
    ]
    assert stack_violations(without_patch) == [
        "node 'gpu-node-01' gets a pinned device plugin but no nvidia.com/gpu.deploy.device-plugin=false patch: "
        "the GPU Operator's all-GPU plugin would run beside it"
    ]
    relabelled = []
    for r in resources:
        props = copy.deepcopy(r.inputs)
        if r.type.endswith("NodePatch"):
            props["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] = "true"
        relabelled.append(policy_resource(r, props))
    assert len(stack_violations(relabelled)) == 1


def test_a_plugin_is_judged_whatever_its_image_is_called(daemonset: Declared) -> None:
    """A mirror's image name, or any other: the label verify selects by (or the kubelet mount) is enough."""
    props = copy.deepcopy(daemonset.inputs)
    container = plugin_container(props)
    container["image"] = "registry.example.com/mirror/nvdp:v0.20.0"
    container["securityContext"] = {"privileged": True}
    assert violations(plugin_unprivileged, Token.DAEMONSET, props) != []
    del props["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
    assert violations(plugin_unprivileged, Token.DAEMONSET, props) != []  # still: it mounts the kubelet's dir


def test_a_type_no_component_creates_is_refused() -> None:
    from policy.rules import only_known_types  # noqa: PLC0415

    role = "kubernetes:rbac.authorization.k8s.io/v1:Role"
    assert violations(only_known_types, role, {}) == [f"{role} is not a type hidden-gpu creates"]
    assert violations(only_known_types, Token.NODE_PATCH, {}) == []
    assert violations(only_known_types, Token.HIDDEN_GPU_NODE, {}) == []


@pytest.fixture(scope="module")
def dra_plugin() -> dict[str, Declared]:
    """A DRA node's pinned kubelet plugin as the program declares it: its DaemonSet, role and binding, by type."""
    resources = run_program(dra_allocated(valid_config()), "test").resources
    return {r.type: r for r in resources if "dra-kubelet-plugin" in str((r.inputs.get("metadata") or {}).get("name"))}


def test_the_dra_plugin_is_held_to_the_plugin_rules(dra_plugin: dict[str, Declared]) -> None:
    """Its DaemonSet passes every rule a device plugin does; privileged, or reading every GPU, it is refused."""
    props = dra_plugin[Token.DAEMONSET].inputs
    for name, (_, validator) in RESOURCE_VALIDATORS.items():
        assert violations(validator, Token.DAEMONSET, props) == [], name
    privileged = copy.deepcopy(props)
    (container,) = privileged["spec"]["template"]["spec"]["containers"]
    container["securityContext"]["privileged"] = True
    container["env"][0]["value"] = "all"
    del privileged["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]  # still: image and mounts
    assert violations(plugin_unprivileged, Token.DAEMONSET, privileged) != []
    assert violations(plugin_devices_are_uuids, Token.DAEMONSET, privileged) != []


def test_no_identity_but_the_dra_plugins(dra_plugin: dict[str, Declared]) -> None:
    """The plugin's own ClusterRole and binding pass; a wider role, another role or another subject is refused."""
    from policy.rules import rbac_only_for_the_dra_plugins as rule  # noqa: PLC0415

    role, binding = dra_plugin[Token.CLUSTER_ROLE].inputs, dra_plugin[Token.CLUSTER_ROLE_BINDING].inputs
    assert violations(rule, Token.CLUSTER_ROLE, role) == []
    assert violations(rule, Token.CLUSTER_ROLE_BINDING, binding) == []
    wider = copy.deepcopy(role)
    wider["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})
    admin = copy.deepcopy(binding)
    admin["roleRef"]["name"] = "cluster-admin"
    tenant = copy.deepcopy(binding)
    tenant["subjects"].append({"kind": "Group", "name": "system:authenticated"})
    assert len(violations(rule, Token.CLUSTER_ROLE, wider)) == 1
    assert len(violations(rule, Token.CLUSTER_ROLE_BINDING, admin)) == 1
    assert len(violations(rule, Token.CLUSTER_ROLE_BINDING, tenant)) == 1


def test_a_gpu_of_the_plugin_in_a_device_class_is_refused() -> None:
    """issue 40, 2: what hidden-gpu:dra rendered beside a plugin node before `allocator`: the plugin advertises the
    exposed GPU and a DeviceClass selects it too. A program that still writes that fails the pack, naming both."""
    plugin = run_program(valid_config(), "test")
    classes = run_program(dra_allocated(valid_config()), "test").of_type(Token.DEVICE_CLASS)
    both = [policy_resource(r) for r in [*plugin.kubernetes_objects, *classes]]
    (found,) = stack_violations(both)
    assert f"GPU {EXPOSED} is served by device plugin 'nvidia-device-plugin-gpu-node-01'" in found, found
    assert "selected by DeviceClass 'hidden-gpu-gpu-node-01'" in found, found
    assert (
        stack_violations(
            [policy_resource(r) for r in run_program(dra_allocated(valid_config()), "test").kubernetes_objects]
        )
        == []
    )


def test_a_device_class_selects_listed_uuids_only() -> None:
    """The claims policy lets tenants claim from the stack's classes: a class of that name that selects more, maps
    nvidia.com/gpu or carries a driver config fails the pack, not only verify after the deploy."""
    (declared,) = run_program(dra_allocated(valid_config()), "test").of_type(Token.DEVICE_CLASS)
    assert violations(device_class_selects_uuids_only, declared.type, declared.inputs) == []
    wide = copy.deepcopy(declared.inputs)
    wide["spec"]["selectors"][0]["cel"]["expression"] = "device.driver == 'gpu.nvidia.com'"
    mapped = copy.deepcopy(declared.inputs)
    mapped["spec"]["extendedResourceName"] = "nvidia.com/gpu"
    (found,) = violations(device_class_selects_uuids_only, declared.type, wide)
    assert "must select listed GPU UUIDs of one driver" in found
    assert violations(device_class_selects_uuids_only, declared.type, mapped) == [
        "DeviceClass sets extendedResourceName: it would reach more than the UUIDs it selects"
    ]
