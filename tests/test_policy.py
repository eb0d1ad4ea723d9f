"""The CrossGuard policies, called directly with arguments built from rendered objects."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pulumi_policy import ResourceValidationArgs, StackValidationArgs
from pulumi_policy.policy import PolicyCustomTimeouts, PolicyResource, PolicyResourceOptions

from common.cli import stack_files
from common.names import Token, runtime_class_name
from offline import render
from offline.program import Declared, run_program
from policy.rules import (
    RESOURCE_VALIDATORS,
    no_operator_runtime_class,
    plugin_devices_are_uuids,
    plugin_nodes_have_label_patch,
    plugin_pinned_to_one_node,
    plugin_unprivileged,
)
from tests.support.stacks import valid_config, with_mig

STACK_FILES = stack_files()
OPTS = PolicyResourceOptions(
    protect=False,
    ignore_changes=[],
    delete_before_replace=None,
    aliases=[],
    custom_timeouts=PolicyCustomTimeouts(0, 0, 0),
    additional_secret_outputs=[],
)


def resource_args(resource_type: str, props: dict[str, Any]) -> ResourceValidationArgs:
    return ResourceValidationArgs(resource_type, props, f"urn:{resource_type}", "r", OPTS, None)


def policy_resource(resource: Declared, props: dict[str, Any] | None = None) -> PolicyResource:
    return PolicyResource(
        resource.type, props or resource.inputs, resource.urn, resource.name, OPTS, None, None, [], {}
    )


class Collected(list[str]):
    def __call__(self, message: str, urn: str | None = None) -> None:
        self.append(message)


def violations(validator: Any, resource_type: str, props: dict[str, Any]) -> list[str]:
    found = Collected()
    validator(resource_args(resource_type, props), found)
    return list(found)


def stack_violations(resources: list[PolicyResource]) -> list[str]:
    found = Collected()
    plugin_nodes_have_label_patch(StackValidationArgs(resources), found)
    return list(found)


@pytest.fixture(scope="module")
def daemonset() -> Declared:
    return next(r for r in run_program(valid_config(), "test").resources if r.type.endswith("DaemonSet"))


def plugin_container(props: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = props["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize("stack_file", STACK_FILES, ids=[p.name for p in STACK_FILES])
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
    props = copy.deepcopy(daemonset.inputs)
    plugin_container(props)["image"] = "fluent/fluent-bit:3.1"
    plugin_container(props)["securityContext"]["privileged"] = True
    del props["spec"]["template"]["spec"]["affinity"]
    for _, validator in RESOURCE_VALIDATORS.values():
        assert violations(validator, daemonset.type, props) == []


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
