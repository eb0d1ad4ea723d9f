"""The value types of a stack file (UUIDs, names, images, paths, quantities, labels), each with the
check that refuses a bad one, and the strict base every stack model shares."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from common.names import DOT_SEGMENT_PATTERN, PROTECTED_HOST_PATHS
from stack_config.errors import FieldProblemsError, Loc

# A device UUID as NVML and `nvidia-smi -L` print it: a prefix, then lowercase hex in this shape.
UUID_SHAPE = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
GPU_UUID = re.compile("GPU-" + UUID_SHAPE.replace("x", "[0-9a-f]"))
MIG_UUID = re.compile("MIG-" + UUID_SHAPE.replace("x", "[0-9a-f]"))
# DNS-1123 label: what Kubernetes accepts as a namespace name.
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# DNS-1123 subdomain: what Kubernetes accepts as a node name.
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
IMAGE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# An absolute path as the toolkit's filepath.Clean would leave it; the guard compares paths so.
NORMAL_PATH = re.compile(r"(/[^/]+)+")
DOT_SEGMENT = re.compile(DOT_SEGMENT_PATTERN)
CAPABILITY = re.compile(r"[A-Z][A-Z0-9_]*")
QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?")
LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def _reject_index(value: object) -> object:
    # YAML turns `- 3` into an int and `- "3"` into a str; both are a person thinking in indices.
    if isinstance(value, bool):
        raise ValueError(f"not a GPU UUID: expected GPU-{UUID_SHAPE}")
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        raise ValueError(
            "a GPU index, not a UUID: indices can change across reboots and driver reloads, "
            "and then the hidden GPU is the one exposed; pin it by its UUID "
            "(python -m host.discover lists them)"
        )
    return value


def _check_gpu_uuid(value: str) -> str:
    if value.lower() in ("all", "none", "void"):
        raise ValueError("not a GPU: list each GPU by its UUID")
    if not GPU_UUID.fullmatch(value):
        raise ValueError(f"not a GPU UUID: expected GPU-{UUID_SHAPE} in lowercase hex, as nvidia-smi -L prints it")
    return value


def _check_device_uuid(value: str) -> str:
    """A whole GPU (GPU-...) or a MIG device (MIG-..., the format drivers since R470 print)."""
    if value.startswith("MIG-"):
        return _check_mig_uuid(value)
    return _check_gpu_uuid(value)


def _check_mig_uuid(value: str) -> str:
    if not MIG_UUID.fullmatch(value):
        raise ValueError(
            f"not a MIG device UUID: expected MIG-{UUID_SHAPE} in lowercase hex, "
            "as nvidia-smi -L prints it under its GPU"
        )
    return value


def _name(kind: str, pattern: re.Pattern[str], limit: int, rule: str) -> AfterValidator:
    """A `kind` ("pool name") of at most `limit` characters that `pattern` matches whole; else "not a valid <kind>:
    <rule>". The check is named `_check_<kind>`: docs/configuration.md names the key's type by it."""

    def check(value: str) -> str:
        if len(value) > limit or not pattern.fullmatch(value):
            raise ValueError(f"not a valid {kind}: {rule}")
        return value

    check.__name__ = check.__qualname__ = "_check_" + kind.replace(" ", "_")
    return AfterValidator(check)


_DNS_LABEL_RULE = "at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"


def _check_image(value: str) -> str:
    repository, _, digest = value.partition("@")
    last_segment = repository.rsplit("/", 1)[-1]
    tag = last_segment.partition(":")[2] if ":" in last_segment else ""
    if digest and not IMAGE_DIGEST.fullmatch(digest):
        raise ValueError("malformed digest: expected @sha256:<64 hex digits>")
    if tag and not IMAGE_TAG.fullmatch(tag):
        raise ValueError("malformed tag")
    if not tag and not digest:
        raise ValueError("no tag or digest: pin the plugin version, e.g. ':v0.20.0'")
    if tag == "latest" and not digest:
        raise ValueError("':latest' is not a pinned version: pin the plugin version, e.g. ':v0.20.0'")
    return value


def _check_host_path(value: str) -> str:
    if value != "/" and (not NORMAL_PATH.fullmatch(value) or DOT_SEGMENT.search(value)):
        raise ValueError("not an absolute path in normal form (no //, /./, /../ or trailing /)")
    return value


def _check_tenant_host_path(value: str) -> str:
    for protected in PROTECTED_HOST_PATHS:
        if value == protected or _is_below(value, protected) or _is_below(protected, value):
            raise ValueError(
                f"never allowed to tenants: it is, holds or lies inside {protected} (devices, kernel views, runtime "
                "and kubelet sockets, which a read-only mount still lets a process connect to)"
            )
    return value


def _is_below(path: str, parent: str) -> bool:
    return path.startswith(parent.rstrip("/") + "/")


def _check_capability(value: str) -> str:
    if not CAPABILITY.fullmatch(value):
        raise ValueError("not a capability name: upper-case letters and '_', without CAP_ (e.g. NET_BIND_SERVICE)")
    if value in ("SYS_ADMIN", "ALL"):
        raise ValueError("never allowed: the NVIDIA toolkit treats SYS_ADMIN as privileged (every GPU)")
    return value


def _check_quantity(value: str) -> str:
    if not QUANTITY.fullmatch(value):
        raise ValueError("not a Kubernetes quantity (e.g. 50m, 64Mi, 1)")
    return value


def _check_label_key(value: str) -> str:
    if not LABEL_KEY.fullmatch(value) or len(value) > 317:
        raise ValueError("not a label key ([prefix/]name)")
    return value


def _check_label_value(value: str) -> str:
    if len(value) > 63 or not LABEL_VALUE.fullmatch(value):
        raise ValueError("not a label value (at most 63 letters, digits, '-', '_', '.')")
    return value


GpuUuid = Annotated[str, BeforeValidator(_reject_index), AfterValidator(_check_gpu_uuid)]
DeviceUuid = Annotated[str, BeforeValidator(_reject_index), AfterValidator(_check_device_uuid)]
MigUuid = Annotated[str, AfterValidator(_check_mig_uuid)]
NamespaceName = Annotated[str, _name("namespace name", DNS_LABEL, 63, _DNS_LABEL_RULE)]
ContainerName = Annotated[str, _name("container name", DNS_LABEL, 63, _DNS_LABEL_RULE)]
# The plugin is pinned through the kubernetes.io/hostname label, and a label value holds at most 63 characters: a
# longer node name could never be selected.
NodeName = Annotated[
    str,
    _name("node name", DNS_SUBDOMAIN, 63, "at most 63 lowercase letters, digits, '-' and '.' (DNS-1123), as "
          "`kubectl get nodes` shows it"),
]  # fmt: skip
ImageRef = Annotated[str, AfterValidator(_check_image)]
HostPath = Annotated[str, AfterValidator(_check_host_path)]
TenantHostPath = Annotated[str, AfterValidator(_check_host_path), AfterValidator(_check_tenant_host_path)]
Capability = Annotated[str, AfterValidator(_check_capability)]
ObjectName = Annotated[
    str, _name("object name", DNS_SUBDOMAIN, 253, "at most 253 lowercase letters, digits, '-' and '.' (DNS-1123)")
]
# A pool's RuntimeClass and DeviceClass are hidden-gpu-pool-<pool>.
PoolName = Annotated[str, _name("pool name", DNS_LABEL, 63, _DNS_LABEL_RULE)]
Quantity = Annotated[str, AfterValidator(_check_quantity)]
LabelKey = Annotated[str, AfterValidator(_check_label_key)]
LabelValue = Annotated[str, AfterValidator(_check_label_value)]


# Stack files spell enum values as strings; strict mode would demand the enum object itself.
LaxEnum = Field(strict=False)


def raise_problems(problems: Iterable[tuple[Loc, Any, str]]) -> None:
    """Raise every problem a rule found at once, so they are reported together with the field errors."""
    found = list(problems)
    if found:
        raise FieldProblemsError(found)


class StrictModel(BaseModel):
    # Unknown keys are errors: a misspelt `hidenGpus` must never silently expose GPUs.
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
        extra="forbid",
        frozen=True,
        strict=True,
        use_attribute_docstrings=True,
    )


def as_given(model: BaseModel) -> dict[str, Any]:
    """A section as the stack file gave it, for an error line: no default filled in."""
    return model.model_dump(by_alias=True, exclude_unset=True)


def short_loc(loc: Loc) -> str:
    """nodes[0].exposedGpus[1]: a place as messages name it, without the `hidden-gpu:` prefix."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
