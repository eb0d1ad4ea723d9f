"""The Pulumi program under Pulumi's mocks: what HiddenGpuNode and friends declare."""

from __future__ import annotations

import gc
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from common.cli import STACKS_DIR
from common.names import (
    DEFAULT_PLUGIN_NAMESPACE,
    DEVICE_PLUGIN_LABEL,
    NODE_LABEL,
    NODE_OUTPUT_KEYS,
    OPERATOR_RUNTIME_CLASSES,
    PROJECT,
    device_plugin_name,
    runtime_class_name,
)
from common.tokens import Token
from offline import render
from offline.program import ProgramRun, run_program
from stack_config import read_stack_file
from tests.support.objects import env_of, only, plugins
from tests.support.stacks import EXPOSED, FULLY_HIDDEN, HIDDEN, changed, cluster_policy_patched, node


def component(run: ProgramRun, node_name: str) -> str:
    return only([r for r in run.of_type(Token.HIDDEN_GPU_NODE) if r.name == node_name]).urn


def test_every_node_gets_the_label_patch(run: ProgramRun) -> None:
    patches = {r.inputs["metadata"]["name"]: r for r in run.of_type(Token.NODE_PATCH)}
    assert set(patches) == {"gpu-node-01", "gpu-node-02"}
    for name, patch in patches.items():
        expected = {
            DEVICE_PLUGIN_LABEL: "false",
            "nvidia.com/gpu.deploy.gpu-feature-discovery": "false",
            "nvidia.com/gpu.deploy.mig-manager": "false",
            "nvidia.com/gpu.deploy.dcgm": "false",
            # The operator's exporter reads every GPU: hidden-gpu's pinned one replaces it where a GPU is exposed.
            "nvidia.com/gpu.deploy.dcgm-exporter": "false",
            NODE_LABEL: name,
        }
        # Every GPU of gpu-node-02 is hidden: the validator's plugin check could never pass there, and no pod
        # there may run NVIDIA's runtime at all.
        if name == "gpu-node-02":
            expected["nvidia.com/gpu.deploy.operator-validator"] = "false"
            expected["nvidia.com/gpu.deploy.container-toolkit"] = "false"
        assert patch.inputs["metadata"]["labels"] == expected
        assert patch.inputs["metadata"]["annotations"]["pulumi.com/patchForce"] == "true"
        assert patch.parent == component(run, name)


def test_plugin_is_pinned_to_the_exposed_gpus_on_its_node_only(run: ProgramRun) -> None:
    daemonset = only(plugins(run))
    pod = daemonset.inputs["spec"]["template"]["spec"]
    container = only_container(pod)
    env = env_of(container)
    assert env["NVIDIA_VISIBLE_DEVICES"] == EXPOSED
    assert env["DEVICE_ID_STRATEGY"] == "uuid"
    assert "nodeSelector" not in pod  # kubernetes.io/hostname need not equal the node's name
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-01"]}]}]
    assert daemonset.inputs["metadata"]["namespace"] == DEFAULT_PLUGIN_NAMESPACE
    assert daemonset.parent == component(run, "gpu-node-01")


def only_container(pod: dict[str, object]) -> dict[str, object]:
    containers = pod["containers"]
    assert isinstance(containers, list) and len(containers) == 1
    container = containers[0]
    assert isinstance(container, dict)
    return container


def test_plugin_is_unprivileged(run: ProgramRun) -> None:
    pod = only(plugins(run)).inputs["spec"]["template"]["spec"]
    security = only_container(pod)["securityContext"]
    assert security == {"privileged": False, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert "hostPID" not in pod and "hostNetwork" not in pod
    assert pod["automountServiceAccountToken"] is False


def test_plugin_has_what_a_device_plugin_pod_needs(run: ProgramRun) -> None:
    pod = only(plugins(run)).inputs["spec"]["template"]["spec"]
    container = only_container(pod)
    assert pod["volumes"] == [
        {"name": "device-plugin", "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}}
    ]
    assert container["volumeMounts"] == [{"name": "device-plugin", "mountPath": "/var/lib/kubelet/device-plugins"}]
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},  # the settings' default
        {"key": "hidden-gpu.io/shared-node", "operator": "Exists", "effect": "NoSchedule"},  # guard.scope's, always
    ]
    assert pod["priorityClassName"] == "system-node-critical"
    resources = container["resources"]
    assert isinstance(resources, dict) and set(resources) == {"requests", "limits"}
    assert pod["runtimeClassName"] == runtime_class_name("gpu-node-01")
    assert container["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"


def test_runtime_class_is_pinned_to_the_node_and_not_the_operators(run: ProgramRun) -> None:
    runtime_class = only(run.of_type(Token.RUNTIME_CLASS))
    assert runtime_class.inputs["handler"] == "nvidia"
    assert runtime_class.inputs["scheduling"]["nodeSelector"] == {NODE_LABEL: "gpu-node-01"}
    assert runtime_class.inputs["metadata"]["name"] not in OPERATOR_RUNTIME_CLASSES
    assert runtime_class.parent == component(run, "gpu-node-01")


def test_plugin_waits_for_the_label_patch(run: ProgramRun) -> None:
    """Created after the patch; Pulumi deletes dependents first, so on destroy it goes first."""
    daemonset = only(plugins(run))
    patch = only([r for r in run.of_type(Token.NODE_PATCH) if r.inputs["metadata"]["name"] == "gpu-node-01"])
    assert patch.urn in daemonset.dependencies


@pytest.mark.parametrize("guard", [{}, {"addVoid": True}], ids=["prod", "add-void"])
def test_no_node_is_hidden_before_its_guard_exists(guard: dict[str, Any]) -> None:
    """issue 29, 4: every node switch waits for every object of the guard (policies, bindings, the void
    policy), so an interrupted first `up` never leaves a hidden node unguarded; the engine reads this graph."""
    declared = run_program(changed(lambda c: c.__setitem__("hidden-gpu:guard", guard)), "test")
    guard_objects = {
        r.urn for r in declared.resources if r.parent is not None and "hidden-gpu:index:AccessGuard" in r.parent
    }
    assert len(guard_objects) == (10 if guard else 8)  # four policies and their bindings; the void policy's two
    patches = declared.of_type(Token.NODE_PATCH)
    assert len(patches) == 2
    for patch in patches:
        assert guard_objects <= set(patch.dependencies), patch.urn


def test_fully_hidden_node_gets_only_the_label_patch(run: ProgramRun) -> None:
    owned = [r for r in run.kubernetes_objects if r.parent == component(run, "gpu-node-02")]
    assert [r.type for r in owned] == [Token.NODE_PATCH]


def test_no_hidden_uuid_appears_in_any_object(run: ProgramRun) -> None:
    everything = json.dumps([r.inputs for r in run.kubernetes_objects])
    assert EXPOSED in everything  # the search itself works
    for uuid in HIDDEN + FULLY_HIDDEN:
        assert uuid not in everything


def test_one_quota_per_namespace(run: ProgramRun) -> None:
    quota = only(run.of_type(Token.RESOURCE_QUOTA))
    assert quota.inputs["metadata"]["namespace"] == "ml-team"
    assert quota.inputs["spec"]["hard"] == {"requests.nvidia.com/gpu": "1"}
    assert only(run.of_type(Token.GPU_QUOTAS)).urn == quota.parent


def test_plugin_namespace_is_created_for_privileged_pod_security(run: ProgramRun) -> None:
    namespace = only(run.of_type(Token.NAMESPACE))
    assert namespace.inputs["metadata"]["name"] == DEFAULT_PLUGIN_NAMESPACE
    assert namespace.inputs["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert namespace.urn in only(plugins(run)).dependencies


def test_existing_namespace_is_reused() -> None:
    config = changed(
        lambda c: c["hidden-gpu:devicePlugin"].update({"namespace": "gpu-system", "createNamespace": False})
    )
    run = run_program(config, "test")
    assert run.of_type(Token.NAMESPACE) == []
    assert only(plugins(run)).inputs["metadata"]["namespace"] == "gpu-system"


def test_every_object_goes_through_the_one_configured_provider(run: ProgramRun) -> None:
    provider = only(run.of_type(Token.PROVIDER))
    assert provider.inputs["context"] == "admin@test"
    for resource in run.kubernetes_objects:
        assert resource.provider.startswith(provider.urn + "::"), resource.name


def test_components_use_the_project_type_tokens(run: ProgramRun) -> None:
    components = {r.type for r in run.resources if not r.is_kubernetes_object and not r.type.startswith("pulumi:")}
    assert components == {
        Token.HIDDEN_GPU_NODE,
        Token.GPU_QUOTAS,
        Token.ACCESS_GUARD,
        Token.PLUGIN_NAMESPACE,
        Token.STACK_RECORD,
    }


def test_outputs_per_node(run: ProgramRun) -> None:
    assert run.outputs["nodes"] == {
        "gpu-node-01": {
            "exposedUuids": [EXPOSED],
            "exposedCount": 1,
            "advertisedCount": 1,
            "hiddenCount": 2,
            "devicePlugin": device_plugin_name("gpu-node-01"),
            "runtimeClass": runtime_class_name("gpu-node-01"),
        },
        "gpu-node-02": {
            "exposedUuids": [],
            "exposedCount": 0,
            "advertisedCount": 0,
            "hiddenCount": 2,
            "devicePlugin": None,
            "runtimeClass": None,
        },
    }


def test_two_exposed_gpus_are_comma_separated() -> None:
    second = HIDDEN[0]
    config = changed(lambda c: node(c).update({"exposedGpus": [EXPOSED, second], "hiddenGpus": HIDDEN[1:]}))
    pod = only(plugins(run_program(config, "test"))).inputs["spec"]["template"]["spec"]
    assert env_of(only_container(pod))["NVIDIA_VISIBLE_DEVICES"] == f"{EXPOSED},{second}"


def test_operand_switches_follow_the_config() -> None:
    operands = {"gpuFeatureDiscovery": "pinned", "dcgmExporter": False, "dcgm": True}
    run = run_program(changed(lambda c: node(c).__setitem__("operands", operands)), "test")
    patch = next(r for r in run.of_type(Token.NODE_PATCH) if r.inputs["metadata"]["name"] == "gpu-node-01")
    # A pinned operand is the operator's off.
    assert patch.inputs["metadata"]["labels"] == {
        DEVICE_PLUGIN_LABEL: "false",
        "nvidia.com/gpu.deploy.gpu-feature-discovery": "false",
        "nvidia.com/gpu.deploy.mig-manager": "false",
        "nvidia.com/gpu.deploy.dcgm-exporter": "false",
        NODE_LABEL: "gpu-node-01",
    }
    assert sorted(d.name for d in run.of_type(Token.DAEMONSET)) == [
        "gpu-node-01-device-plugin",
        "gpu-node-01-gpu-feature-discovery",
    ]


def test_cluster_policy_patch_is_opt_in(run: ProgramRun) -> None:
    assert run.of_type(Token.CLUSTER_POLICY_PATCH) == []
    config = changed(cluster_policy_patched)
    patch = only(run_program(config, "test").of_type(Token.CLUSTER_POLICY_PATCH)).inputs
    assert (patch["apiVersion"], patch["kind"], patch["metadata"]["name"]) == (
        "nvidia.com/v1",
        "ClusterPolicy",
        "cluster-policy",
    )
    assert patch["spec"]["toolkit"]["env"] == [
        {"name": "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED", "value": "false"},
        {"name": "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS", "value": "true"},
    ]
    assert patch["spec"]["devicePlugin"]["env"] == [{"name": "DEVICE_LIST_STRATEGY", "value": "volume-mounts"}]


def test_plugin_pods_get_no_network(run: ProgramRun) -> None:
    policy = next(
        p.inputs for p in run.of_type("kubernetes:networking.k8s.io/v1:NetworkPolicy") if p.name.endswith("-no-network")
    )
    pod_labels = only(plugins(run)).inputs["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert policy["metadata"]["namespace"] == DEFAULT_PLUGIN_NAMESPACE
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in policy["spec"] and "egress" not in policy["spec"]


def test_scan_exceptions_carry_reasons_and_drop_the_digest_one_for_digests(run: ProgramRun) -> None:
    skips = only(plugins(run)).inputs["metadata"]["annotations"]
    assert all("=" in value and len(value.split("=", 1)[1]) > 20 for value in skips.values())
    assert any(value.startswith("CKV_K8S_43=") for value in skips.values())
    image = "nvcr.io/nvidia/k8s-device-plugin:v0.20.0@sha256:" + "a" * 64
    pinned = run_program(changed(lambda c: c["hidden-gpu:devicePlugin"].__setitem__("image", image)), "test")
    skips = only(plugins(pinned)).inputs["metadata"]["annotations"]
    assert not any(value.startswith("CKV_K8S_43=") for value in skips.values())


GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.mark.parametrize(
    ("stack_file", "golden_file"),
    [
        (STACKS_DIR / "Pulumi.prod.yaml", GOLDEN / "prod-urns.txt"),
        (GOLDEN / "Pulumi.every.yaml", GOLDEN / "every-urns.txt"),
    ],
    ids=["prod", "every-component"],
)
def test_no_urn_is_lost_without_an_alias(stack_file: Path, golden_file: Path) -> None:
    """A changed URN is a delete and a create for Pulumi: for a named Kubernetes object that fails with
    AlreadyExists or leaves a window without it. Every URN the stack has today must still be there, or be
    an alias of a resource that is (prod's, and a stack with every optional child; the real tier checks the
    engine agrees)."""
    graph = render.graph(render.render(stack_file))
    current = {r["urn"] for r in graph["resources"]}
    aliases = {alias for r in graph["resources"] for alias in r.get("aliases", [])}
    golden = set(golden_file.read_text().split())
    lost = sorted(golden - current - aliases)
    assert lost == [], f"renamed without an alias (Pulumi would delete and recreate): {lost}"
    assert current == golden, f"URNs changed (with aliases): update {golden_file.name}: {sorted(current ^ golden)}"


def test_the_provider_is_replaced_only_for_another_cluster(run: ProgramRun) -> None:
    """A kubeconfig rotation must not replace the provider: with it every child, the guard included."""
    provider = only(run.of_type(Token.PROVIDER))
    assert provider.inputs["clusterIdentifier"] == "admin@test"
    assert provider.inputs["enableConfigMapMutable"] == "true"  # provider config travels as strings


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_a_preview_with_every_output_unknown_declares_the_same(stack: str) -> None:
    """`pulumi preview` runs the program with outputs unknown (is_dry_run true): nothing may depend on a
    known value to decide what exists, and the exports stay known (they come from config)."""
    config = read_stack_file(STACKS_DIR / f"Pulumi.{stack}.yaml")
    applied, previewed = run_program(config, stack), run_program(config, stack, preview=True)
    assert sorted(r.urn for r in previewed.resources) == sorted(r.urn for r in applied.resources)
    assert previewed.outputs == applied.outputs


def test_pulumis_analyzer_infers_a_schema_for_every_component() -> None:
    """package/ serves every component the program declares, and Pulumi's analyzer (what component_provider_host
    runs) reads each: the stack models reach it as TypedDicts of the stack file's keys (components/stack_types.py)."""
    from pulumi.provider.experimental.analyzer import Analyzer  # noqa: PLC0415

    from offline.component_types import spec_name  # noqa: PLC0415
    from package.__main__ import COMPONENTS  # noqa: PLC0415
    from stack_config.guard_config import GuardConfig  # noqa: PLC0415
    from stack_config.node_config import NodeConfig  # noqa: PLC0415
    from stack_config.plugin_config import DevicePluginConfig  # noqa: PLC0415

    declared = {v.rsplit(":", 1)[1] for k, v in vars(Token).items() if k.isupper() and v.startswith(f"{PROJECT}:")}
    assert {c.__name__ for c in COMPONENTS} == declared

    # The SDK's analyzer opens pulumi-kubernetes' pulumi-plugin.json without closing it (pulumi
    # provider/experimental/analyzer.py, get_dependency_for_type): collected here, its warning with it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        analyzed = Analyzer("hidden-gpu").analyze(list(COMPONENTS))
        gc.collect()
    definitions, types = analyzed["component_definitions"], analyzed["type_definitions"]
    assert set(definitions) == declared
    assert set(definitions["StackRecord"].inputs) == {"stack", "namespace", "exposed"}
    assert set(definitions["GpuQuotas"].inputs) == {"quotas", "deviceClasses"}
    assert set(definitions["GpuDeviceClasses"].inputs) == {"driver", "classes"}
    # A class's name names a resource: plain; its UUIDs and a record's, like a node's, may be Outputs.
    classes = definitions["GpuDeviceClasses"].inputs["classes"]
    assert classes.plain and classes.additional_properties is not None and not classes.additional_properties.plain
    assert not definitions["StackRecord"].inputs["exposed"].plain
    assert definitions["GpuPool"].outputs["runtimeClass"].ref is not None  # a kubernetes resource reference
    node = definitions["HiddenGpuNode"]
    assert set(node.inputs) == {"node", "devicePlugin", "pluginNamespace", "poolClass", "draPluginImage"}
    # The node's entry is plain, its keys that decide which objects exist too (a preview must know them); its name
    # and UUIDs, which only fill objects' fields, may be Outputs (tests/test_composition.py).
    assert node.inputs["node"].plain and node.inputs["devicePlugin"].plain
    node_spec = types[spec_name(NodeConfig)].properties
    assert {key for key, prop in node_spec.items() if not prop.plain} == set(NODE_OUTPUT_KEYS)
    assert node_spec["exposedGpus"].items is not None and not node_spec["exposedGpus"].items.plain
    assert not node.inputs["pluginNamespace"].plain and node.inputs["poolClass"].optional
    assert set(node.outputs) >= {"labelPatch", "devicePlugin", "runtimeClass", "summary"}
    assert set(definitions["AccessGuard"].inputs) == {"guard", "pluginNamespace", "gpuDeviceClasses"}
    assert set(definitions["ToolkitSettings"].outputs) == {"clusterPolicy"}
    # Each spec carries exactly its model's keys, and the keys a stack requires are required there too.
    for model in (NodeConfig, DevicePluginConfig, GuardConfig):
        spec = types[spec_name(model)].properties
        assert set(spec) == {field.alias for field in model.model_fields.values()}
        required = {field.alias for field in model.model_fields.values() if field.is_required()}
        assert {key for key, prop in spec.items() if not prop.optional} == required


def test_a_component_input_is_judged_by_the_stack_models() -> None:
    """What package/'s provider hands a component: numbers arrive as doubles (google.protobuf.Value), and a
    refused value is named by its input path, not as a key of our config namespace."""
    from stack_config.errors import InvalidInputError, validated  # noqa: PLC0415
    from stack_config.node_config import NodeConfig  # noqa: PLC0415

    node = {"name": "gpu-node-01", "exposedGpus": [EXPOSED], "timeSlicing": {"replicas": 2.0}}
    assert validated(NodeConfig, node, ("node",)).time_slicing.replicas == 2
    with pytest.raises(InvalidInputError) as refused:
        validated(NodeConfig, {**node, "timeSlicing": {"replicas": 2.5}, "hidenGpus": []}, ("node",))
    assert str(refused.value).splitlines() == [
        "node.timeSlicing.replicas = 2.5: must be a whole number",
        "node.hidenGpus = []: unknown key; did you mean 'hiddenGpus'?",
    ]
