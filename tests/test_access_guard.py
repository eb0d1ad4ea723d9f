"""The access guard as an attacker tests it: every route of issue 12 denied, however it is spelt;
every benign pod admitted; updates judged by what they add. The rendered policies run in a real
CEL engine (tests/support/guard.py); docs/security.md lists the same routes with their sources."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from common.names import DEFAULT_PLUGIN_NAMESPACE, Token, runtime_class_name
from offline.program import ProgramRun, run_program
from tests.support.guard import (
    TENANT,
    admit,
    container,
    env,
    env_keys_policy,
    plugin_pod,
    pod,
    pod_policy,
    with_ephemeral,
)
from tests.support.objects import only
from tests.support.stacks import changed

OURS = runtime_class_name("gpu-node-01")
VOID = env("NVIDIA_VISIBLE_DEVICES", "void")


def guard(**keys: Any) -> dict[str, Any]:
    return changed(lambda c: c.__setitem__("hidden-gpu:guard", keys))


@pytest.fixture(scope="module")
def policy(run: ProgramRun) -> dict[str, Any]:
    return pod_policy(run)


def rules_denying(policy: dict[str, Any], obj: dict[str, Any], **kwargs: Any) -> list[str]:
    messages = admit(policy, obj, **kwargs)
    assert messages is not None, "the policy did not apply"
    return [message.split(":", 1)[0].removeprefix("hidden-gpu guard, rule ") for message in messages]


def host_path_pod(path: str, mount_path: str = "/host", read_only: bool = True) -> dict[str, Any]:
    mount = {"name": "h", "mountPath": mount_path, "readOnly": read_only}
    return pod(container(volumeMounts=[mount]), volumes=[{"name": "h", "hostPath": {"path": path}}])


def mount_pod(mount_path: str, volume: dict[str, Any] | None = None) -> dict[str, Any]:
    return pod(
        container(volumeMounts=[{"name": "v", "mountPath": mount_path}]),
        volumes=[{"name": "v", **(volume or {"emptyDir": {}})}],
    )


def capability_pod(*caps: str) -> dict[str, Any]:
    return pod(container(securityContext={"capabilities": {"add": list(caps)}}))


GPU_POD = pod(container(gpus="1"), runtimeClassName=OURS)

# Each route of issue 12, and the one rule that must deny it.
ROUTES: dict[str, tuple[dict[str, Any], str | list[str]]] = {
    # Requests that are not requests: no Allocate for 0, the image's ENV=all stands.
    "zero-gpus-our-class": (pod(container(gpus="0"), runtimeClassName=OURS), "gpu-runtime-needs-a-request"),
    "zero-gpus-operator-class-hidden-node": (
        pod(container(gpus="0"), runtimeClassName="nvidia", nodeSelector={"kubernetes.io/hostname": "gpu-node-02"}),
        "gpu-runtime-needs-a-request",
    ),
    "zero-as-0e3": (pod(container(gpus="0e3"), runtimeClassName="nvidia-cdi"), "gpu-runtime-needs-a-request"),
    "zero-as-plus-0": (pod(container(gpus="+0"), runtimeClassName="nvidia-legacy"), "gpu-runtime-needs-a-request"),
    "cpu-quantity-is-no-gpu": (
        pod(container(resources={"limits": {"cpu": "2"}}), runtimeClassName=OURS),
        "gpu-runtime-needs-a-request",
    ),
    # Containers that do not request, in a pod that runs the NVIDIA runtime.
    "sidecar-without-request": (
        pod(container(gpus="1"), container("sidecar"), runtimeClassName=OURS),
        "gpu-runtime-needs-a-request",
    ),
    "request-only-in-init": (
        pod(container(), initContainers=[container("init", gpus="1")], runtimeClassName=OURS),
        "gpu-runtime-needs-a-request",
    ),
    "bare-cuda-version": (
        pod(container(**env("CUDA_VERSION", "12.4")), runtimeClassName=OURS),
        "gpu-runtime-needs-a-request",
    ),
    # Spellings of paths the toolkit cleans and the kubelet does not.
    "double-slash-dev-null": (host_path_pod("//dev/null"), "host-path-volumes"),
    "double-slash-mount-path": (
        host_path_pod("/dev/null", "/var//run/nvidia-container-devices/all"),
        ["host-path-volumes", "device-request-mounts"],
    ),
    "dot-dot-mount-path": (mount_pod("/var/lib/../run/nvidia-container-devices/all"), "mount-paths-normal"),
    "mount-path-double-slash-emptydir": (mount_pod("/var//run/nvidia-container-devices/x"), "device-request-mounts"),
    "mount-path-dot-segments": (mount_pod("//var/./run/.//nvidia-container-devices/x"), "device-request-mounts"),
    "mount-path-relative": (mount_pod("var/run/nvidia-container-devices/x"), "mount-paths-normal"),
    "mount-path-prefix-without-separator": (mount_pod("/var/run/nvidia-container-devicesall"), "device-request-mounts"),
    "mount-path-under-run": (mount_pod("/run/nvidia-container-devices/all"), "device-request-mounts"),
    "mount-path-is-the-directory": (mount_pod("/var/run/nvidia-container-devices"), "device-request-mounts"),
    # Capability names in any case (containerd upper-cases and prefixes CAP_).
    "sys-admin-lower": (capability_pod("sys_admin"), "capabilities"),
    "sys-admin-mixed": (capability_pod("Sys_Admin"), "capabilities"),
    "sys-admin-cap-prefix": (capability_pod("CAP_SYS_ADMIN"), "capabilities"),
    "sys-admin-cap-lower": (capability_pod("cap_sys_admin"), "capabilities"),
    "all-capabilities": (capability_pod("ALL"), "capabilities"),
    "net-admin-not-allowed": (capability_pod("NET_ADMIN"), "capabilities"),
    "privileged": (pod(container(securityContext={"privileged": True})), "privileged"),
    "privileged-init": (
        pod(container(), initContainers=[container("i", securityContext={"privileged": True})]),
        "privileged",
    ),
    # The host, which a deny-list of paths cannot enumerate.
    "kubelet-device-plugins": (host_path_pod("/var/lib/kubelet/device-plugins"), "host-path-volumes"),
    "kubelet-root": (host_path_pod("/var/lib/kubelet"), "host-path-volumes"),
    "containerd-socket": (host_path_pod("/run/containerd/containerd.sock"), "host-path-volumes"),
    "host-root-via-proc": (host_path_pod("/proc/1/root"), "host-path-volumes"),
    "toolkit-config": (host_path_pod("/etc/nvidia-container-runtime"), "host-path-volumes"),
    "cdi-specs": (host_path_pod("/var/run/cdi"), "host-path-volumes"),
    "static-pods": (host_path_pod("/etc/kubernetes/manifests"), "host-path-volumes"),
    "masked-unit-is-dev-null": (host_path_pod("/etc/systemd/system/rescue.service"), "host-path-volumes"),
    "dev": (host_path_pod("/dev"), "host-path-volumes"),
    "root": (host_path_pod("/"), "host-path-volumes"),
    # The environment, by the name the process finally sees.
    "env-all": (pod(container(**env("NVIDIA_VISIBLE_DEVICES", "all"))), "visible-devices-env"),
    "env-uuid-in-gpu-pod": (
        pod(
            container(gpus="1", **env("NVIDIA_VISIBLE_DEVICES", "GPU-8a21c3d4-1e2f-4a3b-8c4d-5e6f7a8b9c0d")),
            runtimeClassName=OURS,
        ),
        "visible-devices-env",
    ),
    "env-void-then-all": (
        pod(container(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void,all"}])),
        "visible-devices-env",
    ),
    "env-value-from": (
        pod(
            container(
                env=[{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "g", "key": "k"}}}]
            )
        ),
        "visible-devices-env",
    ),
    "env-in-init": (
        pod(container(), initContainers=[container("i", **env("NVIDIA_VISIBLE_DEVICES", "0"))]),
        "visible-devices-env",
    ),
    "env-from-prefix-nvidia": (
        pod(container(envFrom=[{"prefix": "NVIDIA_", "configMapRef": {"name": "x"}}])),
        "visible-devices-env-from",
    ),
    "env-from-prefix-whole-name-start": (
        pod(container(envFrom=[{"prefix": "NVIDIA_VISIBLE_", "secretRef": {"name": "x"}}])),
        "visible-devices-env-from",
    ),
    "env-from-prefix-n": (
        pod(container(envFrom=[{"prefix": "N", "configMapRef": {"name": "x"}}])),
        "visible-devices-env-from",
    ),
    "cdi-annotation": (pod(annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}), "cdi-annotations"),
    # The toolkit's NRI plugin reads its own annotations in the same domain (issue 18, 3).
    "nri-cdi-container-annotation": (
        pod(annotations={"nvidia.cdi.k8s.io/container.app": "k8s.device-plugin.nvidia.com/gpu=all"}),
        "cdi-annotations",
    ),
    "nri-cdi-pod-annotation": (
        pod(annotations={"nvidia.cdi.k8s.io/pod": "k8s.device-plugin.nvidia.com/gpu=all"}),
        "cdi-annotations",
    ),
    # nodeName skips the scheduler; the kubelet drops an NVIDIA request its node does not serve, and
    # the image's ENV=all picks every GPU (issue 18, 1 and 2).
    "phantom-resource-bound-by-node-name": (
        pod(
            container(gpus="1", resource="nvidia.com/gpu.shared"),
            runtimeClassName="hidden-gpu-pool-shared",
            nodeName="gpu-node-01",
        ),
        "node-name",
    ),
    "all-hidden-node-bound-by-node-name": (
        pod(container(gpus="1"), container("sidecar", **VOID), runtimeClassName="nvidia", nodeName="gpu-node-02"),
        "node-name",
    ),
    "cpu-pod-bound-by-node-name": (pod(nodeName="gpu-node-02"), "node-name"),
    # A class no list names still runs NVIDIA's runtime (k3s and RKE2 ship nvidia-experimental).
    "unlisted-nvidia-class-zero": (
        pod(container(gpus="0"), runtimeClassName="nvidia-experimental"),
        "gpu-runtime-needs-a-request",
    ),
    "unlisted-nvidia-class-sidecar": (
        pod(container(gpus="1"), container("sidecar"), runtimeClassName="my-gpu-runtime"),
        "gpu-runtime-needs-a-request",
    ),
    # Host namespaces (issue 18, 5).
    "host-pid": (pod(hostPID=True), "host-namespaces"),
    "host-network": (pod(hostNetwork=True), "host-namespaces"),
    "host-ipc": (pod(hostIPC=True), "host-namespaces"),
    # The toolkit's feature variables add node-wide devices (issue 18, 6).
    **{
        f"feature-env-{name.lower()}": (pod(container(gpus="1", **env(name, "enabled")), runtimeClassName=OURS), rule)
        for name, rule in (
            ("NVIDIA_NVSWITCH", "toolkit-feature-env"),
            ("NVIDIA_MOFED", "toolkit-feature-env"),
            ("NVIDIA_GDS", "toolkit-feature-env"),
            ("NVIDIA_GDRCOPY", "toolkit-feature-env"),
            ("NVIDIA_IMEX_CHANNELS", "toolkit-feature-env"),
        )
    },
    "feature-env-from-prefix": (
        pod(container(envFrom=[{"prefix": "NVIDIA_G", "configMapRef": {"name": "x"}}])),
        "visible-devices-env-from",
    ),
    "resource-claims": (
        pod(
            container(resources={"claims": [{"name": "gpu"}]}),
            resourceClaims=[{"name": "gpu", "resourceClaimName": "all-gpus"}],
        ),
        "resource-claims",
    ),
}


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


BENIGN: dict[str, dict[str, Any]] = {
    "cpu-pod": pod(),
    "cuda-image-without-nvidia-runtime": pod(container()),
    "gpu-pod": GPU_POD,
    "gpu-pod-two": pod(container(gpus="2"), runtimeClassName=OURS),
    "time-sliced-shared": pod(container(gpus="1", resource="nvidia.com/gpu.shared"), runtimeClassName=OURS),
    "mig-mixed": pod(container(gpus="1", resource="nvidia.com/mig-1g.18gb"), runtimeClassName=OURS),
    "operator-class-with-request": pod(container(gpus="1"), runtimeClassName="nvidia"),
    "void-sidecar-in-gpu-pod": pod(container(gpus="1"), container("sidecar", **VOID), runtimeClassName=OURS),
    "void-init-in-gpu-pod": pod(container(gpus="1"), initContainers=[container("init", **VOID)], runtimeClassName=OURS),
    "cpu-pod-says-void": pod(container(**VOID)),
    "cpu-pod-says-none": pod(container(**env("NVIDIA_VISIBLE_DEVICES", "none"))),
    "nginx-empty-dir-at-var-run": mount_pod("/var/run"),
    "trailing-slash": mount_pod("/data/"),
    "devices-lookalike": mount_pod("/var/run/nvidia-container-device"),
    "configmap-volume": mount_pod("/etc/app", {"configMap": {"name": "app"}}),
    "harmless-capability": capability_pod("NET_BIND_SERVICE", "chown", "cap_kill"),
    "env-from-other-prefix": pod(container(envFrom=[{"prefix": "APP_", "configMapRef": {"name": "x"}}])),
    "env-from-no-prefix": pod(container(envFrom=[{"configMapRef": {"name": "x"}}])),
    "other-env": pod(container(**env("CUDA_VISIBLE_DEVICES", "0"))),
    "prometheus-annotation": pod(annotations={"prometheus.io/scrape": "true"}),
    "lookalike-annotation-domain": pod(annotations={"example.com/cdi.k8s.io": "x", "notcdi.k8s.io.example/y": "x"}),
    "privileged-false": pod(container(securityContext={"privileged": False})),
    "host-namespaces-false": pod(hostPID=False, hostNetwork=False, hostIPC=False),
    "node-chosen-by-selector": pod(
        container(gpus="1"), runtimeClassName="nvidia", nodeSelector={"kubernetes.io/hostname": "gpu-node-01"}
    ),
    "dot-segment-elsewhere": mount_pod("/data/./cache"),
    "double-slash-elsewhere": mount_pod("/data//cache"),
    "windows-paths": pod(
        container(volumeMounts=[{"name": "v", "mountPath": "C:\\data"}]),
        volumes=[{"name": "v", "emptyDir": {}}],
        os={"name": "windows"},
    ),
}


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


def test_resource_claims_can_be_allowed() -> None:
    allowing = pod_policy(run_program(guard(allowResourceClaims=True), "test"))
    assert admit(allowing, ROUTES["resource-claims"][0]) == []


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
def test_mode_sets_both_bindings(mode: str, actions: list[str]) -> None:
    run = run_program(guard(mode=mode), "test")
    bindings = run.of_type(Token.ADMISSION_BINDING)
    assert len(bindings) == 2 and all(b.inputs["spec"]["validationActions"] == actions for b in bindings)
    assert all(b.parent == only(run.of_type(Token.ACCESS_GUARD)).urn for b in bindings)


def test_policies_match_pods_ephemeral_containers_configmaps_and_secrets(run: ProgramRun) -> None:
    resources = [
        p.inputs["spec"]["matchConstraints"]["resourceRules"][0]["resources"]
        for p in run.of_type(Token.ADMISSION_POLICY)
    ]
    assert sorted(resources) == [["configmaps", "secrets"], ["pods", "pods/ephemeralcontainers"]]
    assert all(p.inputs["spec"]["failurePolicy"] == "Fail" for p in run.of_type(Token.ADMISSION_POLICY))


def test_no_pod_reaches_a_fully_hidden_node_past_the_scheduler(policy: dict[str, Any]) -> None:
    """gpu-node-02 advertises no NVIDIA resource: the scheduler places no pod with a positive request there,
    and binding one by name, which would skip that check, is denied whatever its runtime class."""
    for runtime_class in ("nvidia", "nvidia-cdi", "nvidia-legacy", "nvidia-experimental", OURS):
        to_hidden_node = pod(container(gpus="1"), runtimeClassName=runtime_class, nodeName="gpu-node-02")
        assert rules_denying(policy, to_hidden_node) == ["node-name"]
