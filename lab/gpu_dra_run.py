"""NVIDIA's DRA kubelet plugin, pinned as hidden-gpu renders it, on a real GPU host (issue 41): the node of
lab/gpu_node_run.py (control plane, kubelet, containerd, runc, NVIDIA's runtime in CDI mode over the host's spec),
`allocator: dra`, and NVIDIA's `gpu-kubelet-plugin` v0.4.1 from ../shared/bin in the rendered DaemonSet. Writes
OUT/gpu-host-dra-plugin.json (docs/measurements/) and OUT/logs.tar.gz.

    python -m lab.gpu_dra_run prepare             # here: the node set (lab.gpu_node_run prepare), render, the xz
    python3 -m lab.gpu_dra_run run --out "$OUT"   # on the GPU host, as root

Three phases, each read from the API and from the plugin's own log (its enumeration lines):
- exposed: the stack exposes the host's GPU; the slice lists exactly its UUID, and a claim of the stack's class runs
  a pod whose nvidia-smi -L shows exactly it;
- hidden: the stack hides it (the DaemonSet is gone, as a hidden node runs none); no slice lists a device, and the
  UUID is in no object of any listable resource of the API server;
- privileged (the control): the same DaemonSet as NVIDIA's chart runs it (privileged, NVIDIA_VISIBLE_DEVICES=void):
  it publishes the GPU.

The DaemonSet's changes, as in tests/node: its image (a local archive of NVIDIA's binary, NVIDIA's image's
variables, and the toolkit's nvidia-cdi-hook at /usr/bin, which the plugin copies beside its socket) and, with no
Service network here, the host's network with the API server's address.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import lzma
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.names import DEFAULT_PLUGIN_NAMESPACE, DRA_PLUGIN_NAME, NVIDIA_DRA_DRIVER, PLUGIN_NAME_LABEL
from e2e import images
from e2e.controlplane import ControlPlane, naming
from e2e.images import Image
from e2e.node import Node
from e2e.node_dra import claim_results, dra_devices, on_host_network, using_claim
from lab.gpu_device import collect_logs, device_main, device_run
from lab.gpu_host import (
    NODE,
    PLACEHOLDER,
    SITE,
    TENANT,
    cdi_writer,
    host_facts,
    libraries,
    nvml,
    pod_image,
    sh,
    unpack_nodeset,
    unpack_site,
)
from lab.gpu_node_phases import Run
from lab.gpu_pack import GPU_CARRY, NODESET_FILE

CARRY = GPU_CARRY.parent / "dra"
PLUGIN_XZ = "nvidia-dra-gpu-kubelet-plugin-v0.4.1.xz"
PLUGIN_XZ_SHA256 = "e61c0faa0aa133733a25b8c2175989361e5331af4b928af9ba40e690827026c9"  # ../shared/bin/README.md
PLUGIN_SHA256 = "1ca0359e0e299c8f0b29315c9991e369d2b1e56ac0c02829297e60880c93acdf"
SHARED_PLUGIN = Path(__file__).resolve().parents[2] / "shared" / "bin" / PLUGIN_XZ
RENDER_FILE = "render-dra.json"
IMAGE = "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.1"  # the render's default, kept by name
WAIT_S = 120.0
DEADLINE_S = 540


# The device machine's driver layout (NVML in /usr/local/nvidia/lib64, nvidia-smi in .../bin, as the host's CDI spec
# names them): the stack says so as a platform with that layout would. `run` checks it against the host's spec.
DRIVER_ROOT = "/usr/local/nvidia"


def stack(exposed: bool) -> dict[str, Any]:
    gpus = (
        {"exposedGpus": [PLACEHOLDER], "hiddenGpus": []}
        if exposed
        else {"exposedGpus": [], "hiddenGpus": [PLACEHOLDER]}
    )
    return {
        "kubernetes:context": "admin@e2e",
        "pulumi:disable-default-providers": ["kubernetes"],
        "hidden-gpu:nodes": [{"name": NODE, "allocator": "dra", **gpus}],
        "hidden-gpu:devicePlugin": {"nvidiaDriverRoot": DRIVER_ROOT},
        "hidden-gpu:dra": {},
    }


def prepare(plugin_xz: Path) -> int:
    from lab import gpu_node_prepare  # noqa: PLC0415 (prepare needs Go and the render; `run` does not)
    from offline.render import render  # noqa: PLC0415
    from tests.support.stacks import write_stack  # noqa: PLC0415

    if (code := gpu_node_prepare.prepare(gpu_node_prepare.SHARED_PLUGIN)) != 0:
        return code
    shutil.rmtree(CARRY, ignore_errors=True)
    CARRY.mkdir(parents=True)
    for name in (NODESET_FILE, "nodeset.json"):
        shutil.copy(GPU_CARRY / name, CARRY / name)
    shutil.copy(GPU_CARRY / SITE, CARRY / SITE)  # the testbed's API client among them
    rendered = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant, exposed in (("exposed", True), ("hidden", False)):
            (Path(tmp) / variant).mkdir()
            files = render(write_stack(Path(tmp) / variant, stack(exposed), name="node")).files
            rendered[variant] = sorted(
                (o for n, o in sorted(files.items()) if not n.startswith("validatingadmissionpolicy")),
                key=lambda o: o["kind"] != "Namespace",
            )
    (CARRY / RENDER_FILE).write_text(json.dumps({"placeholder": PLACEHOLDER, "objects": rendered}))
    data = plugin_xz.read_bytes()
    if hashlib.sha256(data).hexdigest() != PLUGIN_XZ_SHA256:
        print(f"{plugin_xz}: not the sha256 ../shared/bin/README.md names", file=sys.stderr)
        return 1
    (CARRY / PLUGIN_XZ).write_bytes(data)
    total = sum(p.stat().st_size for p in CARRY.rglob("*") if p.is_file())
    print(f"{CARRY}: {total / 2**20:.1f} MiB to carry (device: 64 MiB with the repository)")
    return 0


def objects(carry: Path, variant: str, uuid: str, root: str = DRIVER_ROOT) -> list[dict[str, Any]]:
    """The render's objects of the variant, the placeholder UUID replaced by the host's GPU's (and the driver root
    by the one this host needs: driver_root)."""
    data = json.loads((carry / RENDER_FILE).read_text())
    body, real = data["placeholder"].removeprefix("GPU-"), uuid.removeprefix("GPU-")
    found = [with_driver_root(o, root) for o in json.loads(json.dumps(data["objects"][variant]).replace(body, real))]
    # As Pulumi orders them: what the DaemonSet's pods need (namespace, identity, RuntimeClass) first.
    return sorted(found, key=lambda o: (o["kind"] != "Namespace", o["kind"] == "DaemonSet"))


def as_run_here(obj: dict[str, Any], plane: ControlPlane) -> dict[str, Any]:
    """The pinned plugin's DaemonSet with the local archive's image (pull policy Never) on the host's network."""
    if (
        obj["kind"] == "DaemonSet"
        and obj["spec"]["template"]["metadata"]["labels"].get(PLUGIN_NAME_LABEL) == DRA_PLUGIN_NAME
    ):
        (container,) = obj["spec"]["template"]["spec"]["containers"]
        container["imagePullPolicy"] = "Never"
        return on_host_network(obj, plane)
    return obj


@contextmanager
def driver_root(facts: dict[str, Any]) -> Iterator[str]:
    """The driver root the DaemonSet mounts. NVIDIA's plugin takes a driver root with a `dev` directory for its dev
    root, where a claim's CDI spec finds device nodes (root.go:65-82 at v0.4.1); a driver root whose `dev` lacks
    them gets a claim spec without device nodes, which the CDI library refuses ("invalid device, empty device
    edits"), as the device machine's /usr/local/nvidia did on 2026-12-06. Such a host gets a driver root of
    read-only binds of its bin and lib64 (or lib) and no `dev`, so the plugin's dev root is its container's own
    /dev: the nodes the runtime gave it, those of the exposed GPUs alone. Any other host keeps DRIVER_ROOT."""
    dev = Path(DRIVER_ROOT) / "dev"
    facts["driverRootDev"] = sorted(p.name for p in dev.iterdir())[:20] if dev.is_dir() else None
    if not dev.is_dir() or (dev / "nvidia0").exists():
        yield DRIVER_ROOT
        return
    # Outside the run's work directory, whose cleanup is an rmtree: only empty directories are removed here, after
    # their binds are gone, so a bind still mounted (a deadline between mount and remount, a failed umount) keeps
    # the host's files.
    lab = Path(tempfile.mkdtemp(prefix="hidden-gpu-driver-root-"))
    points = [lab / name for name in ("bin", "lib64", "lib") if Path(DRIVER_ROOT, name).is_dir()]
    try:
        for point in points:
            point.mkdir()
            sh("mount", "-o", "bind,ro", f"{DRIVER_ROOT}/{point.name}", point, check=True)
        facts["labDriverRoot"] = str(lab)
        yield str(lab)
    finally:
        for point in points:
            sh("umount", "-l", point)
        for empty in (*points, lab):
            with contextlib.suppress(OSError):  # a bind still mounted is left, never emptied
                if not empty.is_mount():
                    empty.rmdir()


def with_driver_root(obj: dict[str, Any], root: str) -> dict[str, Any]:
    if obj["kind"] == "DaemonSet" and root != DRIVER_ROOT:
        text = json.dumps(obj).replace(json.dumps(DRIVER_ROOT), json.dumps(root))
        return dict(json.loads(text))
    return obj


def plugin_image(bin_dir: Path, work: Path, spec_dir: Path) -> tuple[Image, dict[str, Path]]:
    binary = bin_dir / "gpu-kubelet-plugin"
    library_path, nvml_needs = nvml(spec_dir)
    # NVIDIA's image's variables (deployments/container/Dockerfile:113 of dra-driver-nvidia-gpu v0.4.1).
    env = {"PATH": "/usr/bin", "NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
           "LD_LIBRARY_PATH": library_path}  # fmt: skip
    files = {"usr/bin/gpu-kubelet-plugin": binary, "usr/bin/nvidia-cdi-hook": bin_dir / "nvidia-cdi-hook",
             "etc/ld.so.conf": work / "ld.so.conf", **libraries(binary), **nvml_needs}  # fmt: skip
    return Image(IMAGE, ("/usr/bin/gpu-kubelet-plugin",), env), files


def plugin_log(node: Node) -> list[str]:
    """The plugin's own lines that show what it enumerated and published."""
    pods = node.plane.request("GET", f"/api/v1/namespaces/{DEFAULT_PLUGIN_NAMESPACE}/pods")["items"]
    lines = [line for p in pods for line in node.logs(DEFAULT_PLUGIN_NAMESPACE, p["metadata"]["name"])]
    keep = ("device", "Device", "GPU", "gpu", "slice", "Slice", "NVML", "nvml", "error", "Error")
    return [line[:300] for line in lines if any(k in line for k in keep)][:60]


def claim_specs() -> dict[str, Any]:
    """The plugin's per-claim CDI specs (its cdiRoot is the host's /var/run/cdi): what a claim's container gets."""
    found = {}
    for spec in sorted(Path("/var/run/cdi").glob("k8s.gpu.nvidia.com*")):
        with contextlib.suppress(OSError, ValueError):
            found[spec.name] = json.loads(spec.read_text()) if spec.suffix == ".json" else spec.read_text()[:4000]
    return found


def phases(run: Run, carry: Path, root: str) -> dict[str, Any]:
    plane, node, uuid = run.plane, run.node, run.uuid

    def rendered(variant: str) -> list[dict[str, Any]]:
        return objects(carry, variant, uuid, root)

    out: dict[str, Any] = {}
    for obj in rendered("exposed"):
        plane.apply(as_run_here(obj, plane), manager="hidden-gpu")
    published = run.eventually(lambda: dra_devices(plane, NODE, NVIDIA_DRA_DRIVER), "the pinned plugin's slice", WAIT_S)
    (device_class,) = [o["metadata"]["name"] for o in rendered("exposed") if o["kind"] == "DeviceClass"]
    request = {"name": "gpu", "exactly": {"deviceClassName": device_class}}
    metadata = {"name": "gpu", "namespace": TENANT}
    spec = {"devices": {"requests": [request]}}
    plane.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": metadata, "spec": spec})
    pod = using_claim(run.pod("dra-claim"), "gpu")
    started = time.monotonic()
    plane.create(pod)
    view = run.view(pod, started)
    out["exposed"] = {
        "published": published,
        "claim_pod": {k: view[k] for k in ("phase", "seen", "lines", "seconds")},
        "allocated": [published.get(r["device"], r["device"]) for r in claim_results(plane, TENANT, "gpu")],
        "plugin_log": plugin_log(node),
        "claim_cdi_spec": claim_specs(),
    }
    run.delete_pods()
    plane.request("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{TENANT}/resourceclaims/gpu")

    # Hidden: the render has no plugin DaemonSet (a hidden node runs neither); what `up` would delete, deleted.
    hidden = {(o["kind"], o["metadata"]["name"]) for o in rendered("hidden")}
    for obj in rendered("exposed"):
        if (obj["kind"], obj["metadata"]["name"]) not in hidden and obj["kind"] != "Namespace":
            plane.request("DELETE", plane.path(obj))
    for obj in rendered("hidden"):
        plane.apply(obj, manager="hidden-gpu")
    pods = f"/api/v1/namespaces/{DEFAULT_PLUGIN_NAMESPACE}/pods"
    run.eventually(lambda: not plane.request("GET", pods)["items"], "the plugin gone")
    started = time.monotonic()
    run.eventually(lambda: not dra_devices(plane, NODE, NVIDIA_DRA_DRIVER), "no device published", WAIT_S)
    out["hidden"] = {
        "slice_emptied_s": round(time.monotonic() - started, 2),
        "uuid_in": [r for r, found in naming(plane, [uuid]).items() if found],
    }

    # The control: the chart's way, privileged and NVIDIA_VISIBLE_DEVICES=void.
    for obj in rendered("exposed"):
        if obj["kind"] == "DaemonSet":
            (container,) = obj["spec"]["template"]["spec"]["containers"]
            container["securityContext"] = {"privileged": True}
            container["env"] = [
                e if e["name"] != "NVIDIA_VISIBLE_DEVICES" else {**e, "value": "void"} for e in container["env"]
            ]
        if obj["kind"] in ("DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "RuntimeClass"):
            plane.apply(as_run_here(obj, plane), manager="hidden-gpu")
    published = run.eventually(
        lambda: dra_devices(plane, NODE, NVIDIA_DRA_DRIVER), "the privileged plugin's slice", WAIT_S
    )
    out["privileged"] = {"published": published, "plugin_log": plugin_log(node)}
    return out


def run(carry: Path, out: Path) -> int:
    began = time.monotonic()
    result: dict[str, Any] = {
        "what": "NVIDIA's DRA kubelet plugin pinned as hidden-gpu renders it, on a GPU host (issue 41)",
        "command": "python3 -m lab.gpu_dra_run run --out $OUT",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with device_run(out, result, "hidden-gpu-gpu-dra-", DEADLINE_S) as held:
        facts = result["host"] = host_facts(rehearse=False)
        bin_dir = held.work / "bin"
        result["versions"] = unpack_nodeset(carry, bin_dir)["versions"]
        unpack_site(carry, held.work)
        binary = lzma.decompress((carry / PLUGIN_XZ).read_bytes())
        if hashlib.sha256(binary).hexdigest() != PLUGIN_SHA256:
            raise RuntimeError(f"{PLUGIN_XZ}: not the binary ../shared/bin/README.md names")
        (bin_dir / "gpu-kubelet-plugin").write_bytes(binary)
        (bin_dir / "gpu-kubelet-plugin").chmod(0o755)
        result["versions"]["gpu-kubelet-plugin"] = sh(bin_dir / "gpu-kubelet-plugin", "--version").stdout.strip()
        uuid = facts["gpus"][0]["uuid"]
        spec_dir = held.work / "spec"
        spec_dir.mkdir()
        cdi_writer(bin_dir, facts)(spec_dir)
        held.extra["nvidia.yaml"] = (spec_dir / "nvidia.yaml").read_text()
        if f"hostPath: {DRIVER_ROOT}/lib64/libnvidia-ml.so" not in held.extra["nvidia.yaml"]:
            raise RuntimeError(f"this host's NVML is not in {DRIVER_ROOT}/lib64: render the stack with its driver root")
        pod, pod_files = pod_image(bin_dir, held.work / "images", spec_dir, None)
        # A claim's spec mounts the driver root's files at their paths under that root (/lib64 here), where a CUDA
        # image's LD_LIBRARY_PATH (/usr/local/nvidia/lib64) does not look; the image looks there too.
        pod = replace(
            pod, env={**pod.env, "LD_LIBRARY_PATH": ":".join(filter(None, (pod.env.get("LD_LIBRARY_PATH"), "/lib64")))}
        )
        node_images = [(images.PAUSE, {"pause": bin_dir / "pause"}), (pod, pod_files),
                       plugin_image(bin_dir, held.work / "images", spec_dir)]  # fmt: skip
        controllers = (
            "node-lifecycle-controller",
            "resourceclaim-controller",
            "root-ca-certificate-publisher-controller",
        )
        identities = {f"system:node:{NODE}": ["system:nodes"]}
        with ControlPlane.start(bin_dir, controllers=controllers, identities=identities) as plane:
            held.plane = plane
            plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": TENANT}})

            def copy(directory: Path) -> None:
                shutil.copy(spec_dir / "nvidia.yaml", directory / "nvidia.yaml")

            with (
                driver_root(facts) as root,
                Node.start(plane, bin_dir, NODE, [uuid], cdi=copy, own_images=node_images, host_cdi=True) as node,
            ):
                held.node = node
                try:
                    result |= phases(Run(plane, node, uuid, pod.name), carry, root)
                finally:
                    collect_logs(out, node, plane, held.extra)
    result["seconds"] = round(time.monotonic() - began, 2)
    (out / "gpu-host-dra-plugin.json").write_text(json.dumps(result, indent=1) + "\n")
    print(
        json.dumps({k: v for k, v in result.items() if k in ("error", "exposed", "hidden", "privileged")}, indent=1)[
            -6000:
        ]
    )
    return 1 if "error" in result else 0


def main(argv: list[str] | None = None) -> int:
    return device_main(
        argv,
        f"gpu_dra_run\n\n{__doc__}",
        carry=CARRY,
        plugin_xz=SHARED_PLUGIN,
        prepare=prepare,
        run=lambda c, o, _: run(c, o),
        rehearsal=False,
    )


if __name__ == "__main__":
    sys.exit(main())
