"""Build the real tier's binaries from Go modules, once per pinned version set.

    python -m e2e.build            # builds what is missing, links e2e/.bin/*, prints each group's time
    python -m e2e.build --check    # exit 1 unless every binary is already cached (CI's warm check)
    python -m e2e.build --gpu-host # only what the GPU host runs, packed into lab/.gpu/node/ (lab/gpu_node_run.py)

The versions live in the wrapper modules' go.mod files (e2e/go/<group>/): the module proxy serves them,
go.sum pins their content. Each group is cached under $HIDDEN_GPU_E2E_CACHE (default
~/.cache/hidden-gpu/e2e) in a directory named by a hash of its go.mod, go.sum, the Go version and this
file's build spec; a warm run builds nothing. Go's own module and build caches stay where `go env` puts
them. Nothing built is committed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODULES = HERE / "go"
LINKS = HERE / ".bin"
CACHE = Path(os.environ.get("HIDDEN_GPU_E2E_CACHE", Path.home() / ".cache/hidden-gpu/e2e"))
# The whole cold build's Go caches took 23 to 25 GB here (docs/measurements/cold-ci-nodwarf-2core.json), the
# largest group (k8s) about a third of that: refuse to start a group's build that cannot finish.
NEEDED_FREE_BYTES = 12 * 2**30
PROVIDER_MODULE = "github.com/pulumi/pulumi-kubernetes/provider/v4"
PROVIDER_CMD = "cmd/pulumi-resource-kubernetes"


@dataclass(frozen=True)
class Group:
    """One wrapper module and the main packages built from it."""

    name: str
    binaries: dict[str, str]
    """Output name -> main package."""
    version_module: str
    """The module whose selected version (or replacement's version) the binaries report."""
    ldflags: tuple[str, ...] = ()
    """-X flags; `{v}` is that version, `{major}`/`{minor}` its parts."""
    tags: str = ""
    generated_embeds: bool = False
    """The provider embeds two JSON files its release build generates (they are not in the module zip)."""
    cgo: bool = False
    """runc's nsenter and the toolkit's NVML binding are C: linked against this machine's glibc."""
    # The fields below stay out of repr(), so that adding them kept every earlier group's cache key; key()
    # hashes those a group sets.
    static: bool = field(default=False, repr=False)
    """A cgo group linked statically (glibc and libseccomp included): it runs on a host without them."""
    gpu_host: bool = False
    """Also carried to the GPU host (`--gpu-host` builds only these; lab/gpu_runtime_check.py)."""
    debian: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """(header, Debian package) pairs the cgo build needs; installed with apt-get where missing and root."""
    own_source: bool = field(default=False, repr=False)
    """Our own code (e2e/go/<group>/**.go), not a dependency's: its files are part of the cache key."""
    toolchain: str = field(default="", repr=False)
    """The Go release the module needs where this machine's is older (GOTOOLCHAIN: the go command fetches it from
    the module proxy, as a module); part of the cache key, as the machine's Go version is."""

    def env(self) -> dict[str, str]:
        return {"GOTOOLCHAIN": self.toolchain} if self.toolchain else {}


# What the GPU host run needs besides the groups marked gpu_host (that field is part of a group's cache key:
# marking these would rebuild them); and what only it needs (a plain build, CI's, and --check leave it out).
GPU_HOST_TOO = ("containerd", "node", "dra")
GPU_HOST_ONLY = ("gpuhost",)
K = "k8s.io/component-base/version"
C = "k8s.io/client-go/pkg/version"
K8S_VERSION_FLAGS = tuple(
    f"{pkg}.{key}={value}"
    for pkg in (K, C)
    for key, value in (
        ("gitVersion", "{v}"),
        ("gitMajor", "{major}"),
        ("gitMinor", "{minor}"),
        ("gitTreeState", "clean"),
    )
)
GROUPS = (
    Group("etcd", {"etcd": "go.etcd.io/etcd/server/v3"}, "go.etcd.io/etcd/server/v3"),
    # Without the version the API server reports v0.0.0 and pulumi-kubernetes refuses the cluster.
    Group(
        "k8s",
        {n: f"k8s.io/kubernetes/cmd/{n}"
         for n in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")},
        "k8s.io/kubernetes",
        K8S_VERSION_FLAGS,
    ),
    Group("pulumi", {"pulumi": "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi"}, "github.com/pulumi/pulumi/pkg/v3",
          ("github.com/pulumi/pulumi/sdk/v3/go/common/version.Version={v}",), tags="osusergo,grpcnotrace"),
    Group("pk8s", {"pulumi-resource-kubernetes": f"{PROVIDER_MODULE}/{PROVIDER_CMD}"},
          "github.com/pulumi/pulumi-kubernetes/sdk/v4",
          ("github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version={v}",), generated_embeds=True),
    Group("yaml", {"pulumi-language-yaml": "github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml"},
          "github.com/pulumi/pulumi-yaml", ("github.com/pulumi/pulumi-yaml/pkg/version.Version={v}",)),
    Group("toolkit", {n: f"github.com/NVIDIA/nvidia-container-toolkit/cmd/{n}"
                      for n in ("nvidia-ctk", "nvidia-container-runtime", "nvidia-cdi-hook")},
          "github.com/NVIDIA/nvidia-container-toolkit",
          ("github.com/NVIDIA/nvidia-container-toolkit/internal/info.version={v}",), cgo=True, gpu_host=True),
    # With the seccomp tag (the rendered plugin runs under seccomp RuntimeDefault: without it runc fails such a
    # container with ErrSeccompNotEnabled); static, as runc's own release builds are (netgo, osusergo).
    Group("runc", {"runc": "github.com/opencontainers/runc"}, "github.com/opencontainers/runc",
          ("main.version={v}",), tags="seccomp,netgo,osusergo", cgo=True, static=True, gpu_host=True,
          debian=(("/usr/include/seccomp.h", "libseccomp-dev"),)),
    # The node tier (tests/node): containerd with its CRI plugin, the runc shim, ctr to import images.
    Group("containerd", {n: f"github.com/containerd/containerd/v2/cmd/{n}"
                         for n in ("containerd", "containerd-shim-runc-v2", "ctr")},
          "github.com/containerd/containerd/v2", ("github.com/containerd/containerd/v2/version.Version={v}",)),
    # The GPU host run (lab/gpu_node_run.py): etcd and the four Kubernetes programs as one multi-call binary
    # (e2e/go/gpuhost/main.go), since separately they do not fit the device machine's carry; Kubernetes'
    # version flags as in the k8s group.
    Group("gpuhost", {"hidden-gpu-host": "hidden-gpu.test/e2e/gpuhost"}, "k8s.io/kubernetes", K8S_VERSION_FLAGS,
          gpu_host=True, own_source=True),
    # Our own programs for the node tier's images: pause, probe, the stand-in device plugin, and the stand-ins for the
    # operands hidden-gpu pins beside it (GFD, dcgm-exporter); the GPU host carries only the first three.
    Group("node", {n: f"hidden-gpu.test/e2e/node/cmd/{n}"
                   for n in ("pause", "probe", "hidden-gpu-test-plugin", "hidden-gpu-test-gfd",
                             "hidden-gpu-test-dcgm-exporter")},
          "", own_source=True),
    # The node tier's stand-in for NVIDIA's DRA kubelet plugin (tests/node/test_dra_claim.py): client-go keeps it
    # out of the node group, which the GPU host carries.
    Group("dra", {"hidden-gpu-test-dra-plugin": "hidden-gpu.test/e2e/dra/cmd/hidden-gpu-test-dra-plugin"},
          "k8s.io/dynamic-resource-allocation", own_source=True),
    # The real tier's stand-in for the kubelets of its nodes (pod and node status; tests/real/harness.py).
    Group("kwok", {"kwok": "sigs.k8s.io/kwok/cmd/kwok"}, "sigs.k8s.io/kwok"),
    # NVIDIA's GPU Operator controller (e2e/gpu_operator.py); served only as a pseudo-version (its go.mod).
    Group("gpuoperator", {"gpu-operator": "github.com/NVIDIA/gpu-operator/cmd/gpu-operator"},
          "github.com/NVIDIA/gpu-operator", ("github.com/NVIDIA/gpu-operator/internal/info.version={v}",)),
    # The API server of every other minor a platform may run, for the guard's admission tests
    # (tests/real/test_admission_minors.py): the newest patch of each the module proxy serves; 1.38's needs Go 1.27.
    # Beside it that minor's policy type checker (e2e/go/typecheck, ours): those tests run no controller manager.
    *(Group(f"k8s{minor}", {f"kube-apiserver-1.{minor[1:]}": "k8s.io/kubernetes/cmd/kube-apiserver",
                            f"hidden-gpu-typecheck-1.{minor[1:]}": "hidden-gpu.test/e2e/typecheck"},
            "k8s.io/kubernetes", K8S_VERSION_FLAGS, toolchain=toolchain)
      for minor, toolchain in (("135", ""), ("136", ""), ("138", "go1.27.3"))),
)  # fmt: skip


# Every group's compile flags, part of the cache key. The linker's -s -w strips DWARF anyway; not generating it took
# 15 % and 4 % off containerd's cold compile in two paired runs (docs/performance.md).
BUILD_FLAGS = ("-trimpath", "-gcflags=all=-dwarf=false")


def go(*args: str, cwd: Path, env: dict[str, str] | None = None, capture: bool = True) -> str:
    merged = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false", **(env or {})}
    result = subprocess.run(["go", *args], cwd=cwd, env=merged, check=True, text=True, capture_output=capture)
    return result.stdout.strip() if capture else ""


def module_version(group: Group) -> str:
    """The version go.mod selects for the group's version module, or that of its replacement."""
    if not group.version_module:
        return "v0.0.0+source"  # the cache key names the source
    listed = json.loads(go("list", "-m", "-json", group.version_module, cwd=MODULES / group.name, env=group.env()))
    return str((listed.get("Replace") or {}).get("Version") or listed["Version"])


def key(group: Group, go_version: str) -> str:
    digest = hashlib.sha256()
    for part in ("go.mod", "go.sum"):
        digest.update((MODULES / group.name / part).read_bytes())
    digest.update(go_version.encode())
    digest.update(repr(BUILD_FLAGS).encode())
    digest.update(repr(group).encode())
    if set_fields := [
        (f.name, getattr(group, f.name)) for f in fields(group) if not f.repr and getattr(group, f.name) != f.default
    ]:
        digest.update(repr(set_fields).encode())
    if group.own_source:
        for path in sorted((MODULES / group.name).rglob("*.go")):
            digest.update(str(path.relative_to(MODULES / group.name)).encode() + b"\0" + path.read_bytes())
    for directory in local_replacements(group):
        for path in sorted([*directory.rglob("*.go"), directory / "go.mod"]):
            digest.update(str(path.relative_to(MODULES)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def local_replacements(group: Group) -> list[Path]:
    """Our own modules the wrapper builds from a directory (`replace X => ../dir`): their source is part of the key."""
    text = (MODULES / group.name / "go.mod").read_text()
    return [(MODULES / group.name / target).resolve() for target in re.findall(r"=>\s*(\.\./[\w./-]+)", text)]


def ldflags(group: Group, version: str) -> str:
    parts = version.removeprefix("v").split(".")
    bare = group.name in ("pk8s", "toolkit", "runc")  # these report versions without the v
    values = {"v": version.removeprefix("v") if bare else version, "major": parts[0], "minor": parts[1]}
    static = ["-linkmode", "external", "-extldflags", "-static"] if group.static else []
    return " ".join(["-s", "-w", *static, *(f"-X {flag.format(**values)}" for flag in group.ldflags)])


def ensure_debian(group: Group) -> str | None:
    """Install the Debian packages whose headers a cgo group needs; None, or why they cannot be had."""
    missing = [package for header, package in group.debian if not Path(header).exists()]
    if not missing:
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"{group.name} needs the Debian package(s) {' '.join(missing)}: apt-get install {' '.join(missing)}"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print(f"{group.name}: apt-get install {' '.join(missing)}", flush=True)
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        if subprocess.run(command, env=env, check=False).returncode != 0:
            return f"{group.name}: `{' '.join(command)}` failed; install {' '.join(missing)} by hand"
    return None


# Seconds between two progress lines while a group builds: a cold build of k8s is minutes of go's silence.
PROGRESS_SECONDS = 60.0


@contextlib.contextmanager
def progress(name: str, every: float = PROGRESS_SECONDS) -> Iterator[None]:
    """A line when the group starts, then one every `every` seconds with the time it has taken so far; the caller
    prints the last (built, or failed). From a thread: go's own output, when there is any, goes on unhindered."""
    started = time.monotonic()
    print(f"{name}: building (not cached)", flush=True)
    done = threading.Event()

    def tick() -> None:
        while not done.wait(every):
            print(f"{name}: still building, {time.monotonic() - started:.0f} s so far", flush=True)

    ticker = threading.Thread(target=tick, name=f"progress {name}", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()


def build(group: Group, target: Path) -> None:
    """Build into a temporary directory beside the target, then move it into place: never half a group."""
    version = module_version(group)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        cwd, env = MODULES / group.name, {"CGO_ENABLED": "1", **group.env()} if group.cgo else group.env()
        if group.generated_embeds:
            # A fixed source path per key: Go's build cache then serves a rebuild of the same pins.
            src = CACHE / "src" / target.name
            shutil.rmtree(src, ignore_errors=True)
            env = {"GOWORK": str(_provider_workspace(group, src, version))}
        flags = [*BUILD_FLAGS, "-ldflags", ldflags(group, version)] + (["-tags", group.tags] if group.tags else [])
        for name, package in group.binaries.items():
            go("build", *flags, "-o", str(staging / "out" / name), package, cwd=cwd, env=env, capture=False)
        (staging / "out" / "VERSION").write_text(f"{group.name} {version}\n")
        os.replace(staging / "out", target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _provider_workspace(group: Group, src: Path, version: str) -> Path:  # the go.work file
    """A Go workspace with a copy of the provider module from the module cache plus the two files its own
    generate.go writes, so `go build` finds what the module's `//go:embed` lines name. `go build -overlay`
    cannot do this: it refuses to replace files in GOMODCACHE."""
    wrapper = MODULES / group.name
    go("mod", "download", PROVIDER_MODULE, cwd=wrapper)
    module_dir = Path(go("list", "-m", "-f", "{{.Dir}}", PROVIDER_MODULE, cwd=wrapper))
    copy = src / "provider"
    shutil.copytree(module_dir, copy)
    for path in copy.rglob("*"):
        path.chmod(path.stat().st_mode | 0o200)
    command = copy / PROVIDER_CMD
    go("build", "-o", str(src / "generate"), str(module_dir / PROVIDER_CMD / "generate.go"), cwd=wrapper)
    subprocess.run(
        [str(src / "generate")], cwd=command, env={**os.environ, "VERSION": version.removeprefix("v")}, check=True
    )
    sdk = "github.com/pulumi/pulumi-kubernetes/sdk/v4"
    (src / "go.work").write_text(
        f"go {go('env', 'GOVERSION', cwd=wrapper).removeprefix('go')}\n\nuse (\n\t{wrapper}\n\t{copy}\n)\n\n"
        # The provider's own go.mod points its SDK at ../sdk (the same commit): the release's SDK module.
        f"replace {sdk} => {sdk} {version}\n"
    )
    return src / "go.work"


def build_missing(group: Group, target: Path) -> int:
    """Build one group not cached yet: 0, or main's exit status with one line saying why on stderr (3: disk space,
    2: a Debian package missing, 1: the go command failed)."""
    if shutil.disk_usage(CACHE).free < NEEDED_FREE_BYTES:
        print(f"e2e.build: less than {NEEDED_FREE_BYTES >> 30} GiB free under {CACHE}", file=sys.stderr)
        return 3
    started = time.monotonic()
    if (problem := ensure_debian(group)) is not None:
        print(f"e2e.build: {problem}", file=sys.stderr)
        return 2
    try:
        with progress(group.name):
            build(group, target)
    except subprocess.CalledProcessError as error:  # what failed, once, with go's last word
        command = " ".join(str(part) for part in error.cmd[:3])
        said = (error.stderr or "").strip().splitlines()[-1:] if isinstance(error.stderr, str) else []
        print(f"e2e.build: {group.name}: `{command} ...` failed ({error.returncode}) {' '.join(said)}", file=sys.stderr)
        return 1
    print(f"{group.name}: built in {time.monotonic() - started:.0f} s -> {target}", flush=True)
    return 0


# Each group's binaries as built: its directory in the cache and the programs in it.
Built = dict[str, tuple[Path, tuple[str, ...]]]


def build_groups(*, gpu_host: bool = False, check: bool = False) -> tuple[int, Built]:
    """Every group a plain build wants (or, with gpu_host, the GPU host's), built where not cached and linked into
    LINKS; with check, nothing built. The exit status, and the groups' binaries."""
    if shutil.which("go") is None:
        print("e2e.build: the real tier needs Go 1.26.6 or newer on PATH", file=sys.stderr)
        return 2, {}
    go_version = go("env", "GOVERSION", cwd=HERE)
    (CACHE / "bin").mkdir(parents=True, exist_ok=True)
    LINKS.mkdir(exist_ok=True)
    missing, built = [], {}
    wanted = [
        g for g in GROUPS
        if (g.gpu_host or g.name in GPU_HOST_TOO if gpu_host else g.name not in GPU_HOST_ONLY)
    ]  # fmt: skip
    for group in wanted:
        target = CACHE / "bin" / f"{group.name}-{key(group, go_version)}"
        built[group.name] = (target, tuple(group.binaries))
        if not target.is_dir():
            missing.append(group.name)
            if check:
                continue
            if status := build_missing(group, target):
                return status, built
        else:
            print(f"{group.name}: cached {target}")
        for name in group.binaries:
            link = LINKS / name
            link.unlink(missing_ok=True)
            link.symlink_to(target / name)
    if check and missing:
        print(f"e2e.build: not cached: {', '.join(missing)}", file=sys.stderr)
        return 1, built
    return 0, built


def main(argv: list[str] | None = None) -> int:
    arguments = argparse.ArgumentParser(prog="python -m e2e.build", description=__doc__.split("\n\n")[0])
    arguments.add_argument("--check", action="store_true", help="build nothing; exit 1 unless every group is cached")
    arguments.add_argument(
        "--gpu-host", action="store_true", help="only the GPU host's binaries (lab/gpu_node_run.py packs them)"
    )
    args = arguments.parse_args(argv)
    return build_groups(gpu_host=args.gpu_host, check=args.check)[0]


if __name__ == "__main__":
    sys.exit(main())
