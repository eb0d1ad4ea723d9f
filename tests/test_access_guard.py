"""The access guard as an attacker tests it: every route (tests/support/routes.py) denied, however it is spelt;
every benign pod admitted; updates judged by what they add; exemptions by name and label. The rendered policies run
in a real CEL engine (tests/support/guard.py); docs/security.md lists the same routes with their sources. The claims
policy's routes are tests/test_access_guard_claims.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from common.names import DEFAULT_PLUGIN_NAMESPACE, NODE_SWITCHES_POLICY_NAME
from common.tokens import Token
from offline.program import ProgramRun, run_program
from tests.support.guard import (
    TENANT,
    admit,
    container,
    env_keys_policy,
    plugin_pod,
    pod,
    pod_policy,
    rules_denying,
    with_ephemeral,
)
from tests.support.guard_config import guard
from tests.support.objects import only
from tests.support.routes import (
    BENIGN,
    GPU_POD,
    OURS,
    ROUTES,
    VOID,
    capability_pod,
    host_path_pod,
)
from tests.support.stacks import changed, dra_allocated, valid_config


@pytest.fixture(scope="module")
def policy(run: ProgramRun) -> dict[str, Any]:
    return pod_policy(run)


@pytest.mark.parametrize("route", ROUTES, ids=list(ROUTES))
def test_every_route_is_denied(policy: dict[str, Any], route: str) -> None:
    obj, rule = ROUTES[route]
    assert rules_denying(policy, obj) == (rule if isinstance(rule, list) else [rule])


def test_kubectl_debug_on_a_gpu_pod_is_denied_without_void(policy: dict[str, Any]) -> None:
    debugger = {"name": "debugger", "image": "busybox", "targetContainerName": "app"}
    updated = with_ephemeral(GPU_POD, debugger)
    assert rules_denying(policy, updated, old=GPU_POD, sub_resource="ephemeralcontainers") == [
        "gpu-runtime-needs-a-request"
    ]
    voided = with_ephemeral(GPU_POD, {**debugger, **VOID})
    assert admit(policy, voided, old=GPU_POD, sub_resource="ephemeralcontainers") == []


def test_a_configmap_or_secret_carrying_the_key_is_denied(run: ProgramRun) -> None:
    keys = env_keys_policy(run)
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "g"},
        "data": {"NVIDIA_VISIBLE_DEVICES": "all"},
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "g"},
        "data": {"NVIDIA_VISIBLE_DEVICES": "YWxs"},
    }
    for obj in (configmap, secret):
        assert rules_denying(keys, obj) == ["no-visible-devices-key"]
        assert rules_denying(keys, obj, old={**obj, "data": {}}) == ["no-visible-devices-key"]  # added later
    feature = {**configmap, "data": {"NVIDIA_GDS": "enabled"}}
    assert rules_denying(keys, feature) == ["no-visible-devices-key"]
    assert admit(keys, {**configmap, "data": {"MODEL": "llama"}}) == []
    assert admit(keys, configmap, namespace="kube-system") is None


@pytest.mark.parametrize("name", BENIGN, ids=list(BENIGN))
def test_benign_pods_are_admitted(policy: dict[str, Any], name: str) -> None:
    assert admit(policy, BENIGN[name]) == []


def test_every_rule_is_exercised(policy: dict[str, Any]) -> None:
    denying = {name for obj, _ in ROUTES.values() for name in rules_denying(policy, obj)}
    denying.add("host-path-mounts-read-only")  # exercised by the update and allowed-path tests below
    rendered = {
        v["message"].split(":", 1)[0].removeprefix("hidden-gpu guard, rule ") for v in policy["spec"]["validations"]
    }
    assert denying == rendered


def test_every_denial_names_its_rule_and_what_to_do(policy: dict[str, Any]) -> None:
    for validation in policy["spec"]["validations"]:
        message = validation["message"]
        assert message.startswith("hidden-gpu guard, rule ")
        assert any(word in message for word in ("request", "allow", "choose", "normal form", "drop", "set env"))


# --- Judge changes, not history ---

OLD_VIOLATOR = pod(container(securityContext={"privileged": True}), annotations={"cdi.k8s.io/x": "nvidia.com/gpu=0"})


def test_a_debug_container_may_ptrace_and_nothing_more(policy: dict[str, Any]) -> None:
    """kubectl 1.36+ debugs with the `general` profile, which adds SYS_PTRACE: ptrace inside the pod reaches
    nothing an exec into the target could not. Regular containers still may not add it."""
    tracer = {
        "name": "debugger",
        "image": "busybox",
        **VOID,
        "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}},
    }
    updated = with_ephemeral(GPU_POD, tracer)
    assert admit(policy, updated, old=GPU_POD, sub_resource="ephemeralcontainers") == []
    admin = {**tracer, "securityContext": {"capabilities": {"add": ["SYS_PTRACE", "SYS_ADMIN"]}}}
    assert rules_denying(policy, with_ephemeral(GPU_POD, admin), old=GPU_POD, sub_resource="ephemeralcontainers") == [
        "capabilities"
    ]
    assert rules_denying(policy, capability_pod("SYS_PTRACE")) == ["capabilities"]


def test_plain_runtime_classes_are_judged_as_plain() -> None:
    plain = pod_policy(run_program(guard(plainRuntimeClasses=["gvisor"]), "test"))
    assert admit(plain, pod(container(), runtimeClassName="gvisor")) == []
    assert rules_denying(plain, pod(container(), runtimeClassName="kata")) == ["gpu-runtime-needs-a-request"]


def test_a_metadata_only_update_of_an_old_pod_is_admitted(policy: dict[str, Any]) -> None:
    updated = copy.deepcopy(OLD_VIOLATOR)
    updated["metadata"]["finalizers"] = []
    updated["metadata"]["labels"] = {"done": "true"}
    assert admit(policy, updated, old=OLD_VIOLATOR) == []


def test_an_update_that_adds_a_route_is_judged(policy: dict[str, Any]) -> None:
    updated = copy.deepcopy(GPU_POD)
    updated["metadata"]["annotations"] = {"cdi.k8s.io/more": "nvidia.com/gpu=all"}
    assert rules_denying(policy, updated, old=GPU_POD) == ["cdi-annotations"]
    # A pod update may change nothing of a container but its image; the API server refuses any other
    # change before validating admission runs (tests/real checks it), so the guard reads no container.
    swapped = copy.deepcopy(GPU_POD)
    swapped["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    assert admit(policy, swapped, old=GPU_POD) == []


def test_a_benign_debug_container_on_an_old_violator_is_admitted(policy: dict[str, Any]) -> None:
    debugger = {"name": "debugger", "image": "busybox"}
    assert (
        admit(policy, with_ephemeral(OLD_VIOLATOR, debugger), old=OLD_VIOLATOR, sub_resource="ephemeralcontainers")
        == []
    )


def test_a_debug_container_may_not_mount_a_host_path_writable(run: ProgramRun) -> None:
    allowing = pod_policy(run_program(guard(allowedHostPaths=["/var/log"]), "test"))
    base = host_path_pod("/var/log")
    assert admit(allowing, base) == []
    writer = {"name": "debugger", "image": "busybox", "volumeMounts": [{"name": "h", "mountPath": "/logs"}]}
    added = with_ephemeral(base, writer)
    assert rules_denying(allowing, added, old=base, sub_resource="ephemeralcontainers") == [
        "host-path-mounts-read-only"
    ]


# --- Trust, made explicit ---


@pytest.mark.parametrize("namespace", ["kube-system", "gpu-operator", DEFAULT_PLUGIN_NAMESPACE])
def test_exempt_namespaces_are_not_checked(policy: dict[str, Any], namespace: str) -> None:
    assert admit(policy, ROUTES["privileged"][0], namespace) is None


def test_namespaces_can_be_trusted_by_label() -> None:
    labelled = pod_policy(run_program(guard(exemptNamespaceLabels={"hidden-gpu.io/trusted": "true"}), "test"))
    cni = host_path_pod("/opt/cni/bin", read_only=False)
    assert admit(labelled, cni, namespace="calico-system", namespace_labels={"hidden-gpu.io/trusted": "true"}) is None
    assert (
        admit(labelled, cni, namespace="calico-system", namespace_labels={"hidden-gpu.io/trusted": "yes"}) is not None
    )
    assert admit(labelled, cni, namespace=TENANT) is not None


def test_exemptions_live_in_the_namespace_selector_and_cover_every_policy() -> None:
    """issue 29, 2: the API server gives match conditions no namespace, so a label exemption written there
    judged a trusted namespace like a tenant's. The selector is where the API server applies it. Issue 43: the
    name exemptions there too (by the API server's own name label), not in a match condition, whose evaluation
    converts the whole object first."""
    run = run_program(guard(exemptNamespaceLabels={"hidden-gpu.io/trusted": "true"}, addVoid=True), "test")
    policies = [r.inputs for r in (*run.of_type(Token.ADMISSION_POLICY), *run.of_type(Token.MUTATING_POLICY))]
    # The node-switches policy judges Nodes, which are in no namespace: no selector applies to it.
    namespaced = [p for p in policies if p["metadata"]["name"] != NODE_SWITCHES_POLICY_NAME]
    assert len(namespaced) == 4 and len(policies) == 5  # pods, env keys, claims, void; node switches
    for declared in namespaced:
        spec = declared["spec"]
        assert spec["matchConstraints"]["namespaceSelector"] == {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["gpu-operator", "hidden-gpu-system", "kube-system"],
                },
                {"key": "hidden-gpu.io/trusted", "operator": "NotIn", "values": ["true"]},
            ]
        }
        assert not any("namespace" in c["expression"] for c in spec.get("matchConditions") or [])


def test_match_conditions_see_no_namespace_as_on_the_api_server() -> None:
    """The harness itself: a match condition that reads the namespace finds null (a model that filled it in
    said label exemptions in match conditions worked; the real API server said they never did)."""
    probe = {
        "spec": {
            "matchConditions": [{"name": "sees-namespace", "expression": "namespaceObject != null"}],
            "validations": [{"expression": "namespaceObject != null", "message": "no namespace"}],
        }
    }
    assert admit(probe, pod()) is None
    probe["spec"]["matchConditions"] = []
    assert admit(probe, pod()) == []  # validations do see it


def test_allowed_device_classes_open_their_dra_resource_only() -> None:
    allowing = pod_policy(run_program(guard(allowedDeviceClasses=["nic.example.com"]), "test"))
    nic = pod(container(gpus="1", resource="deviceclass.resource.kubernetes.io/nic.example.com"))
    assert admit(allowing, nic) == []
    gpu = ROUTES["dra-extended-gpu-class-limits"][0]
    assert rules_denying(allowing, gpu) == ["dra-extended-resources"]
    assert "guard.allowedDeviceClasses (nic.example.com)" in (admit(allowing, gpu) or [""])[0]
    assert rules_denying(pod_policy(run_program(guard(), "test")), nic) == ["dra-extended-resources"]


def test_the_stacks_own_classes_dra_resource_is_admitted() -> None:
    """issue 40, 3: docs/configuration.md says the stack's classes may be requested; a container asking for
    deviceclass.resource.kubernetes.io/<the stack's class> was denied. The scheduler's claim for it is of that class
    (its selector: the exposed UUIDs) and counted by the class quota. Another class stays denied."""
    run = run_program(dra_allocated(valid_config()), "test")
    own = sorted(r.inputs["metadata"]["name"] for r in run.of_type(Token.DEVICE_CLASS))[0]
    policy = pod_policy(run)
    assert admit(policy, pod(container(gpus="1", resource=f"deviceclass.resource.kubernetes.io/{own}"))) == []
    other = pod(container(gpus="1", resource="deviceclass.resource.kubernetes.io/gpu.nvidia.com"))
    assert rules_denying(policy, other) == ["dra-extended-resources"]
    assert f"the stack's own classes ({own})" in (admit(policy, other) or [""])[0]


def test_custom_exemptions_keep_the_plugin_namespace() -> None:
    custom = pod_policy(run_program(guard(exemptNamespaces=["infra"]), "test"))
    privileged = ROUTES["privileged"][0]
    assert admit(custom, privileged, "infra") is None
    assert admit(custom, privileged, DEFAULT_PLUGIN_NAMESPACE) is None
    assert admit(custom, privileged, "kube-system") is not None


def test_allowed_host_paths_are_exact_and_read_only() -> None:
    allowing = pod_policy(run_program(guard(allowedHostPaths=["/var/log"]), "test"))
    assert admit(allowing, host_path_pod("/var/log")) == []
    assert rules_denying(allowing, host_path_pod("/var/log", read_only=False)) == ["host-path-mounts-read-only"]
    assert rules_denying(allowing, host_path_pod("/var/log/..")) == ["host-path-volumes"]
    assert rules_denying(allowing, host_path_pod("/var")) == ["host-path-volumes"]


def test_nvidia_as_default_runtime_judges_every_pod() -> None:
    everywhere = pod_policy(run_program(guard(nvidiaIsDefaultRuntime=True), "test"))
    assert rules_denying(everywhere, pod(container())) == ["gpu-runtime-needs-a-request"]
    assert admit(everywhere, pod(container(**VOID))) == []
    assert admit(everywhere, pod(container(gpus="1"))) == []


@pytest.mark.parametrize("strategy", ["envvar", "volume-mounts"])
def test_the_plugins_own_pod_is_admitted_in_its_namespace_only(strategy: str) -> None:
    config = changed(
        lambda c: c["hidden-gpu:devicePlugin"].update(
            {"deviceListStrategy": strategy}
            | ({"volumeMountsAcceptedBy": "nodeConfig"} if strategy != "envvar" else {})
        )
    )
    run = run_program(config, "test")
    assert admit(pod_policy(run), plugin_pod(run), DEFAULT_PLUGIN_NAMESPACE) is None
    assert rules_denying(pod_policy(run), plugin_pod(run))  # the exemption is what lets it run


@pytest.mark.parametrize(
    ("mode", "actions"), [("enforce", ["Deny"]), ("warn", ["Warn", "Audit"]), ("audit", ["Audit"])]
)
def test_mode_sets_every_binding(mode: str, actions: list[str]) -> None:
    run = run_program(guard(mode=mode), "test")
    bindings = run.of_type(Token.ADMISSION_BINDING)
    # The node-switches policy denies in every mode: it judges no tenant (desired/node_switches.py).
    by_mode = [b for b in bindings if b.inputs["metadata"]["name"] != NODE_SWITCHES_POLICY_NAME]
    assert len(by_mode) == 3 and all(b.inputs["spec"]["validationActions"] == actions for b in by_mode)
    assert [b.inputs["spec"]["validationActions"] for b in bindings if b not in by_mode] == [["Deny"]]
    assert all(b.parent == only(run.of_type(Token.ACCESS_GUARD)).urn for b in bindings)


def test_policies_match_pods_ephemeral_containers_configmaps_secrets_and_claims(run: ProgramRun) -> None:
    rules = [p.inputs["spec"]["matchConstraints"]["resourceRules"][0] for p in run.of_type(Token.ADMISSION_POLICY)]
    assert sorted((r["apiGroups"], r["operations"], r["resources"]) for r in rules) == [
        ([""], ["CREATE", "UPDATE"], ["configmaps", "secrets"]),
        ([""], ["CREATE", "UPDATE"], ["pods", "pods/ephemeralcontainers"]),
        ([""], ["UPDATE"], ["nodes", "nodes/status"]),
        (
            ["resource.k8s.io"],
            ["CREATE", "UPDATE"],
            ["resourceclaims", "resourceclaimtemplates", "resourceclaims/status"],
        ),
    ]
    assert all(p.inputs["spec"]["failurePolicy"] == "Fail" for p in run.of_type(Token.ADMISSION_POLICY))


def test_no_pod_reaches_a_fully_hidden_node_past_the_scheduler(policy: dict[str, Any]) -> None:
    """gpu-node-02 advertises no NVIDIA resource: the scheduler places no pod with a positive request there,
    and binding one by name, which would skip that check, is denied whatever its runtime class."""
    for runtime_class in ("nvidia", "nvidia-cdi", "nvidia-legacy", "nvidia-experimental", OURS):
        to_hidden_node = pod(container(gpus="1"), runtimeClassName=runtime_class, nodeName="gpu-node-02")
        assert rules_denying(policy, to_hidden_node) == ["node-name"]


@pytest.mark.parametrize("route", ["zero-gpus-our-class", "privileged", "double-slash-dev-null"])
def test_removing_the_last_scheduling_gate_is_judged_as_a_create(policy: dict[str, Any], route: str) -> None:
    """issue 40, 1: a pod held by schedulingGates, made while the guard only warned, was never judged again: its
    UPDATE that removes the gates hands it to the scheduler. That UPDATE is judged whole; one that keeps a gate, or
    a pod that never had one, is not."""
    obj, rule = ROUTES[route]
    gated = copy.deepcopy(obj)
    gated["spec"]["schedulingGates"] = [{"name": "example.com/wait"}, {"name": "example.com/later"}]
    released = copy.deepcopy(obj)
    assert rules_denying(policy, released, old=gated) == (rule if isinstance(rule, list) else [rule])
    one_left = copy.deepcopy(gated)
    one_left["spec"]["schedulingGates"] = one_left["spec"]["schedulingGates"][:1]
    assert admit(policy, one_left, old=gated) == []
    assert admit(policy, released, old=released) == []
