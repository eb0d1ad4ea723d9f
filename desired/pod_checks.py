"""The pod policy's checks of one container, and of one of its env entries, mounts and limits, as CEL: each rule of
guard_rules is built from them, and so is the fast path (`podOk`), which runs them all in one scan of the containers.
Plain data (no Pulumi)."""

from __future__ import annotations

import os

from common.names import (
    DEBUG_CAPABILITIES,
    DEVICE_ENV,
    DEVICE_REQUEST_DIR,
    DRA_EXTENDED_RESOURCE_PREFIX,
    NO_GPU_VALUES,
    NVIDIA_RESOURCE_PATTERN,
    PARENT_SEGMENT_PATTERN,
    TOOLKIT_FEATURE_ENV,
    VISIBLE_DEVICES_ENV,
)
from desired.guard_settings import GuardSettings, cel

# Separators filepath.Clean folds into one "/": repeated slashes and "." segments.
_SEPARATOR = r"/(\.?/)*"


def _request_dir_pattern(directory: str) -> str:
    """A raw mount path whose cleaned form starts with the directory, as the toolkit matches it: a bare
    string prefix of the cleaned destination (cuda_image.go, requestsFromMounts), no separator needed after."""
    return "^" + "".join(_SEPARATOR + segment.replace(".", r"\.") for segment in directory.strip("/").split("/"))


# /run is where /var/run points in most images.
DEVICE_REQUEST_PATTERNS = [
    _request_dir_pattern(d) for d in (DEVICE_REQUEST_DIR, DEVICE_REQUEST_DIR.removeprefix("/var"))
]
# A positive quantity: a non-zero digit in the number before any exponent or suffix ("0", "0e3" are not).
POSITIVE_QUANTITY = r"^[+]?[0-9.]*[1-9]"
# The variable that passes a request every per-container rule would pass, in one scan (fast_path).
FAST_PATH = "podOk"


def sets_no_gpu(env: str) -> str:
    return f"{env}.name == {cel(VISIBLE_DEVICES_ENV)} && has({env}.value) && {env}.value in {cel(list(NO_GPU_VALUES))}"


def requests_nvidia(c: str) -> str:
    return (
        f"has({c}.resources) && has({c}.resources.limits) && {c}.resources.limits.exists(k,"
        f" k.matches({cel(NVIDIA_RESOURCE_PATTERN)}) && {c}.resources.limits[k].matches({cel(POSITIVE_QUANTITY)}))"
    )


def requests_unlisted_dra_resource(c: str, allowed_classes: list[str]) -> str:
    """A container asks, in its requests or its limits, for a DRA extended resource of a class the stack does not
    allow. Both maps: the scheduler reads requests (an extended resource given only there is still allocated)."""
    allowed = cel(sorted(DRA_EXTENDED_RESOURCE_PREFIX + name for name in allowed_classes))
    unlisted = f"k.startsWith({cel(DRA_EXTENDED_RESOURCE_PREFIX)}) && !(k in {allowed})"
    either = " || ".join(
        f"(has({c}.resources.{part}) && {c}.resources.{part}.exists(k, {unlisted}))" for part in ("limits", "requests")
    )
    return f"has({c}.resources) && ({either})"


def gpu_request_or_void(c: str) -> str:
    """A container under an NVIDIA runtime passes: it requests a GPU, or says void."""
    return f"({requests_nvidia(c)}) || (has({c}.env) && {c}.env.exists(e, {sets_no_gpu('e')}))"


def visible_not_void(e: str) -> str:
    return f"{e}.name == {cel(VISIBLE_DEVICES_ENV)} && !({sets_no_gpu(e)})"


def feature_env(e: str) -> str:
    return f"{e}.name in {cel(list(TOOLKIT_FEATURE_ENV))}"


def device_prefix(f: str) -> str:
    return f"has({f}.prefix) && {f}.prefix != '' && {cel(list(DEVICE_ENV))}.exists(n, n.startsWith({f}.prefix))"


def privileged(c: str) -> str:
    return f"has({c}.securityContext) && has({c}.securityContext.privileged) && {c}.securityContext.privileged"


def host_mount_ok(m: str) -> str:
    # A volume that is not allowed at all is host-path-volumes' to report, on CREATE; a debug container added
    # later may not mount it either.
    return (
        f"!({m}.name in variables.hostPathVolumes) || ({m}.name in variables.allowedHostPathVolumes"
        f" ? has({m}.readOnly) && {m}.readOnly : variables.creating)"
    )


def normal_mount(m: str) -> str:
    return f"{m}.mountPath.startsWith('/') && !{m}.mountPath.matches({cel(PARENT_SEGMENT_PATTERN)})"


def no_request_mount(m: str) -> str:
    return " && ".join(f"!{m}.mountPath.matches({cel(p)})" for p in DEVICE_REQUEST_PATTERNS)


def names_visible_devices(c: str) -> str:
    return f"has({c}.env) && {c}.env.exists(e, e.name == {cel(VISIBLE_DEVICES_ENV)})"


def capability_pattern(allowed: list[str]) -> str:
    return "(?i)^(CAP_)?(" + "|".join(sorted(allowed)) + ")$" if allowed else "^$"


def adds_only(c: str, allowed: list[str]) -> str:
    return (
        f"!has({c}.securityContext) || !has({c}.securityContext.capabilities)"
        f" || !has({c}.securityContext.capabilities.add) || {c}.securityContext.capabilities.add.all(a,"
        f" a.matches({cel(capability_pattern(allowed))}))"
    )


def container_checks(c: str, args: GuardSettings, capabilities: list[str]) -> list[str]:
    """Every per-container rule at once, each list of the container read once: the fast path's one scan. Each part
    is its rule's own predicate (an env entry that is neither route cannot start NVIDIA_, so most stop there)."""
    env_prefix = os.path.commonprefix(list(DEVICE_ENV))  # noqa: RUF071 (the names' shared start, NVIDIA_)
    allowed_classes = [*args.allowed_device_classes, *args.gpu_device_classes]
    return [
        f"!has({c}.env) || {c}.env.all(e, !e.name.startsWith({cel(env_prefix)})"
        f" || !({visible_not_void('e')} || {feature_env('e')}))",
        f"!variables.nvidiaRuntime || {gpu_request_or_void(c)}",
        f"!has({c}.envFrom) || !{c}.envFrom.exists(f, {device_prefix('f')})",
        f"!has({c}.volumeMounts) || {c}.volumeMounts.all(m, ({host_mount_ok('m')})"
        f" && (!variables.linux || ({normal_mount('m')} && {no_request_mount('m')})))",
        f"!({privileged(c)})",
        adds_only(c, capabilities),
        f"!({requests_unlisted_dra_resource(c, allowed_classes)})",
    ]


def fast_path(args: GuardSettings) -> tuple[str, str]:
    """The `podOk` variable: every container the request adds passes every per-container rule, in one scan. Each
    such rule is `variables.podOk || <the rule>`: an ordinary pod pays for one scan, not one per rule; a pod that
    fails it is judged by each rule as before, so every verdict and message is the rule's own (issue 43)."""
    debug = sorted({*args.allowed_capabilities, *DEBUG_CAPABILITIES})
    return (
        FAST_PATH,
        " && ".join(
            f"variables.{kind}.all(c, {' && '.join(f'({check})' for check in container_checks('c', args, caps))})"
            for kind, caps in (("regularContainers", args.allowed_capabilities), ("debugContainers", debug))
        ),
    )
