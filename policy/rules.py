"""The policies, as plain validators: what makes a stack safe for hidden GPUs, whoever wrote it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
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
    DRA_PLUGIN_IMAGE_NAMES,
    DRA_PLUGIN_NAME,
    DRA_PLUGIN_RULES,
    KUBELET_DEVICE_PLUGINS,
    KUBELET_PLUGINS_REGISTRY,
    NO_GPU_VALUES,
    OPERATOR_RUNTIME_CLASSES,
    PINNED_OPERANDS,
    PLUGIN_IMAGE_NAME,
    PLUGIN_NAME,
    PLUGIN_NAME_LABEL,
    PROJECT,
    SYS_ADMIN_CAPABILITIES,
    VISIBLE_DEVICES_ENV,
    MigStrategy,
    dra_plugin_name,
)
from common.tokens import Token
from policy.guard import guard_enforcing_where_listed, guard_present_and_failing_closed
from stack_config.values import GPU_UUID, MIG_UUID


def _pod_spec(props: Mapping[str, Any]) -> Mapping[str, Any]:
    return props.get("spec", {}).get("template", {}).get("spec", {}) or {}


def _pod_labels(props: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((props.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {}


def _is_device_plugin(props: Mapping[str, Any]) -> bool:
    """A DaemonSet that is a device plugin by any sign: the label verify selects by, NVIDIA's image, or a
    mount of the kubelet's device-plugin or plugin-registration directory (how any plugin registers; the second is a
    DRA kubelet plugin's). One sign is enough: a
    renamed image or a missing label must not take the plugin out of the rules. hidden-gpu's pinned operands
    (GFD, dcgm-exporter) read GPUs as the plugin does and are held to the same rules."""
    template_labels = _pod_labels(props)
    pod = _pod_spec(props)
    containers = [*pod.get("initContainers", []), *pod.get("containers", [])]
    mounts = {(v.get("hostPath") or {}).get("path", "").rstrip("/") for v in pod.get("volumes", []) or []}
    return (
        template_labels.get(PLUGIN_NAME_LABEL) in (PLUGIN_NAME, DRA_PLUGIN_NAME, *PINNED_OPERANDS.values())
        or any(
            sign in str(c.get("image", "")) for c in containers for sign in (PLUGIN_IMAGE_NAME, *DRA_PLUGIN_IMAGE_NAMES)
        )
        or bool({KUBELET_DEVICE_PLUGINS, KUBELET_PLUGINS_REGISTRY} & mounts)
    )


def _dra_plugin(props: Mapping[str, Any]) -> bool:
    """hidden-gpu's pinned DRA kubelet plugin: its GPUs are the DRA allocator's, which the node's class selects."""
    labels = _pod_labels(props)
    return labels.get(PLUGIN_NAME_LABEL) == DRA_PLUGIN_NAME


def _operand(props: Mapping[str, Any]) -> bool:
    """One of hidden-gpu's pinned operands (GFD, dcgm-exporter), by its pods' name label."""
    labels = _pod_labels(props)
    return labels.get(PLUGIN_NAME_LABEL) in PINNED_OPERANDS.values()


def _plugin_containers(resource_type: str, props: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every container of a device-plugin DaemonSet (_is_device_plugin)."""
    if resource_type != Token.DAEMONSET or not _is_device_plugin(props):
        return []
    pod = _pod_spec(props)
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


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
    # A Sequence, not a list: pulumi_policy hands a policy its lists as read-only proxies (pulumi_policy/proxy.py).
    one = len(names) == 1 and isinstance(names[0], Sequence) and not isinstance(names[0], str) and len(names[0]) == 1
    return str(names[0][0]) if one else None


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
        if value == NO_GPU_VALUES[0]:
            continue  # no GPU at all (the init container that waits for a hand-made plugin to go)
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
        # One finding per plugin; the pinned operands beside it go with its node's patch.
        if (
            _plugin_containers(resource.resource_type, resource.props)
            and node not in patched
            and not _operand(resource.props)
        ):
            report_violation(
                f"node '{node}' gets a pinned device plugin but no {DEVICE_PLUGIN_LABEL}=false patch: "
                "the GPU Operator's all-GPU plugin would run beside it",
                resource.urn,
            )


# The one selector shape hidden-gpu's DeviceClasses have (desired/node_labels.py device_selector): a driver's
# devices whose uuid attribute is one of a list.
_UUID_SELECTOR = re.compile(
    r'^device\.driver == ("[^"\\]+") && "uuid" in device\.attributes\[\1\]'
    r" && device\.attributes\[\1\]\.uuid in (\[[^\]]*\])$"
)


def device_class_selects_uuids_only(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    """A DeviceClass the program makes selects listed UUIDs of one driver and nothing else: the claims policy lets
    tenants claim from the stack's classes, so a wider selector, an `extendedResourceName` (plain `nvidia.com/gpu`
    pods placed through it) or a driver config would reach what the stack hides."""
    if args.resource_type != Token.DEVICE_CLASS:
        return
    spec = args.props.get("spec") or {}
    extra = sorted(k for k in ("extendedResourceName", "config") if spec.get(k))
    if extra:
        report_violation(f"DeviceClass sets {', '.join(extra)}: it would reach more than the UUIDs it selects", None)
    selectors = spec.get("selectors") or []
    expressions = [str((s.get("cel") or {}).get("expression", "")) for s in selectors]
    found = _UUID_SELECTOR.match(expressions[0]) if len(expressions) == 1 else None
    uuids = json.loads(found.group(2)) if found else None
    if not uuids or not all(isinstance(u, str) and (GPU_UUID.fullmatch(u) or MIG_UUID.fullmatch(u)) for u in uuids):
        report_violation(
            f"DeviceClass must select listed GPU UUIDs of one driver, in one selector, not {expressions}", None
        )


def one_allocator_per_gpu(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    """No GPU a device plugin serves is in a DeviceClass's selector too: the scheduler's resource fit and the DRA
    allocator never consult each other, so such a GPU would go out twice, past every quota."""
    served: dict[str, str] = {}
    for resource in args.resources:
        if _operand(resource.props) or _dra_plugin(resource.props):
            continue
        for container in _plugin_containers(resource.resource_type, resource.props):
            for uuid in (_env(container).get(VISIBLE_DEVICES_ENV) or "").split(","):
                if uuid:
                    served.setdefault(uuid, str((resource.props.get("metadata") or {}).get("name")))
    for resource in args.resources:
        if resource.resource_type != Token.DEVICE_CLASS:
            continue
        selectors = (resource.props.get("spec") or {}).get("selectors") or []
        text = " ".join(str((s.get("cel") or {}).get("expression", "")) for s in selectors)
        for uuid, plugin in sorted(served.items()):
            if f'"{uuid}"' in text or f"'{uuid}'" in text:
                name = (resource.props.get("metadata") or {}).get("name")
                report_violation(
                    f"GPU {uuid} is served by device plugin '{plugin}' and selected by DeviceClass '{name}': "
                    "two allocators would hand it out twice; give it one (nodes[].allocator)",
                    resource.urn,
                )


def rbac_only_for_the_dra_plugins(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    """The one identity hidden-gpu makes: a DRA kubelet plugin's (publishing its node's slice). A ClusterRole with any
    other rule, or a binding of anything but a plugin's ServiceAccount to its own role, is no component's."""
    props, name = args.props, str((args.props.get("metadata") or {}).get("name", ""))
    if args.resource_type == Token.CLUSTER_ROLE:
        rules = sorted(
            (g, r, tuple(rule.get("verbs") or ()))
            for rule in props.get("rules") or []
            for g in rule.get("apiGroups") or [""]
            for r in rule.get("resources") or []
        )
        if rules != sorted(DRA_PLUGIN_RULES) or not name.startswith(dra_plugin_name("")):
            report_violation(f"ClusterRole {name} is not a DRA kubelet plugin's: hidden-gpu makes no other", args.urn)
    if args.resource_type == Token.CLUSTER_ROLE_BINDING:
        subjects = [(s.get("kind"), s.get("name")) for s in props.get("subjects") or []]
        role = (props.get("roleRef") or {}).get("name")
        if not name.startswith(dra_plugin_name("")) or role != name or subjects != [("ServiceAccount", name)]:
            report_violation(
                f"ClusterRoleBinding {name} binds more than a DRA kubelet plugin's ServiceAccount to its own role",
                args.urn,
            )


# What this program may create. A type outside it (a Pod, a Secret, a Role) is a change no
# component makes: a broken or hostile program, refused before it reaches the cluster.
ALLOWED_TYPES = frozenset(
    {
        Token.PROVIDER,
        Token.NODE_PATCH,
        Token.NAMESPACE,
        Token.CONFIG_MAP,
        Token.RESOURCE_QUOTA,
        Token.DAEMONSET,
        Token.RUNTIME_CLASS,
        Token.DEVICE_CLASS,
        Token.NETWORK_POLICY,
        Token.ADMISSION_POLICY,
        Token.ADMISSION_BINDING,
        Token.MUTATING_POLICY,
        Token.MUTATING_BINDING,
        Token.CLUSTER_POLICY_PATCH,
        Token.SERVICE_ACCOUNT,
        Token.CLUSTER_ROLE,
        Token.CLUSTER_ROLE_BINDING,
        "pulumi:pulumi:Stack",
    }
)


def only_known_types(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    if args.resource_type not in ALLOWED_TYPES and not args.resource_type.startswith(f"{PROJECT}:index:"):
        report_violation(f"{args.resource_type} is not a type hidden-gpu creates", None)


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
    "device-class-selects-uuids-only": (
        "A DeviceClass selects listed GPU UUIDs of one driver, with no extended resource name or config.",
        device_class_selects_uuids_only,
    ),
    "rbac-only-for-the-dra-plugins": (
        "The only ClusterRoles and bindings are the pinned DRA kubelet plugins', with their rules alone.",
        rbac_only_for_the_dra_plugins,
    ),
    "only-known-resource-types": (
        "Only the resource types hidden-gpu's components create.",
        only_known_types,
    ),
}
STACK_VALIDATORS = {
    "device-plugin-node-has-label-patch": (
        "Every node with a pinned plugin also gets the device-plugin=false label patch.",
        plugin_nodes_have_label_patch,
    ),
    "one-allocator-per-gpu": (
        "No GPU a device plugin serves is selected by a DeviceClass too.",
        one_allocator_per_gpu,
    ),
    "access-guard-present-and-failing-closed": (
        "The guard's four policies and bindings exist, fail closed, bind every namespace, deny (or warn and audit).",
        guard_present_and_failing_closed,
    ),
    "access-guard-enforcing-where-listed": (
        "The guard of every stack policy/enforcing-stacks.yaml lists denies (mode enforce).",
        guard_enforcing_where_listed,
    ),
}
POLICIES: list[Policy] = [
    *(ResourceValidationPolicy(name=n, description=d, validate=v) for n, (d, v) in RESOURCE_VALIDATORS.items()),
    *(StackValidationPolicy(name=n, description=d, validate=v) for n, (d, v) in STACK_VALIDATORS.items()),
]
