"""What the node tier reads and resets on the host itself: a pod's processes by their cgroup, its links at the
kubelet's fixed paths, the mounts and cgroups a stopped node leaves."""

from __future__ import annotations

import shutil
import subprocess
from contextlib import suppress
from pathlib import Path


def pod_pid(pod_uid: str, program: bytes) -> int:
    """The host PID of `program` in this pod, found through its cgroup as host.audit finds pods."""
    wanted = pod_uid.replace("-", "_")
    for proc in Path("/proc").iterdir():
        try:
            ours = proc.name.isdigit() and program in (proc / "cmdline").read_bytes()
            if ours and wanted in (proc / "cgroup").read_text().replace("-", "_"):
                return int(proc.name)
        except OSError:
            continue
    raise RuntimeError(f"no process {program.decode()} in pod {pod_uid}")


def unlink_link(link: Path) -> None:
    """Remove the link this tier made (never a directory a real kubelet left)."""
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        raise RuntimeError(f"{link} exists and is not this tier's link: is a kubelet running on this machine?")


def empty_dir(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def unmount_under(root: Path) -> None:
    """Lazily unmount, deepest first, whatever is still mounted under root (sandbox shm, rootfs, volumes)."""
    points = [
        line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(f"{root}/")
    ]  # fmt: skip
    for point in sorted(set(points), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def remove_pod_cgroups() -> None:
    """The kubelet's kubepods cgroups (cgroupfs driver), deepest first; any still holding a process stays."""
    base = Path("/sys/fs/cgroup")
    tops = [base / "kubepods"] if (base / "cgroup.controllers").exists() else list(base.glob("*/kubepods"))
    for top in tops:
        for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with suppress(OSError):
                directory.rmdir()
        with suppress(OSError):
            top.rmdir()
