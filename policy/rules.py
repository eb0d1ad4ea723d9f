"""The policies, as plain validators: what makes a stack safe for hidden GPUs, whoever wrote it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from pulumi_policy import (
    Policy,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from common.names import (
    DEVICE_PLUGIN_LABEL,
    OPERATOR_RUNTIME_CLASSES,
    PLUGIN_IMAGE_NAME,
    SYS_ADMIN_CAPABILITIES,
    VISIBLE_DEVICES_ENV,
    MigStrategy,
    Token,
)
from stack_config.models import GPU_UUID, MIG_UUID


def _pod_spec(props: Mapping[str, Any]) -> Mapping[str, Any]:
    return props.get("spec", {}).get("template", {}).get("spec", {}) or {}


def _plugin_containers(resource_type: str, props: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The NVIDIA device-plugin containers of a DaemonSet, recognised by their image."""
    if resource_type != Token.DAEMONSET:
        return []
    pod = _pod_spec(props)
    containers = [*pod.get("initContainers", []), *pod.get("containers", [])]
    return [c for c in containers if PLUGIN_IMAGE_NAME in str(c.get("image", ""))]


def _env(container: Mapping[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", []) or []}


def _pinned_node(props: Mapping[str, Any]) -> str | None:
    """The one node a DaemonSet's pods may run on: required node affinity on metadata.name, one value."""
    affinity = (_pod_spec(props).get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    if len(terms) != 1:
        return None
    fields = terms[0].get("matchFields") or []
    names = [f.get("values") for f in fields if f.get("key") == "metadata.name" and f.get("operator") == "In"]
    return names[0][0] if len(names) == 1 and isinstance(names[0], list) and len(names[0]) == 1 else None


def plugin_unprivileged(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    for container in _plugin_containers(args.resource_type, args.props):
        security = container.get("securityContext") or {}
        if security.get("privileged"):
            report_violation(
                f"device plugin container '{container.get('name')}' is privileged: it would see every GPU", None
            )
        added = (security.get("capabilities") or {}).get("add") or []
        mig = _env(container).get("MIG_STRATEGY") in (MigStrategy.SINGLE, MigStrategy.MIXED)
        # MIG monitoring needs SYS_ADMIN; the stack config keeps a MIG GPU whole on one side for it.
        if set(SYS_ADMIN_CAPABILITIES) & set(added) and not mig:
            report_violation(
                f"device plugin container '{container.get('name')}' adds SYS_ADMIN without a MIG strategy: "
                "the toolkit treats it as privileged",
                None,
            )


def plugin_devices_are_uuids(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    for container in _plugin_containers(args.resource_type, args.props):
        value = _env(container).get(VISIBLE_DEVICES_ENV)
        if value is None:
            report_violation(
                "device plugin does not set NVIDIA_VISIBLE_DEVICES: the image's own ENV=all exposes every GPU", None
            )
            continue
        bad = [d for d in value.split(",") if not (GPU_UUID.fullmatch(d) or MIG_UUID.fullmatch(d))]
        if bad:
            report_violation(
                f"device plugin NVIDIA_VISIBLE_DEVICES must list GPU or MIG UUIDs only, not {bad}: "
                "indices move across reboots and 'all' exposes hidden GPUs",
                None,
            )


def plugin_pinned_to_one_node(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if _plugin_containers(args.resource_type, args.props) and _pinned_node(args.props) is None:
        report_violation(
            "device plugin DaemonSet must be pinned to exactly one node by required node affinity on metadata.name",
            None,
        )


def no_operator_runtime_class(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    name = (args.props.get("metadata") or {}).get("name")
    if args.resource_type == Token.RUNTIME_CLASS and name in OPERATOR_RUNTIME_CLASSES:
        report_violation(f"RuntimeClass '{name}' is created and owned by the GPU Operator", None)


def _patched_nodes(resources: list[Any]) -> Iterator[str]:
    for resource in resources:
        metadata = resource.props.get("metadata") or {}
        labels = metadata.get("labels") or {}
        if resource.resource_type == Token.NODE_PATCH and labels.get(DEVICE_PLUGIN_LABEL) == "false":
            yield str(metadata.get("name"))


def plugin_nodes_have_label_patch(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    patched = set(_patched_nodes(args.resources))
    for resource in args.resources:
        node = _pinned_node(resource.props)
        if _plugin_containers(resource.resource_type, resource.props) and node not in patched:
            report_violation(
                f"node '{node}' gets a pinned device plugin but no {DEVICE_PLUGIN_LABEL}=false patch: "
                "the GPU Operator's all-GPU plugin would run beside it",
                resource.urn,
            )


Validator = Callable[[ResourceValidationArgs, ReportViolation], None]
RESOURCE_VALIDATORS: dict[str, tuple[str, Validator]] = {
    "device-plugin-unprivileged": (
        "No privileged or SYS_ADMIN device-plugin container (SYS_ADMIN only for MIG).",
        plugin_unprivileged,
    ),
    "device-plugin-devices-are-uuids": (
        "A plugin's NVIDIA_VISIBLE_DEVICES holds GPU or MIG UUIDs only.",
        plugin_devices_are_uuids,
    ),
    "device-plugin-pinned-to-one-node": (
        "Every device-plugin DaemonSet is pinned to exactly one node.",
        plugin_pinned_to_one_node,
    ),
    "no-operator-runtime-class": (
        f"No RuntimeClass named {', '.join(OPERATOR_RUNTIME_CLASSES)}.",
        no_operator_runtime_class,
    ),
}
STACK_VALIDATORS = {
    "device-plugin-node-has-label-patch": (
        "Every node with a pinned plugin also gets the device-plugin=false label patch.",
        plugin_nodes_have_label_patch,
    ),
}
POLICIES: list[Policy] = [
    *(ResourceValidationPolicy(name=n, description=d, validate=v) for n, (d, v) in RESOURCE_VALIDATORS.items()),
    *(StackValidationPolicy(name=n, description=d, validate=v) for n, (d, v) in STACK_VALIDATORS.items()),
]
