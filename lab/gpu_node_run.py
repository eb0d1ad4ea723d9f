"""The node tier on a real GPU host: the control plane, a real kubelet, containerd, runc and NVIDIA's container
runtime over the host's own CDI spec (`nvidia-ctk cdi generate`), and NVIDIA's own device plugin v0.20.0 as this
project renders it; then the routes of ../shared/notes/real-node.md's table under the toolkit's defaults and
hardened, each pod running `nvidia-smi -L`. Writes OUT/h200-real-node.json (docs/measurements/) and OUT/logs.tar.gz.

    python -m lab.gpu_node_run prepare                  # here: build, pack, render, the plugin's xz -> lab/.gpu/node
    python3 -m lab.gpu_node_run run --out "$OUT"        # on the GPU host (device machine), as root
    python -m lab.gpu_node_run run --out DIR --rehearse # here, without a GPU: the node tier's stand-ins

`prepare` runs `python -m e2e.build --gpu-host` (etcd and the four Kubernetes programs as one multi-call binary,
containerd, runc, the toolkit, pause: one xz stream), renders the stack below with `offline.render` (the DaemonSet,
RuntimeClass, node label, ... exactly as `make render` writes them, the guard's policies left out: this run measures
what the kubelet and the runtime do, not admission), and copies NVIDIA's plugin binary, xz-packed, from
../shared/bin (the module proxy serves none; never part of the project, never a CI dependency).

`run` needs Python 3 and PyYAML (the render is read from lab/.gpu); what the device machine lacks of the host
tools' requirements (pydantic; protobuf at our version) and of the testbed's (the `kubernetes` client) travels as
one archive of the wheels `prepare` downloads and unpacks, with a CUDA holder (lab/cuda_hold.c) it builds with cc. The
stack was rendered for a placeholder UUID; `run` puts the host's first GPU's UUID in its place (the UUID and the
volume name derived from it): the one change besides the plugin's image, which is a local OCI archive of NVIDIA's
binary (pull policy Never), as in tests/node. `--rehearse` runs everything but the GPU: the synthetic CDI spec, the
node tier's stand-in plugin, a placeholder UUID; the pods' nvidia-smi is missing there.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from e2e.controlplane import ControlPlane
from e2e.node import Node
from e2e.node_dra import DRA_DRIVER, DRA_DRIVER_GROUP
from lab.gpu_device import DEADLINE_S, collect_logs, device_main, device_run
from lab.gpu_host import (
    HOLD,
    NODE,
    PLACEHOLDER,
    PLUGIN_SHA256,
    RENDER_FILE,
    TENANT,
    cdi_writer,
    host_facts,
    make_images,
    rendered,
    sh,
    unpack,
    unpack_site,
)
from lab.gpu_node_phases import PODS, SETTINGS, Run, audit_run, dra_run, restart_run, setting_run
from lab.gpu_node_prepare import SHARED_PLUGIN, prepare
from lab.gpu_pack import GPU_CARRY


def run(carry: Path, out: Path, rehearse: bool) -> int:  # noqa: PLR0915 (one run, in order)
    began = time.monotonic()
    result: dict[str, Any] = {
        "what": "The node tier on a GPU host: lab/gpu_node_run.py (issue 30)",
        "command": "python3 -m lab.gpu_node_run run --out $OUT" + (" --rehearse" if rehearse else ""),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rehearsal": rehearse,
        "source": json.loads((carry / RENDER_FILE).read_text()).get("source"),  # what `prepare` ran at
        "timings_s": {},
    }
    timings = result["timings_s"]
    with device_run(out, result, "hidden-gpu-gpu-node-", DEADLINE_S) as held:
        facts = result["host"] = host_facts(rehearse)
        bin_dir = held.work / "bin"
        packed = unpack(carry, bin_dir, rehearse)
        timings["unpack"] = round(time.monotonic() - began, 2)
        site = None if rehearse else unpack_site(carry, held.work)  # rehearsed here, the venv has them
        result["versions"] = {
            **packed["versions"],
            "binaries": {n: sh(bin_dir / n, "--version").stdout.strip().splitlines()[:1] for n in
                         ("kubelet", "etcd", "containerd", "runc", "nvidia-ctk", "nvidia-container-runtime")},
        }  # fmt: skip
        uuid = PLACEHOLDER if rehearse else facts["gpus"][0]["uuid"]
        if not rehearse:
            result["versions"]["nvidia-device-plugin"] = {
                "sha256": PLUGIN_SHA256, "version": sh(bin_dir / "nvidia-device-plugin", "--version").stdout.strip()
            }  # fmt: skip
        spec_dir = held.work / "spec"  # the images need the spec's NVML directory before the node starts
        spec_dir.mkdir()
        writer = None if rehearse else cdi_writer(bin_dir, facts)
        if writer:
            writer(spec_dir)
            spec = (spec_dir / "nvidia.yaml").read_text()
            held.extra["nvidia.yaml"] = spec
            result["cdi_spec"] = {"devices": re.findall(r"^- name: \"?([^\"\n]+)\"?$", spec, re.M) or
                                  re.findall(r"^\s+- name: \"?([^\"\n]+)\"?$", spec, re.M)}  # fmt: skip
        node_images = make_images(bin_dir, held.work / "images", rehearse, spec_dir, carry / HOLD)
        pod_image, plugin_image = node_images[1][0].name, node_images[2][0].name
        result["images"] = {i.name: {"env": i.env, "files": sorted(f)} for i, f in node_images}
        with ControlPlane.start(bin_dir, controllers=("node-lifecycle-controller",),
                                identities={f"system:node:{NODE}": ["system:nodes"],
                                            DRA_DRIVER: [DRA_DRIVER_GROUP]}) as plane:  # fmt: skip
            held.plane = plane
            timings["control_plane"] = round(time.monotonic() - began - timings["unpack"], 2)
            plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": TENANT}})

            def copy(directory: Path) -> None:
                shutil.copy(spec_dir / "nvidia.yaml", directory / "nvidia.yaml")

            with Node.start(plane, bin_dir, NODE, [uuid], cdi=copy if writer else None, own_images=node_images) as node:
                held.node = node
                timings["node_containerd_and_images"] = round(node.timings["containerd"], 2)
                timings["node_ready"] = round(node.timings["ready"], 2)
                try:
                    this = Run(plane, node, uuid, pod_image)
                    # No plugin yet: the kubelet drops the unserved request (its admission removes extended
                    # resources the node does not have), and the pod runs with the image's ENV.
                    # The render's RuntimeClass, node label and namespace, without the plugin's DaemonSet yet.
                    for obj in rendered(carry, "envvar", uuid, plugin_image):
                        if obj["kind"] != "DaemonSet":
                            plane.apply(obj, manager="hidden-gpu")
                    result["unserved"] = {}
                    for name, (toolkit, _) in SETTINGS.items():
                        node.toolkit(toolkit)
                        result["unserved"][name] = this.case(this.pod(f"unserved-{name}", gpus=1, bound=True))
                    this.delete_pods()
                    names = ("/hidden-gpu-test-plugin",) if rehearse else ("/nvidia-device-plugin",)
                    result["settings"] = {}
                    for name in SETTINGS:
                        started = time.monotonic()
                        result["settings"][name] = setting_run(this, carry, name, plugin_image, names)
                        timings[f"setting_{name}"] = round(time.monotonic() - started, 2)
                        if name == "defaults":  # the plugin serves the GPU and the zero route is open
                            started = time.monotonic()
                            result["audit"] = audit_run(this, carry, site, rehearse)
                            timings["audit"] = round(time.monotonic() - started, 2)
                    started = time.monotonic()
                    result["kubelet_restart"] = restart_run(this, SETTINGS["hardened"][1])
                    timings["kubelet_restart"] = round(time.monotonic() - started, 2)
                    started = time.monotonic()
                    result["dra"] = dra_run(this, carry)
                    timings["dra"] = round(time.monotonic() - started, 2)
                finally:
                    collect_logs(out, node, plane, held.extra)
    timings["total"] = round(time.monotonic() - began, 2)
    result["summary"] = summary(result)
    (out / "h200-real-node.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    return 1 if "error" in result else 0


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The table of ../shared/notes/real-node.md, from what ran: per case and setting, the UUIDs the pod saw."""
    table: dict[str, Any] = {}
    for name in SETTINGS:
        row = (result.get("settings") or {}).get(name) or {}
        cases = row.get("cases") or {}
        unserved = (result.get("unserved") or {}).get(name) or {}
        table[name] = {
            "plugin RegisteredDevices": (row.get("plugin") or {}).get("RegisteredDevices"),
            **{case: {"phase": c.get("phase"), "reason": c.get("reason"), "seen": c.get("seen"),
                      "allocated": c.get("allocated")} for case, c in cases.items()},
            "unserved": {"phase": unserved.get("phase"), "seen": unserved.get("seen")},
        }  # fmt: skip
    dra = result.get("dra") or {}
    table["dra"] = {
        "published": sorted((dra.get("published") or {}).values()),
        "while hidden": {
            "allocated": (dra.get("while_hidden") or {}).get("allocated"),
            "unschedulable": [c.get("message") for c in (dra.get("while_hidden") or {}).get("still", [])],
        },
        "while exposed": {k: (dra.get("while_exposed") or {}).get(k) for k in ("allocated", "phase", "seen")},
    }
    restart = result.get("kubelet_restart") or {}
    table["kubelet restart"] = {
        "registered_s": restart.get("registered_s"),
        "plugin pod": {k: (restart.get("plugin_pod") or {}).get(k) for k in ("same", "restartCount")},
        "stale checkpoint entries": [e for e in restart.get("checkpoint_before", []) if not e["pod_exists"]],
        **{
            f"pod {when}": {k: (restart.get(when) or {}).get(k) for k in ("phase", "reason", "seen", "allocated")}
            for when in ("at_once", "then")
        },
    }
    audit = result.get("audit") or {}
    table["audit"] = {
        "holders": {case: {k: (audit.get(case) or {}).get(k) for k in ("hold", "allocated")} for case in PODS},
        **{name: findings(audit.get(f"audit {name}") or {}) for name in ("exposed", "hidden")},
    }
    if "error" in result:
        table["error"] = result["error"][:500]
    return table


def findings(audit: dict[str, Any]) -> dict[str, Any]:
    """An audit's status and its violations, a line each: the pod or process and what it does."""
    report = audit.get("report")
    if not isinstance(report, dict):
        return {"rc": audit.get("rc"), "output": report, "stderr": audit.get("stderr")}
    return {
        "rc": audit.get("rc"),
        "violations": [
            f"{v.get('pod') or v.get('pid') or v.get('uuid')}: {v['message']}" for v in report["violations"]
        ],
    }


def main(argv: list[str] | None = None) -> int:
    return device_main(
        argv,
        f"gpu_node_run\n\n{__doc__}",
        carry=GPU_CARRY,
        plugin_xz=SHARED_PLUGIN,
        prepare=prepare,
        run=run,
        rehearsal=True,
    )


if __name__ == "__main__":
    sys.exit(main())
