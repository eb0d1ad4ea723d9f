"""Hypothesis strategies for pods, ConfigMaps and Secrets: the parts an attacker combines, and the
benign parts platform and tenant pods are made of. Shared by the guard's and the void policy's
property tests; what they reach is judged by tests/support/oracle.py, never by the guard."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from common.names import runtime_class_name

ALLOWED_PATH = "/var/log"
OURS = runtime_class_name("gpu-node-01")
CUDA_IMAGE = "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"

# --- Parts an attacker combines ---

quantities = st.sampled_from(["0", "1", "2", "+1", "+0", "00", "0e3", "1e1", "0.0"])
# gpu.shared and mig-2g are served by no node of the example cluster: phantoms a bound pod keeps.
resources = st.sampled_from(
    [
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-1g.18gb",
        "nvidia.com/mig-2g.35gb",
        "cpu",
        "example.com/fpga",
    ]
)
env_names = st.sampled_from(
    ["NVIDIA_VISIBLE_DEVICES", "CUDA_VERSION", "MODEL", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_GDS", "NVIDIA_NVSWITCH"]
)
env_values = st.sampled_from(
    [
        "all",
        "void",
        "none",
        "",
        "0",
        "void,all",
        "none,all",
        "all,none",
        "enabled",
        "GPU-8a21c3d4-1e2f-4a3b-8c4d-5e6f7a8b9c0d",
    ]
)
env_entries = st.one_of(
    st.builds(lambda n, v: {"name": n, "value": v}, env_names, env_values),
    st.builds(lambda n: {"name": n, "valueFrom": {"configMapKeyRef": {"name": "a", "key": "k"}}}, env_names),
)
prefixes = st.sampled_from([None, "", "N", "NVIDIA_", "NVIDIA_VISIBLE_", "APP_", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_G"])
env_from = st.builds(
    lambda prefix, kind, name: {**({"prefix": prefix} if prefix is not None else {}), kind: {"name": name}},
    prefixes,
    st.sampled_from(["configMapRef", "secretRef"]),
    st.sampled_from(["a", "b"]),
)
mount_paths = st.sampled_from(
    [
        "/data",
        "/var/run",
        "/data/",
        "/data/./x",
        "/var/run/nvidia-container-devices/all",
        "/var//run/nvidia-container-devices/all",
        "/var/run/nvidia-container-devicesall",
        "/var/run/./nvidia-container-devices/x",
        "/var/lib/../run/nvidia-container-devices/GPU-8a21c3d4-1e2f-4a3b-8c4d-5e6f7a8b9c0d",
        "/run/nvidia-container-devices/all",
        "/logs",
    ]
)
host_paths = st.sampled_from(
    [
        ALLOWED_PATH,
        "/dev/null",
        "//dev/null",
        "/dev",
        "/",
        "/var/lib/kubelet/device-plugins",
        "/proc/1/root",
        "/etc/systemd/system/x.service",
    ]
)
capabilities = st.sampled_from(
    [
        "NET_BIND_SERVICE",
        "chown",
        "sys_admin",
        "Sys_Admin",
        "CAP_SYS_ADMIN",
        "cap_sys_admin",
        "ALL",
        "all",
        "NET_ADMIN",
        "SYS_PTRACE",
    ]
)
volume_names = st.sampled_from(["host", "scratch"])
runtime_classes = st.sampled_from(
    [None, OURS, "nvidia", "nvidia-cdi", "nvidia-experimental", "runc", "gvisor", "kata", "no-such-class"]
)
node_names = st.sampled_from([None, None, "gpu-node-01", "gpu-node-02", "gpu-node-03", "cpu-node"])
annotation_keys = st.sampled_from(
    ["cdi.k8s.io/gpu", "nvidia.cdi.k8s.io/pod", "nvidia.cdi.k8s.io/container.c0", "example.com/x"]
)


@st.composite
def containers(draw: st.DrawFn, name: str, ephemeral: bool = False) -> dict[str, Any]:
    built: dict[str, Any] = {"name": name, "image": CUDA_IMAGE}
    if not ephemeral and draw(st.booleans()):
        amount = draw(quantities)
        resource = draw(resources)
        built["resources"] = {"limits": {resource: amount}, "requests": {resource: amount}}
    if draw(st.booleans()):
        built["env"] = draw(st.lists(env_entries, max_size=3))
    if draw(st.integers(0, 3)) == 0:
        built["envFrom"] = draw(st.lists(env_from, max_size=2))
    if draw(st.booleans()):
        mounts = draw(
            st.lists(st.tuples(volume_names, mount_paths, st.booleans()), max_size=2, unique_by=lambda m: m[1])
        )
        built["volumeMounts"] = [{"name": v, "mountPath": p, "readOnly": r} for v, p, r in mounts]
    if draw(st.integers(0, 3)) == 0:
        security: dict[str, Any] = {"privileged": draw(st.booleans())}
        if draw(st.booleans()):
            security["capabilities"] = {"add": draw(st.lists(capabilities, min_size=1, max_size=2))}
        built["securityContext"] = security
    return built


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [draw(containers(f"c{i}")) for i in range(draw(st.integers(1, 3)))],
        "volumes": [
            {"name": "host", "hostPath": {"path": draw(host_paths)}}
            if draw(st.booleans())
            else {"name": "host", "emptyDir": {}},
            {"name": "scratch", "emptyDir": {}},
        ],
    }
    if draw(st.booleans()):
        spec["initContainers"] = [draw(containers(f"i{i}")) for i in range(draw(st.integers(1, 2)))]
    if draw(st.integers(0, 3)) == 0:
        spec["ephemeralContainers"] = [draw(containers("debugger", ephemeral=True))]
    runtime = draw(runtime_classes)
    if runtime:
        spec["runtimeClassName"] = runtime
    node = draw(node_names)
    if node:
        spec["nodeName"] = node
    for flag in ("hostPID", "hostNetwork", "hostIPC"):
        if draw(st.integers(0, 7)) == 0:
            spec[flag] = draw(st.booleans())
    if draw(st.integers(0, 7)) == 0:
        spec["os"] = {"name": draw(st.sampled_from(["linux", "windows"]))}
    if draw(st.integers(0, 5)) == 0:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "any"}]
    metadata: dict[str, Any] = {"name": "p", "namespace": "ml-team"}
    if draw(st.integers(0, 5)) == 0:
        metadata["annotations"] = {draw(annotation_keys): "nvidia.com/gpu=all"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


data_keys = st.sampled_from(["NVIDIA_VISIBLE_DEVICES", "VISIBLE_DEVICES", "DEVICES", "MODEL", "NVIDIA_GDS", "GDS"])
data = st.dictionaries(data_keys, env_values, max_size=2)


# --- Benign parts: what platform and tenant pods are made of ---


@st.composite
def benign_containers(draw: st.DrawFn, name: str, gpu_runtime: bool, ephemeral: bool = False) -> dict[str, Any]:
    built: dict[str, Any] = {"name": name, "image": CUDA_IMAGE}
    wants_gpu = not ephemeral and draw(st.booleans())
    if wants_gpu:
        amount = draw(st.sampled_from(["1", "2", "+1"]))
        resource = draw(st.sampled_from(["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.18gb"]))
        built["resources"] = {"limits": {resource: amount}, "requests": {resource: amount}}
    env = draw(
        st.lists(st.builds(lambda n: {"name": n, "value": "x"}, st.sampled_from(["MODEL", "CUDA_VERSION"])), max_size=2)
    )
    if (gpu_runtime and not wants_gpu) or draw(st.booleans()):
        env.append({"name": "NVIDIA_VISIBLE_DEVICES", "value": draw(st.sampled_from(["void", "none"]))})
    built["env"] = env
    if draw(st.booleans()):
        built["envFrom"] = [{"prefix": draw(st.sampled_from(["APP_", "CFG_"])), "configMapRef": {"name": "a"}}]
    built["volumeMounts"] = [
        {
            "name": "scratch",
            "mountPath": draw(
                st.sampled_from(["/data", "/var/run", "/tmp/", "/var/cache/nginx", "/data/./x", "//srv"])
            ),
        }
    ]
    built["securityContext"] = {
        "capabilities": {"add": draw(st.lists(st.sampled_from(["NET_BIND_SERVICE", "chown", "CAP_KILL"]), max_size=2))}
    }
    return built


@st.composite
def benign_pods(draw: st.DrawFn) -> dict[str, Any]:
    runtime = draw(st.sampled_from([None, OURS, "nvidia", "nvidia-experimental", "runc", "gvisor"]))
    gpu_runtime = runtime in (OURS, "nvidia", "nvidia-experimental")
    spec: dict[str, Any] = {
        "containers": [draw(benign_containers(f"c{i}", gpu_runtime)) for i in range(draw(st.integers(1, 3)))],
        "initContainers": [draw(benign_containers("init", gpu_runtime))],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
    }
    if runtime:
        spec["runtimeClassName"] = runtime
    if draw(st.booleans()):
        spec["nodeSelector"] = {"kubernetes.io/hostname": draw(st.sampled_from(["gpu-node-01", "gpu-node-03"]))}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml-team"}, "spec": spec}
