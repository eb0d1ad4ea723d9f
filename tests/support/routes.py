"""The routes an attacker takes to a device, each with the guard rule that must deny it, and the pods a
platform and its tenants really run, which it must admit. Judged by the rendered policies in a CEL engine
(tests/test_access_guard.py, tests/test_access_guard_claims.py) and by a real API server (tests/real/test_admission.py);
docs/security.md lists the same routes with their sources."""

from __future__ import annotations

from typing import Any

from common.names import DRA_EXTENDED_RESOURCE_PREFIX, runtime_class_name
from tests.support.guard import container, env, pod

OURS = runtime_class_name("gpu-node-01")
DRA = DRA_EXTENDED_RESOURCE_PREFIX
VOID = env("NVIDIA_VISIBLE_DEVICES", "void")


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


def not_a_gpu(resource: str) -> tuple[dict[str, Any], str]:
    """A container asking for one of a resource that is not the device plugin's GPU, under our NVIDIA class."""
    return pod(container(gpus="1", resource=resource), runtimeClassName=OURS), "gpu-runtime-needs-a-request"


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
    # Resources that are not the device plugin's GPUs: no Allocate from it, the image's ENV=all stands. HAMi serves
    # nvidia.com/gpumem; the others are what a match wider than nvidia.com/(gpu|gpu.*|mig-*) would take for GPUs.
    "nvidia-memory-is-no-gpu": not_a_gpu("nvidia.com/gpumem"),
    "gpu-prefix-is-no-gpu": not_a_gpu("nvidia.com/gpux"),
    "mig-without-profile-is-no-gpu": not_a_gpu("nvidia.com/mig"),
    "another-domain-is-no-gpu": not_a_gpu("other-nvidia.com/gpu"),
    "a-domain-without-the-dot-is-no-gpu": not_a_gpu("nvidia-com/gpu"),
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
    # The toolkit's NRI plugin also reads the bare key, for every container (issue 29, 3).
    "nri-cdi-bare-annotation": (
        pod(annotations={"nvidia.cdi.k8s.io": "k8s.device-plugin.nvidia.com/gpu=all"}),
        "cdi-annotations",
    ),
    "cdi-bare-domain-annotation": (pod(annotations={"cdi.k8s.io": "nvidia.com/gpu=all"}), "cdi-annotations"),
    # DRA extended resources (KEP-5004): the scheduler allocates them through the DeviceClass, from any device
    # it selects, with no claim and no quota (issue 29, 1).
    **{
        f"dra-extended-{name}": (built, "dra-extended-resources")
        for name, built in (
            ("gpu-class-limits", pod(container(gpus="1", resource=f"{DRA}gpu.nvidia.com"))),
            (
                "gpu-class-requests-only",
                pod(container(resources={"requests": {f"{DRA}gpu.nvidia.com": "1"}})),
            ),
            ("mig-class", pod(container(gpus="1", resource=f"{DRA}mig.nvidia.com"))),
            ("vfio-class", pod(container(gpus="1", resource=f"{DRA}vfio.gpu.nvidia.com"))),
            ("imex-class", pod(container(gpus="1", resource=f"{DRA}compute-domain-default-channel.nvidia.com"))),
            (
                "native-sidecar",
                pod(
                    container(),
                    initContainers=[
                        container("side", gpus="1", resource=f"{DRA}gpu.nvidia.com", restartPolicy="Always")
                    ],
                ),
            ),
            (
                "under-pool-class-with-void",
                pod(
                    container(gpus="1", resource=f"{DRA}gpu.nvidia.com", **VOID),
                    runtimeClassName="hidden-gpu-pool-shared",
                ),
            ),
            (
                "beside-a-real-gpu",
                pod(
                    container(
                        resources={
                            "limits": {"nvidia.com/gpu": "1", f"{DRA}gpu.nvidia.com": "1"},
                            "requests": {"nvidia.com/gpu": "1", f"{DRA}gpu.nvidia.com": "1"},
                        }
                    ),
                    runtimeClassName=OURS,
                ),
            ),
        )
    },
}


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
    "other-extended-resource": pod(container(gpus="1", resource="example.com/fpga")),
    "lookalike-dra-prefix": pod(container(gpus="1", resource="example.com/deviceclass.resource.kubernetes.io")),
    "hugepages": pod(container(resources={"limits": {"hugepages-2Mi": "2Mi", "memory": "64Mi"}})),
    # The claim itself was judged when it was created (CLAIM_ROUTES): a pod naming one is not a route by itself.
    "pod-with-a-claim": pod(
        container(resources={"claims": [{"name": "gpu"}]}),
        resourceClaims=[{"name": "gpu", "resourceClaimName": "one-gpu"}],
    ),
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


# --- ResourceClaims and ResourceClaimTemplates (resource.k8s.io/v1), under CLAIMS_STACK ---

NIC_CLASS = "nic.example.com"
# The stack's own GPU class for gpu-node-01 (hidden-gpu:dra), named like its RuntimeClass.
GPU_CLASS = OURS
CLAIMS_GUARD = {"allowedDeviceClasses": [NIC_CLASS]}


def claim(*requests: dict[str, Any], template: bool = False) -> dict[str, Any]:
    """A claim, or a claim template, with these device requests."""
    spec = {"devices": {"requests": list(requests)}}
    kind, body = ("ResourceClaimTemplate", {"spec": spec}) if template else ("ResourceClaim", spec)
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"name": "c"}, "spec": body}


def exactly(device_class: str, name: str = "r", **extra: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class, **extra}}


def first_available(*alternatives: dict[str, Any]) -> dict[str, Any]:
    """A request satisfied by the first alternative the allocator can meet; each is {deviceClassName, ...}."""
    return {"name": "r", "firstAvailable": [{"name": f"s{i}", **a} for i, a in enumerate(alternatives)]}


TOLERATE_ALL: dict[str, Any] = {"tolerations": [{"operator": "Exists"}]}

CLAIM_ROUTES: dict[str, tuple[dict[str, Any], str | list[str]]] = {
    "nvidia-gpu-class": (claim(exactly("gpu.nvidia.com")), "claim-device-classes"),
    "nvidia-mig-class": (claim(exactly("mig.nvidia.com")), "claim-device-classes"),
    "nvidia-vfio-class": (claim(exactly("vfio.gpu.nvidia.com")), "claim-device-classes"),
    "nvidia-imex-channel-class": (
        claim(exactly("compute-domain-default-channel.nvidia.com")),
        "claim-device-classes",
    ),
    "another-nodes-lookalike": (claim(exactly("hidden-gpu-gpu-node-02")), "claim-device-classes"),
    "second-request-nvidia": (
        claim(exactly(GPU_CLASS), exactly("gpu.nvidia.com", name="more")),
        "claim-device-classes",
    ),
    "first-available-fallback-nvidia": (
        claim(first_available({"deviceClassName": GPU_CLASS}, {"deviceClassName": "gpu.nvidia.com"})),
        "claim-device-classes",
    ),
    "template-nvidia-class": (claim(exactly("gpu.nvidia.com"), template=True), "claim-device-classes"),
    "template-first-available": (
        claim(first_available({"deviceClassName": "gpu.nvidia.com"}), template=True),
        "claim-device-classes",
    ),
    "admin-access": (claim(exactly(GPU_CLASS, adminAccess=True)), "claim-admin-access"),
    "admin-access-allowed-class": (claim(exactly(NIC_CLASS, adminAccess=True)), "claim-admin-access"),
    "template-admin-access": (claim(exactly(GPU_CLASS, adminAccess=True), template=True), "claim-admin-access"),
    "tolerates-device-taints": (claim(exactly(GPU_CLASS, **TOLERATE_ALL)), "claim-tolerations"),
    "alternative-tolerates": (
        claim(first_available({"deviceClassName": GPU_CLASS, **TOLERATE_ALL})),
        "claim-tolerations",
    ),
    "all-of-the-class": (claim(exactly(GPU_CLASS, allocationMode="All")), "claim-exact-count"),
    "alternative-all-of-the-class": (
        claim(first_available({"deviceClassName": GPU_CLASS, "allocationMode": "All"})),
        "claim-exact-count",
    ),
}

CLAIM_BENIGN: dict[str, dict[str, Any]] = {
    "one-exposed-gpu": claim(exactly(GPU_CLASS)),
    "two-exposed-gpus": claim(exactly(GPU_CLASS, allocationMode="ExactCount", count=2)),
    "narrowed-by-a-selector": claim(
        exactly(GPU_CLASS, selectors=[{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}])
    ),
    "template-one-gpu": claim(exactly(GPU_CLASS), template=True),
    "allowed-nic": claim(exactly(NIC_CLASS)),
    "allowed-nic-all": claim(exactly(NIC_CLASS, allocationMode="All")),
    "alternatives-all-allowed": claim(first_available({"deviceClassName": GPU_CLASS}, {"deviceClassName": NIC_CLASS})),
    "no-requests": claim(),
    # issue 40, 3: null where a list may be (a client that writes every field): a verdict, not a CEL error.
    "requests-null": {**claim(), "spec": {"devices": {"requests": None}}},
    "template-requests-null": {**claim(template=True), "spec": {"spec": {"devices": {"requests": None}}}},
    "devices-null": {**claim(), "spec": {"devices": None}},
    "fields-null": claim(
        {**exactly(GPU_CLASS, tolerations=None, allocationMode=None, adminAccess=None), "firstAvailable": None}
    ),
}
