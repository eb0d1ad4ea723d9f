"""The rendered admission policy, evaluated in a real CEL engine against pods."""

from __future__ import annotations

import copy
from typing import Any

import cel
import pytest

from common.names import DEFAULT_PLUGIN_NAMESPACE, POLICY_NAME, Token, runtime_class_name
from offline.program import ProgramRun, run_program
from tests.support.objects import only
from tests.support.stacks import EXPOSED, HIDDEN, changed


def admit(policy: dict[str, Any], pod: dict[str, Any], namespace: str) -> list[str] | None:
    """None when the policy does not apply; otherwise the messages of the failed validations,
    evaluated as the API server does: match conditions, then variables in order, then validations."""
    request = {"namespace": namespace, "operation": "CREATE", "kind": {"kind": "Pod"}}
    spec = policy["spec"]
    context: dict[str, Any] = {"object": pod, "request": request}
    if not all(cel.evaluate(c["expression"], context) for c in spec.get("matchConditions", [])):
        return None
    context["variables"] = {}
    for variable in spec["variables"]:
        context["variables"][variable["name"]] = cel.evaluate(variable["expression"], context)
    return [v["message"] for v in spec["validations"] if not cel.evaluate(v["expression"], context)]


def pod(containers: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    metadata = spec.pop("metadata", {"name": "p"})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "containers": containers or [{"name": "app", "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"}],
            **spec,
        },
    }


def gpu_container(**extra: Any) -> dict[str, Any]:
    return {
        "name": "train",
        "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
        **extra,
    }


@pytest.fixture(scope="module")
def policy(run: ProgramRun) -> dict[str, Any]:
    return only(run.of_type(Token.ADMISSION_POLICY)).inputs


ALLOWED = {
    "cpu-pod": pod(),
    "gpu-pod-with-our-runtime-class": pod([gpu_container()], runtimeClassName=runtime_class_name("gpu-node-01")),
    "gpu-pod-requests-not-limits": pod(
        [{"name": "a", "image": "x", "resources": {"requests": {"nvidia.com/gpu": "1"}}}], runtimeClassName="nvidia"
    ),
    "ordinary-host-path": pod(volumes=[{"name": "logs", "hostPath": {"path": "/var/log"}}]),
    "devices-prefix-lookalike": pod(volumes=[{"name": "d", "hostPath": {"path": "/devices-cache"}}]),
    "other-env": pod([{"name": "a", "image": "x", "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]}]),
    "non-cdi-annotation": pod(metadata={"name": "p", "annotations": {"prometheus.io/scrape": "true"}}),
    "added-net-admin": pod([{"name": "a", "image": "x", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]),
    "privileged-false": pod([{"name": "a", "image": "x", "securityContext": {"privileged": False}}]),
}

ENV_ROUTE = "containers may not set NVIDIA_VISIBLE_DEVICES"
HOSTPATH_ROUTE = "hostPath volumes may not reach /dev"
MOUNT_ROUTE = "volumes may not be mounted under /var/run/nvidia-container-devices"
DENIED = {
    "env-in-container": (pod([gpu_container(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": HIDDEN[0]}])]), ENV_ROUTE),
    "env-all": (
        pod([{"name": "a", "image": "x", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]),
        ENV_ROUTE,
    ),
    "env-in-init-container": (
        pod(initContainers=[{"name": "i", "image": "x", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]}]),
        ENV_ROUTE,
    ),
    "env-in-ephemeral-container": (
        pod(
            ephemeralContainers=[
                {"name": "debugger", "image": "x", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
            ]
        ),
        ENV_ROUTE,
    ),
    "env-value-from": (
        pod(
            [
                {
                    "name": "a",
                    "image": "x",
                    "env": [
                        {
                            "name": "NVIDIA_VISIBLE_DEVICES",
                            "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "list"}},
                        }
                    ],
                }
            ]
        ),
        ENV_ROUTE,
    ),
    "host-path-dev-null": (pod(volumes=[{"name": "n", "hostPath": {"path": "/dev/null"}}]), HOSTPATH_ROUTE),
    "host-path-dev-nvidia0": (pod(volumes=[{"name": "n", "hostPath": {"path": "/dev/nvidia0"}}]), HOSTPATH_ROUTE),
    "host-path-dev-nvidiactl": (
        pod(volumes=[{"name": "n", "hostPath": {"path": "/dev/nvidiactl", "type": "CharDevice"}}]),
        HOSTPATH_ROUTE,
    ),
    "host-path-all-of-dev": (pod(volumes=[{"name": "n", "hostPath": {"path": "/dev/"}}]), HOSTPATH_ROUTE),
    "host-path-root": (pod(volumes=[{"name": "n", "hostPath": {"path": "/"}}]), HOSTPATH_ROUTE),
    "host-path-dot-dot": (pod(volumes=[{"name": "n", "hostPath": {"path": "/var/lib/../../dev"}}]), HOSTPATH_ROUTE),
    "host-path-device-requests": (
        pod(volumes=[{"name": "n", "hostPath": {"path": "/var/run/nvidia-container-devices"}}]),
        HOSTPATH_ROUTE,
    ),
    "device-request-mount": (
        pod(
            [
                {
                    "name": "a",
                    "image": "x",
                    "volumeMounts": [{"name": "e", "mountPath": f"/var/run/nvidia-container-devices/{HIDDEN[0]}"}],
                }
            ],
            volumes=[{"name": "e", "emptyDir": {}}],
        ),
        MOUNT_ROUTE,
    ),
    "device-request-mount-run": (
        pod(
            [
                {
                    "name": "a",
                    "image": "x",
                    "volumeMounts": [{"name": "e", "mountPath": "/run/nvidia-container-devices/all"}],
                }
            ],
            volumes=[{"name": "e", "emptyDir": {}}],
        ),
        MOUNT_ROUTE,
    ),
    "privileged": (
        pod([{"name": "a", "image": "x", "securityContext": {"privileged": True}}]),
        "privileged containers see every GPU",
    ),
    "privileged-init": (
        pod(initContainers=[{"name": "i", "image": "x", "securityContext": {"privileged": True}}]),
        "privileged containers see every GPU",
    ),
    "sys-admin": (
        pod([{"name": "a", "image": "x", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]),
        "treats SYS_ADMIN as privileged",
    ),
    "cap-sys-admin": (
        pod([{"name": "a", "image": "x", "securityContext": {"capabilities": {"add": ["CAP_SYS_ADMIN"]}}}]),
        "treats SYS_ADMIN as privileged",
    ),
    "cdi-annotation": (
        pod(metadata={"name": "p", "annotations": {"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}}),
        "cdi.k8s.io/ annotations inject devices",
    ),
    "operator-runtime-class-without-request": (pod(runtimeClassName="nvidia"), "must request resources.limits"),
    "cdi-runtime-class-without-request": (pod(runtimeClassName="nvidia-cdi"), "must request resources.limits"),
    "our-runtime-class-without-request": (
        pod(runtimeClassName=runtime_class_name("gpu-node-01")),
        "must request resources.limits",
    ),
}


@pytest.mark.parametrize("name", ALLOWED, ids=list(ALLOWED))
def test_ordinary_pods_are_allowed(policy: dict[str, Any], name: str) -> None:
    assert admit(policy, ALLOWED[name], "ml-team") == []


@pytest.mark.parametrize("name", DENIED, ids=list(DENIED))
def test_escape_route_is_denied_in_a_tenant_namespace(policy: dict[str, Any], name: str) -> None:
    pod_spec, expected = DENIED[name]
    messages = admit(policy, pod_spec, "ml-team")
    assert messages is not None and len(messages) == 1, messages
    assert messages[0].startswith(expected) or expected in messages[0]


def test_every_rule_is_exercised(policy: dict[str, Any]) -> None:
    failing = {tuple(admit(policy, p, "ml-team") or []) for p, _ in DENIED.values()}
    assert {m for messages in failing for m in messages} == {v["message"] for v in policy["spec"]["validations"]}


@pytest.mark.parametrize("namespace", ["kube-system", "gpu-operator", DEFAULT_PLUGIN_NAMESPACE])
def test_exempt_namespaces_are_not_checked(policy: dict[str, Any], namespace: str) -> None:
    assert admit(policy, DENIED["privileged"][0], namespace) is None


def test_custom_exemptions_keep_the_plugin_namespace() -> None:
    run = run_program(changed(lambda c: c.__setitem__("hidden-gpu:guard", {"exemptNamespaces": ["infra"]})), "test")
    policy = only(run.of_type(Token.ADMISSION_POLICY)).inputs
    assert admit(policy, DENIED["privileged"][0], "infra") is None
    assert admit(policy, DENIED["privileged"][0], DEFAULT_PLUGIN_NAMESPACE) is None
    assert admit(policy, DENIED["privileged"][0], "kube-system") is not None


def plugin_pod(run: ProgramRun) -> dict[str, Any]:
    template = only(run.of_type(Token.DAEMONSET)).inputs["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template["metadata"],
        "spec": copy.deepcopy(template["spec"]),
    }


VOLUME_MOUNTS = changed(lambda c: c["hidden-gpu:devicePlugin"].__setitem__("deviceListStrategy", "volume-mounts"))


@pytest.mark.parametrize("config", [None, VOLUME_MOUNTS], ids=["envvar", "volume-mounts"])
def test_the_plugins_own_pod_is_allowed_in_its_namespace(run: ProgramRun, config: dict[str, Any] | None) -> None:
    this_run = run if config is None else run_program(config, "test")
    policy = only(this_run.of_type(Token.ADMISSION_POLICY)).inputs
    assert admit(policy, plugin_pod(this_run), DEFAULT_PLUGIN_NAMESPACE) is None
    # The same pod in a tenant namespace would be refused: the exemption is what lets it run.
    assert admit(policy, plugin_pod(this_run), "ml-team")


@pytest.mark.parametrize(
    ("mode", "actions"), [("enforce", ["Deny"]), ("warn", ["Warn", "Audit"]), ("audit", ["Audit"])]
)
def test_mode_sets_the_binding_actions(mode: str, actions: list[str]) -> None:
    run = run_program(changed(lambda c: c.__setitem__("hidden-gpu:guard", {"mode": mode})), "test")
    binding = only(run.of_type(Token.ADMISSION_BINDING)).inputs
    assert binding["spec"] == {"policyName": POLICY_NAME, "validationActions": actions}
    assert only(run.of_type(Token.ADMISSION_BINDING)).parent == only(run.of_type(Token.ACCESS_GUARD)).urn


def test_policy_matches_pods_and_ephemeral_containers(policy: dict[str, Any]) -> None:
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["pods", "pods/ephemeralcontainers"],
        }
    ]
    assert policy["spec"]["failurePolicy"] == "Fail"


def test_volume_mounts_plugin_requests_exactly_the_exposed_gpus() -> None:
    run = run_program(VOLUME_MOUNTS, "test")
    spec = plugin_pod(run)["spec"]
    container = spec["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["DEVICE_LIST_STRATEGY"] == "volume-mounts"
    assert env["NVIDIA_VISIBLE_DEVICES"] == EXPOSED  # still overrides the image's ENV=all
    requests = [m for m in container["volumeMounts"] if m["mountPath"].startswith("/var/run/nvidia-container-devices/")]
    assert [m["mountPath"] for m in requests] == [f"/var/run/nvidia-container-devices/{EXPOSED}"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[requests[0]["name"]]["hostPath"] == {"path": "/dev/null", "type": "CharDevice"}
    assert "privileged" not in str(container["securityContext"]).replace("'privileged': False", "")
    rendered = str([r.inputs for r in run.kubernetes_objects])
    for hidden in HIDDEN:
        assert hidden not in rendered and hidden.lower() not in rendered
