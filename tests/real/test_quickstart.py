"""The README's first hidden GPU ("Going live"), its shell block run as written, line for line, against the real
tier: in a copy of this checkout's files (a fresh clone's stacks/, the same .venv), with HOME, a kubeconfig whose
context is the README's `admin@mycluster`, and the real Pulumi CLI on PATH. Two stand-ins, each a command on PATH
ahead of the real one: `python3` (the GPU node's, with requirements-host.txt: here the project's .venv) adds `--record examples/host-record.json` to `host.discover` (the tier has no GPU
and no NVML: the recorded host is an 8-GPU server), and `pulumi up` runs the program inline
(tests/real/quickstart_up.py: the CLI's Python language host is not served). The node's kubelet is kwok."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from common.names import DEFAULT_PLUGIN_NAMESPACE, device_plugin_name
from e2e.build import LINKS
from e2e.controlplane import ControlPlane
from tests.real.conftest import seeded_plane, set_node_status
from tests.support.checkout import copy_tracked

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "examples" / "host-record.json"


def readme_block() -> str:
    """The first shell block of the README's "Going live" section."""
    section = (ROOT / "README.md").read_text().split("## Going live", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```sh\n(.*?)```", section, re.S)
    assert found, "the README's Going live section has no sh block"
    return found.group(1)


def checkout_copy(into: Path) -> None:
    """The checkout's tracked files as they are here (times kept, so make sees .venv as up to date), and its .venv."""
    copy_tracked(into)
    (into / ".venv").symlink_to(ROOT / ".venv")


def shims(into: Path) -> None:
    into.mkdir()
    python = ROOT / ".venv" / "bin" / "python"
    for name in ("python", "python3"):  # the GPU node's Python, with requirements-host.txt: the project's .venv has it
        (into / name).write_text(
            "#!/bin/sh\n"
            f'if [ "$2" = host.discover ]; then exec {python} "$@" --record {RECORD}; fi\n'
            f'exec {python} "$@"\n'
        )
    (into / "pulumi").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = up ]; then shift; exec {python} -m tests.real.quickstart_up "$@"; fi\n'
        f'exec {LINKS / "pulumi"} "$@"\n'
    )
    for shim in into.iterdir():
        shim.chmod(0o755)


@pytest.fixture(scope="module")
def plane(bin_dir: Path) -> Iterator[ControlPlane]:
    with seeded_plane(bin_dir) as started:
        set_node_status(started, "gpu-node-01", 1)  # what the pinned plugin will have its kubelet advertise
        yield started


@pytest.mark.timeout(900)  # two renders, stack init and up on 2 cores, past the tier's default
def test_the_readme_hides_a_first_gpu_as_written(plane: ControlPlane, tmp_path: Path) -> None:
    work, home = tmp_path / "checkout", tmp_path / "home"
    work.mkdir()
    (home / ".kube").mkdir(parents=True)
    checkout_copy(work)
    # The copy's .venv is the checkout's: make must find it current, or the README's make would reinstall it.
    current = subprocess.run(["make", "-q", ".venv/.runtime"], cwd=work, capture_output=True, check=False)
    assert current.returncode == 0, "the checkout's .venv is older than its requirements: run make render first"
    shims(tmp_path / "shims")
    config = yaml.safe_load(plane.kubeconfig("admin").read_text())
    config["contexts"][0]["name"] = config["current-context"] = "admin@mycluster"
    (home / ".kube" / "config").write_text(yaml.safe_dump(config))
    env = {
        "HOME": str(home),
        "PULUMI_HOME": str(home / ".pulumi"),  # the CLI's own files: else the passwd entry's home, not $HOME
        "PATH": os.pathsep.join([str(tmp_path / "shims"), str(LINKS), "/usr/local/bin", "/usr/bin", "/bin"]),
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", readme_block()],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    # The stack the heredoc wrote: the record's GPU 0 exposed, the other seven hidden, the guard warning.
    written = yaml.safe_load((work / "stacks" / "Pulumi.first.yaml").read_text())
    stack = written["config"]
    (node,) = stack["hidden-gpu:nodes"]
    assert node["exposedGpus"] == ["GPU-02ff349d-4f87-4aa3-9c2b-9d9f2ae75e2e"] and len(node["hiddenGpus"]) == 7
    assert stack["hidden-gpu:guard"] == {"mode": "warn"} and "encryptionsalt" in written  # stack init wrote it
    # What `up` made, as the API server has it: the plugin pinned to that GPU alone; and verify's verdict.
    daemonset = plane.request(
        "GET", f"/apis/apps/v1/namespaces/{DEFAULT_PLUGIN_NAMESPACE}/daemonsets/{device_plugin_name('gpu-node-01')}"
    )
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": node["exposedGpus"][0]} in container["env"]
    # verify's verdict (bash -e stopped at any failing line before it): every check of the first stack ok.
    assert re.search(r"^result: 0 mismatch\(es\) in \d+ checks", done.stdout, re.M), done.stdout[-3000:]
