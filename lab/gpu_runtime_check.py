"""NVIDIA's container runtime on a real GPU host, as containerd would run it in CDI mode: which GPUs does
an unprivileged container see under the toolkit's permissive default and under the project's hardened
settings? Standard library only: it runs on the GPU host, with binaries built here and carried there.

    python3 lab/gpu_runtime_check.py --bin DIR --out DIR    # DIR: runc, nvidia-ctk, nvidia-container-runtime,
                                                            # nvidia-cdi-hook (python -m e2e.build --gpu-host)

For each GPU of the host (one or many, the same code): `nvidia-ctk cdi generate` writes the host's CDI
spec; an OCI bundle whose root borrows the host's /usr and /etc read-only runs `nvidia-smi -L` through
nvidia-container-runtime (mode cdi) in front of runc, unprivileged (runc's default capabilities). The
cases are the routes of docs/security.md that the toolkit decides: the variable set by the image or the
pod (`all`, a UUID, `void`, `none`), a device-request mount (what the plugin's volume-mounts strategy
answers an allocation with), SYS_ADMIN. Each is run under the toolkit's defaults and under the settings
ToolkitSettings writes (ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED=false,
ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS=true). The result, every UUID each container saw, goes to
OUT/gpu-runtime-check.json. It changes no GPU setting and resets nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

UUID = re.compile(r"UUID: ((?:GPU|MIG)-[0-9a-f-]+)")
REQUEST_DIR = "/var/run/nvidia-container-devices"
DEFAULT = {"accept_envvar": True, "accept_mounts": False}
HARDENED = {"accept_envvar": False, "accept_mounts": True}


def uuids(text: str) -> list[str]:
    return UUID.findall(text)


def case_list(host_gpus: list[str]) -> list[dict[str, Any]]:
    """Every case under both settings; `expose` is the first GPU, the rest play the hidden ones (with one
    GPU it is `all` that stands for reaching the GPU no allocation gave)."""
    first = host_gpus[0]
    hidden = host_gpus[-1]
    cases: list[dict[str, Any]] = []
    for settings_name, settings in (("default", DEFAULT), ("hardened", HARDENED)):
        for name, env, mounts, caps in (
            ("image ENV all, nothing allocated (the zero-quantity and bound-by-nodeName routes)", "all", [], []),
            ("pod env names a hidden UUID", hidden, [], []),
            ("pod env void", "void", [], []),
            ("pod env none", "none", [], []),
            ("allocation by device-request mount (volume-mounts strategy), image ENV all", "all", [first], []),
            ("allocation by device-request mount, env void", "void", [first], []),
            ("SYS_ADMIN, image ENV all", "all", [], ["CAP_SYS_ADMIN"]),
        ):
            cases.append(
                {"settings": settings_name, "case": name, "env": env, "mounts": mounts, "caps": caps} | settings
            )
    return cases


def runtime_config(work: Path, bin_dir: Path, case: dict[str, Any]) -> Path:
    path = work / f"config-{case['settings']}.toml"
    path.write_text(
        f"accept-nvidia-visible-devices-envvar-when-unprivileged = {str(case['accept_envvar']).lower()}\n"
        f"accept-nvidia-visible-devices-as-volume-mounts = {str(case['accept_mounts']).lower()}\n"
        "[nvidia-container-runtime]\n"
        'mode = "cdi"\n'
        f'runtimes = ["{bin_dir / "runc"}"]\n'
        f'debug = "{work / "runtime.log"}"\n'
        'log-level = "debug"\n'
        "[nvidia-container-runtime.modes.cdi]\n"
        f'spec-dirs = ["{work / "cdi"}"]\n'
        'default-kind = "nvidia.com/gpu"\n'
        "[nvidia-ctk]\n"
        f'path = "{bin_dir / "nvidia-ctk"}"\n'
    )
    return path


def bundle(work: Path, bin_dir: Path, name: str, case: dict[str, Any] | None) -> Path:
    """An OCI bundle: an empty root with the host's /usr bound read-only (Ubuntu's merged /usr gives /bin
    and /lib as links) and an /etc of its own, running `nvidia-smi -L` unprivileged."""
    directory = work / name
    root = directory / "rootfs"
    for sub in ("usr", "etc", "proc", "dev", "sys", "tmp", "var/run"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for link, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        if not (root / link).exists():
            (root / link).symlink_to(target)
    subprocess.run([str(bin_dir / "runc"), "spec", "--bundle", str(directory)], check=True)
    spec = json.loads((directory / "config.json").read_text())
    spec["root"] = {"path": str(root), "readonly": False}
    process = spec["process"]
    process["terminal"] = False
    process["args"] = ["/bin/sh", "-c", "nvidia-smi -L; echo exit=$?"]
    process["env"] = ["PATH=/usr/local/nvidia/bin:/usr/bin:/bin", "CUDA_VERSION=12.4.0"]
    spec["mounts"] += [{"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro"]}]
    # /etc is the container's own (CDI specs mount files there and the ldcache hook rewrites
    # ld.so.cache), seeded with what the dynamic loader and nvidia-smi read.
    for seeded in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf"):
        source = Path("/etc") / seeded
        if source.is_dir():
            shutil.copytree(source, root / "etc" / seeded, dirs_exist_ok=True)
        elif source.exists():
            shutil.copy(source, root / "etc" / seeded)
    if case is not None:
        process["env"].append(f"NVIDIA_VISIBLE_DEVICES={case['env']}")
        for uuid in case["mounts"]:
            spec["mounts"].append(
                {
                    "destination": f"{REQUEST_DIR}/{uuid}",
                    "type": "bind",
                    "source": "/dev/null",
                    "options": ["bind", "ro"],
                }
            )
        for key in ("bounding", "effective", "permitted"):
            process["capabilities"][key] = sorted({*process["capabilities"].get(key, []), *case["caps"]})
    (directory / "config.json").write_text(json.dumps(spec, indent=1))
    return directory


def run_container(runtime: list[str], directory: Path, name: str, env: dict[str, str]) -> dict[str, Any]:
    """create, start, wait, delete: as containerd drives a runtime. nvidia-container-runtime modifies the
    spec on `create` only (nvidia-container-toolkit v1.20.0 internal/runtime/runtime_factory.go:40)."""
    started = time.monotonic()
    output = directory / "stdout"
    environment = {**os.environ, **env}
    with output.open("w") as stdout:
        created = subprocess.run(
            [*runtime, "create", "--bundle", str(directory), name],
            stdout=stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=120, env=environment,
            check=False,  # a refused create is a result: its message is what the report shows
        )  # fmt: skip
    if created.returncode == 0:
        subprocess.run([*runtime, "start", name], check=True, timeout=60, env=environment)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = subprocess.run(
                [*runtime, "state", name], capture_output=True, text=True, env=environment, check=False
            )
            if '"status": "stopped"' in state.stdout or state.returncode != 0:
                break
            time.sleep(0.2)
        subprocess.run([*runtime, "delete", "--force", name], capture_output=True, env=environment, check=False)
    text = output.read_text(errors="replace")
    return {
        "create_exit": created.returncode,
        "output": text[-2000:],
        "saw": uuids(text),
        "seconds": round(time.monotonic() - started, 2),
    }


def main(argv: list[str] | None = None) -> int:
    arguments = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    arguments.add_argument("--bin", type=Path, required=True)
    arguments.add_argument("--out", type=Path, required=True)
    args = arguments.parse_args(argv)
    bin_dir = args.bin.resolve()
    host = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    host_gpus = uuids(host)
    work = Path(tempfile.mkdtemp(prefix="gpu-runtime-check-"))
    state = work / "runc-state"
    report: dict[str, Any] = {"host": host.strip().splitlines(), "versions": {}, "cases": []}
    for binary, flag in (("runc", "--version"), ("nvidia-ctk", "--version"), ("nvidia-container-runtime", "--version")):
        report["versions"][binary] = subprocess.run(
            [str(bin_dir / binary), flag], capture_output=True, text=True, check=True
        ).stdout.splitlines()[:2]
    generated = subprocess.run(
        [str(bin_dir / "nvidia-ctk"), "cdi", "generate", "--output", str(work / "cdi" / "nvidia.yaml"),
         "--nvidia-cdi-hook-path", str(bin_dir / "nvidia-cdi-hook"),
         # The bundles borrow the host's /usr read-only, where this hook would add driver library links;
         # a container image has its own writable root. No device is added or removed by it.
         "--disable-hook", "create-symlinks"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    report["cdi_generate"] = {"exit": generated.returncode, "log": generated.stderr[-1500:]}
    spec_text = (work / "cdi" / "nvidia.yaml").read_text() if generated.returncode == 0 else ""
    report["cdi_device_names"] = re.findall(r"^\s*- name: (\S+)$", spec_text, re.M)
    # A control without the NVIDIA runtime: runc alone gives no GPU whatever the variable says.
    control = bundle(work, bin_dir, "control", {"env": "all", "mounts": [], "caps": []})
    report["control_runc_alone"] = run_container([str(bin_dir / "runc"), "--root", str(state)], control, "control", {})
    print(f"control: runc alone, env all: saw {report['control_runc_alone']['saw'] or 'no GPU'}", flush=True)
    print(report["control_runc_alone"]["output"][-600:], flush=True)
    for index, case in enumerate(case_list(host_gpus)):
        directory = bundle(work, bin_dir, f"case{index}", case)
        config = runtime_config(work, bin_dir, case)
        runtime = [str(bin_dir / "nvidia-container-runtime"), "--root", str(state)]
        outcome = run_container(runtime, directory, f"case{index}", {"NVIDIA_CTK_CONFIG_FILE_PATH": str(config)})
        report["cases"].append(case | outcome)
        print(f"{case['settings']:8} {case['case']:80} saw {outcome['saw'] or 'no GPU'}", flush=True)
    log = work / "runtime.log"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu-runtime-check.json").write_text(json.dumps(report, indent=1) + "\n")
    if log.exists():
        shutil.copy(log, args.out / "runtime.log")
    return 0


if __name__ == "__main__":
    sys.exit(main())
