"""The phases of lab/gpu_node_run.py on the GPU host: the pinned plugin under each toolkit setting, the DRA
classes, host.audit beside pods holding the GPU, and a kubelet restart; each returns what it measured."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import yaml

from common.names import NVIDIA_DRA_DRIVER
from e2e.controlplane import ControlPlane, poll
from e2e.host_state import pod_pid
from e2e.node import Node
from e2e.node_dra import DRA_DRIVER, claim_results, dra_devices, grant_dra_driver, using_claim
from e2e.node_gpus import HARDENED, Toolkit
from lab.gpu_host import (
    GPU,
    NODE,
    PLACEHOLDER,
    PLUGIN_NAMESPACE,
    RENDER_FILE,
    ROOT,
    TENANT,
    UUID,
    WAIT_S,
    rendered,
    sh,
)

REGISTRATION = "Got registration request from device plugin"
# host.audit's phase: a pod the plugin gave the GPU, and one that asked for none and reached it all the same.
PODS = {"allocated": ("cuda-holder", 1), "zero": ("cuda-zero", 0)}
SETTINGS = {"defaults": (Toolkit(), "envvar"), "hardened": (HARDENED, "volume-mounts")}


class Run:
    def __init__(self, plane: ControlPlane, node: Node, uuid: str, pod_image: str) -> None:
        self.plane, self.node, self.uuid, self.pod_image = plane, node, uuid, pod_image

    def eventually(self, check: Callable[[], Any], what: str, seconds: float = WAIT_S) -> Any:
        return poll(check, seconds, what, interval=0.3)

    def pod(self, name: str, *, gpus: int | None = None, env: dict[str, str] | None = None, then: str = "exit",
            bound: bool = False) -> dict[str, Any]:  # fmt: skip
        """A pod of the pod image; `then` is what it does after nvidia-smi: exit, hold (pause), cuda (hold the GPU)."""
        container: dict[str, Any] = {
            "name": "smi", "image": self.pod_image, "imagePullPolicy": "Never", "args": [then],
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }  # fmt: skip
        if gpus is not None:
            container["resources"] = {"limits": {GPU: str(gpus)}}
        if env:
            container["env"] = [{"name": k, "value": v} for k, v in env.items()]
        spec: dict[str, Any] = {"runtimeClassName": f"hidden-gpu-{NODE}", "restartPolicy": "Never",
                                "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                                "containers": [container]}  # fmt: skip
        if bound:
            spec["nodeName"] = NODE  # past the scheduler: the kubelet's own admission decides
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": TENANT}, "spec": spec}

    def case(self, pod: dict[str, Any], *, expect_refusal: bool = False) -> dict[str, Any]:
        started = time.monotonic()
        self.plane.create(pod)
        return self.view(pod, started, expect_refusal=expect_refusal)

    def view(self, pod: dict[str, Any], started: float, *, expect_refusal: bool = False) -> dict[str, Any]:
        """What the created pod saw, once it has printed it (or failed)."""
        name = pod["metadata"]["name"]

        def finished() -> dict[str, Any] | None:
            current = self.plane.request("GET", f"/api/v1/namespaces/{TENANT}/pods/{name}")
            phase = current["status"].get("phase")
            lines = self.node.logs(TENANT, name) if phase in ("Running", "Succeeded", "Failed") else []
            if phase == "Failed" or "done" in lines:
                return {"pod": current, "lines": lines}
            return None

        result = self.eventually(finished, f"pod {name} finished", 30 if expect_refusal else WAIT_S)
        current, lines = result["pod"], result["lines"]
        smi = [line.removeprefix("smi ") for line in lines if line.startswith("smi ")]
        seen = sorted(set(UUID.findall("\n".join(smi))) | {ln.split()[1] for ln in lines if ln.startswith("cdi-file ")})
        entry = self.checkpoint_entry(current)
        return {
            "request": pod["spec"]["containers"][0].get("resources", {}).get("limits", {}),
            "env": {e["name"]: e["value"] for e in pod["spec"]["containers"][0].get("env", [])},
            "phase": current["status"].get("phase"),
            "reason": current["status"].get("reason"),
            "message": current["status"].get("message"),
            "seen": seen,
            "sees_exactly_allocated": seen == sorted(entry.get("DeviceIDs", [])) if entry else None,
            "lines": lines,
            "allocated": sorted(entry.get("DeviceIDs", [])) if entry else [],
            "alloc_response": decode_alloc(entry["AllocResp"]) if entry else None,
            "seconds": round(time.monotonic() - started, 2),
        }

    def checkpoint_entry(self, pod: dict[str, Any]) -> dict[str, Any]:
        for entry in self.node.checkpoint().get("PodDeviceEntries") or []:
            if entry["PodUID"] == pod["metadata"]["uid"] and entry["ResourceName"] == GPU:
                ids = entry["DeviceIDs"]
                flat = [i for group in ids.values() for i in group] if isinstance(ids, dict) else ids
                return {"DeviceIDs": flat, "AllocResp": entry["AllocResp"]}
        return {}

    def delete_pods(self) -> None:
        self.plane.request("DELETE", f"/api/v1/namespaces/{TENANT}/pods")
        self.eventually(lambda: not self.plane.request("GET", f"/api/v1/namespaces/{TENANT}/pods")["items"],
                        "tenant pods deleted")  # fmt: skip

    def plugin_pod(self, strategy: str) -> dict[str, Any]:
        pods = self.plane.request("GET", f"/api/v1/namespaces/{PLUGIN_NAMESPACE}/pods")["items"]
        for pod in pods:
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
            running = pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")
            if env.get("DEVICE_LIST_STRATEGY") == strategy and running:
                return dict(pod)
        return {}


def plugin_process(names: tuple[str, ...]) -> dict[str, str]:
    """/proc/<pid>/status of the plugin's process, as the host sees it: what runc applied."""
    for proc in Path("/proc").iterdir():
        with suppress(OSError):
            if (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace") in names:
                lines = (proc / "status").read_text().splitlines()
                status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
                return {k: status[k].strip() for k in ("Seccomp", "NoNewPrivs", "CapEff", "CapBnd", "Uid")}
    return {}


def decode_alloc(encoded: str) -> dict[str, Any]:
    """A checkpointed ContainerAllocateResponse (k8s.io/kubelet v0.36.3 pkg/apis/deviceplugin/v1beta1/api.proto:
    177-188): envs = 1, mounts = 2 (container_path, host_path, read_only), devices = 3, annotations = 4,
    cdi_devices = 5."""

    def fields(data: bytes) -> list[tuple[int, Any]]:
        out: list[tuple[int, Any]] = []
        i = 0
        while i < len(data):
            key, i = varint(data, i)
            number, wire = key >> 3, key & 7
            value: int | bytes
            if wire == 0:
                value, i = varint(data, i)
            elif wire == 2:
                length, i = varint(data, i)
                value, i = data[i : i + length], i + length
            else:
                raise ValueError(f"wire type {wire}")
            out.append((number, value))
        return out

    def varint(data: bytes, i: int) -> tuple[int, int]:
        shift = result = 0
        while True:
            byte = data[i]
            result, i, shift = result | (byte & 0x7F) << shift, i + 1, shift + 7
            if not byte & 0x80:
                return result, i

    def text(message: bytes) -> dict[int, Any]:
        return {n: v.decode(errors="replace") if isinstance(v, bytes) else v for n, v in fields(message)}

    result: dict[str, Any] = {"envs": {}, "mounts": [], "devices": [], "annotations": {}, "cdi_devices": []}
    for number, value in fields(base64.b64decode(encoded)):
        part = text(value)
        if number in (1, 4):
            result["envs" if number == 1 else "annotations"][part.get(1, "")] = part.get(2, "")
        elif number == 2:
            result["mounts"].append(
                {"container_path": part.get(1), "host_path": part.get(2), "read_only": bool(part.get(3))}
            )
        elif number == 3:
            result["devices"].append(
                {"container_path": part.get(1), "host_path": part.get(2), "permissions": part.get(3)}
            )
        elif number == 5:
            result["cdi_devices"].append(part.get(1))
    return result


def setting_run(run: Run, carry: Path, name: str, plugin_image: str, plugin_names: tuple[str, ...]) -> dict[str, Any]:
    toolkit, strategy = SETTINGS[name]
    run.node.toolkit(toolkit)
    out: dict[str, Any] = {"toolkit": {"accept-nvidia-visible-devices-envvar-when-unprivileged":
                                       toolkit.envvar_when_unprivileged,
                                       "accept-nvidia-visible-devices-as-volume-mounts": toolkit.volume_mounts},
                           "strategy": strategy}  # fmt: skip
    started = time.monotonic()
    for obj in rendered(carry, strategy, run.uuid, plugin_image):
        run.plane.apply(obj, manager="hidden-gpu")
    pod = run.eventually(lambda: run.plugin_pod(strategy), f"the {strategy} plugin pod Running")
    out["plugin_running_s"] = round(time.monotonic() - started, 2)
    try:
        run.eventually(
            lambda: run.node.checkpoint().get("RegisteredDevices", {}).get(GPU) == [run.uuid] and
            run.node.allocatable() == 1, "the plugin registered the GPU", 60)  # fmt: skip
        out["plugin_registered_s"] = round(time.monotonic() - started, 2)
    except RuntimeError as error:  # measure the routes that need no plugin all the same
        out["plugin_registered_s"], out["plugin_error"] = None, str(error)[-1000:]
    (container,) = pod["spec"]["containers"]
    out["plugin"] = {
        "image": container["image"],
        "env": {e["name"]: e.get("value") for e in container.get("env", [])},
        "securityContext": container.get("securityContext"),
        "podSecurityContext": pod["spec"].get("securityContext"),
        "volumeMounts": container.get("volumeMounts"),
        "runtimeClassName": pod["spec"].get("runtimeClassName"),
        "process": plugin_process(plugin_names),
        "RegisteredDevices": run.node.checkpoint().get("RegisteredDevices"),
        "node_capacity": run.node.node()["status"]["capacity"].get(GPU),
        "node_allocatable": run.node.node()["status"]["allocatable"].get(GPU),
        "log": run.node.logs(PLUGIN_NAMESPACE, pod["metadata"]["name"])[-40:],
    }
    cases: dict[str, Any] = {}
    if out["plugin_registered_s"] is not None:
        cases["allocated"] = run.case(run.pod("one-gpu", gpus=1, then="hold"))
        cases["second"] = run.case(run.pod("one-too-many", gpus=1, bound=True), expect_refusal=True)
        run.delete_pods()
    cases["zero"] = run.case(run.pod("zero-gpus", gpus=0))
    cases["env-uuid"] = run.case(run.pod("env-uuid", env={"NVIDIA_VISIBLE_DEVICES": run.uuid}))
    cases["void"] = run.case(run.pod("env-void", env={"NVIDIA_VISIBLE_DEVICES": "void"}))
    run.delete_pods()
    out["cases"] = cases
    return out


def dra_run(run: Run, carry: Path) -> dict[str, Any]:
    """One claim through the kubelet's DRA manager and containerd's CDI injection of the host's own spec. The stand-in
    for NVIDIA's DRA kubelet plugin (e2e/go/dra) publishes the host's GPU; a tenant's claim of the stack's DeviceClass
    stays unallocated while the stack hides the GPU (the class selects other UUIDs), and once the stack exposes it
    (the same class applied again) the scheduler allocates it and the pod's nvidia-smi sees the GPU. The pod runs
    under the default runtime, runc: containerd injects the claim's devices itself."""
    plane, node = run.plane, run.node
    grant_dra_driver(plane)
    node.start_dra_plugin(plane.kubeconfig(DRA_DRIVER), NVIDIA_DRA_DRIVER, [run.uuid])
    devices = run.eventually(lambda: dra_devices(plane, NODE, NVIDIA_DRA_DRIVER), "the driver's ResourceSlice")
    out: dict[str, Any] = {"published": devices}

    def apply_class(variant: str) -> str:
        (device_class,) = [o for o in rendered(carry, variant, run.uuid, "") if o["kind"] == "DeviceClass"]
        plane.apply(device_class, manager="hidden-gpu")
        out[f"class_{variant}"] = device_class["spec"]["selectors"]
        return str(device_class["metadata"]["name"])

    def allocated() -> list[str]:
        return [devices.get(r["device"], r["device"]) for r in claim_results(plane, TENANT, "gpu")]

    def unschedulable() -> list[dict[str, Any]]:
        current = plane.request("GET", f"/api/v1/namespaces/{TENANT}/pods/dra-claim")
        conditions = current["status"].get("conditions", [])
        return [c for c in conditions if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"]

    class_name = apply_class("dra-hidden")
    request = {"name": "gpu", "exactly": {"deviceClassName": class_name}}
    metadata = {"name": "gpu", "namespace": TENANT}
    plane.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": metadata,
                  "spec": {"devices": {"requests": [request]}}})  # fmt: skip
    pod = using_claim(run.pod("dra-claim"), "gpu")
    started = time.monotonic()
    plane.create(pod)
    scheduled = run.eventually(unschedulable, "the claim's pod unschedulable while the stack hides the GPU")
    time.sleep(10)  # and still so after the scheduler's retries
    out["while_hidden"] = {"allocated": allocated(), "scheduled": scheduled, "still": unschedulable()}
    if out["while_hidden"]["allocated"] or not out["while_hidden"]["still"]:
        raise RuntimeError(f"a class of a stack that hides the GPU let the claim through: {out['while_hidden']}")
    apply_class("dra")
    out["while_exposed"] = run.view(pod, started) | {"allocated": allocated()}
    run.delete_pods()
    node.stop_dra_plugin()
    return out


def audit_run(run: Run, carry: Path, site: Path | None, rehearse: bool) -> dict[str, Any]:
    """host.audit as an operator runs it on this host: NVML (a host record when rehearsed), the real kubelet's
    PodResources socket, the pods' cgroups and log directories. Two pods hold the GPU with a CUDA context under the
    toolkit's defaults and no guard: one the plugin allocated it to, one that asked for zero GPUs and reached it through
    the image's NVIDIA_VISIBLE_DEVICES=all. Against the stack that exposes the GPU the audit should name the second
    (a GPU the kubelet did not allocate to it); against the stack that hides it, both (a hidden GPU)."""
    pods = {case: run.pod(name, gpus=gpus, then="cuda") for case, (name, gpus) in PODS.items()}
    for pod in pods.values():
        run.plane.create(pod)
    out: dict[str, Any] = {}
    for case, pod in pods.items():
        name = pod["metadata"]["name"]

        def holding(name: str = name) -> list[str] | None:
            return [line for line in run.node.logs(TENANT, name) if line.startswith("hold")] or None

        lines = run.eventually(holding, f"pod {name} holding the GPU")
        current = run.plane.request("GET", f"/api/v1/namespaces/{TENANT}/pods/{name}")
        out[case] = {"hold": lines, "pid": pod_pid(current["metadata"]["uid"], b"/hold"),
                     "allocated": run.checkpoint_entry(current).get("DeviceIDs", [])}  # fmt: skip
    if not rehearse:
        query = sh("nvidia-smi", "--query-compute-apps=pid,gpu_uuid,process_name", "--format=csv,noheader")
        out["nvidia-smi compute apps"] = query.stdout.splitlines() or query.stderr[-500:]
    data = json.loads((carry / RENDER_FILE).read_text())
    tmp = Path(tempfile.mkdtemp(prefix="hidden-gpu-audit-"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (site, ROOT) if p)}
    for stack_name, variant in (("exposed", "envvar"), ("hidden", "dra-hidden")):
        stack_file = tmp / f"Pulumi.{stack_name}.yaml"
        config = json.loads(json.dumps(data["stacks"][variant]).replace(PLACEHOLDER, run.uuid))
        stack_file.write_text(yaml.safe_dump({"config": config}, sort_keys=False))
        command = [sys.executable, "-m", "host.audit", "--stack-file", str(stack_file), "--node", NODE, "--json",
                   *run.node.audit_sources(tmp)]  # fmt: skip
        if rehearse:  # no NVML here: the host record says the GPU runs both holders
            record = tmp / "record.json"
            pids = [{"pid": out[case]["pid"]} for case in pods]
            record.write_text(json.dumps([{"uuid": run.uuid, "processes": pids}]))
            command += ["--record", str(record)]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
        try:
            report: Any = json.loads(done.stdout)
        except ValueError:
            report = done.stdout[-2000:]
        out[f"audit {stack_name}"] = {"stack": variant, "rc": done.returncode, "report": report,
                                      "stderr": done.stderr[-2000:]}  # fmt: skip
    shutil.rmtree(tmp, ignore_errors=True)
    run.delete_pods()
    return out


def restart_run(run: Run, strategy: str) -> dict[str, Any]:
    """NVIDIA's plugin across a kubelet restart (an upgrade, a reinstall): the kubelet comes back with an empty
    registry and kubelet.sock made anew, and the plugin must see that and register again on its own, its pod left
    running. Then two one-GPU pods: one at once, one once the first has its answer. The first can be refused: the
    checkpoint may still hold a deleted pod's GPU, and the device manager drops such entries only once all pod sources
    are ready (UpdateAllocatedDevices, pkg/kubelet/cm/devicemanager/manager.go:557-564 of v1.36.3)."""
    before = run.plugin_pod(strategy)
    live = {p["metadata"]["uid"] for p in run.plane.request("GET", "/api/v1/pods")["items"]}
    entries = run.node.checkpoint().get("PodDeviceEntries") or []
    out: dict[str, Any] = {"checkpoint_before": [{"pod": e["PodUID"], "resource": e["ResourceName"],
                                                  "pod_exists": e["PodUID"] in live} for e in entries]}  # fmt: skip
    logged = len(run.node.log("kubelet"))
    started = time.monotonic()
    run.node.restart_kubelet()

    def registered() -> bool:
        # The new kubelet's own line for a plugin's Register call (pkg/kubelet/cm/devicemanager/plugin/v1beta1/
        # server.go:161 of v1.36.3): the node's status and the checkpoint still show the old registration until then.
        again = REGISTRATION in run.node.log("kubelet")[logged:]
        return again and run.node.checkpoint().get("RegisteredDevices", {}).get(GPU) == [run.uuid]

    run.eventually(registered, "NVIDIA's plugin registered again after the kubelet restart", 60)
    out["registered_s"] = round(time.monotonic() - started, 2)
    after = run.plugin_pod(strategy)
    out["plugin_pod"] = {
        "same": after.get("metadata", {}).get("uid") == before["metadata"]["uid"],
        "restartCount": [s.get("restartCount") for s in after.get("status", {}).get("containerStatuses", [])],
        "log": run.node.logs(PLUGIN_NAMESPACE, before["metadata"]["name"])[-12:],
    }
    out["at_once"] = run.case(run.pod("after-restart", gpus=1), expect_refusal=True)
    run.delete_pods()
    out["then"] = run.case(run.pod("after-restart-then", gpus=1))
    out["then"]["after_restart_s"] = round(time.monotonic() - started, 2)
    run.delete_pods()
    return out
