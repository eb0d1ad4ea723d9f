"""The access guard's rules, as plain data: what its admission policies judge (no Pulumi here: cluster.verify
compares the live guard with them).

Scheduling only decides who gets an NVIDIA resource; the container toolkit still gives a container
whatever its final environment, its mounts, its privileges or its CDI annotations ask for. The
rules are principles rather than lists of bad spellings (docs/security.md has every route, with the
upstream lines): every container under an NVIDIA runtime either requests a positive NVIDIA
resource or says `void`; the visible-devices variable is judged by the name the process finally
sees; paths are judged in normal form, the device-request directory as the toolkit matches it;
capabilities by an allow-list, compared as containerd compares; host paths only where allowed. On
UPDATE only what the update adds is judged. The expressions are standard CEL, so the tests run them
unchanged, and they type-check without warnings in the API server.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from common.names import (
    CDI_ANNOTATION_DOMAIN,
    CDI_ANNOTATION_PATTERN,
    CLAIMS_POLICY_NAME,
    DEBUG_CAPABILITIES,
    DEVICE_ENV,
    DEVICE_REQUEST_DIR,
    DRA_EXTENDED_RESOURCE_PREFIX,
    DRA_GROUP,
    DRA_VERSION,
    ENV_KEYS_POLICY_NAME,
    HOST_NAMESPACE_FIELDS,
    NAMESPACE_NAME_LABEL,
    NO_GPU_VALUES,
    NVIDIA_RESOURCE_PATTERN,
    PARENT_SEGMENT_PATTERN,
    POLICY_NAME,
    PROJECT,
    TOOLKIT_FEATURE_ENV,
    VISIBLE_DEVICES_ENV,
    GuardMode,
    GuardScope,
)
from components.guard_scope import entering_scope, scope_conditions
from components.node_labels import gpu_device_classes
from stack_config.models import GuardConfig, StackConfig

VALIDATION_ACTIONS = {GuardMode.ENFORCE: ["Deny"], GuardMode.WARN: ["Warn", "Audit"], GuardMode.AUDIT: ["Audit"]}
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
# Pods, and `kubectl debug`'s way of adding a container to a running one.
POD_RESOURCES = ["pods", "pods/ephemeralcontainers"]
# What envFrom turns into environment variables.
ENV_KEYS_RESOURCES = ["configmaps", "secrets"]
# The pod's container lists, in the order the kubelet starts them.
CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")
# Both pod policies judge CREATE and UPDATE apart.
CREATING = ("creating", "request.operation == 'CREATE'")
# The variable that passes a request every per-container rule would pass, in one scan (fast_path).
FAST_PATH = "podOk"
# A pod UPDATE that removes its last scheduling gate hands it to the scheduler: judged whole, as a CREATE is. A pod
# made while the guard only warned (or before it existed) with a route the enforcing guard denies would otherwise
# run once its gates go (issue 40, 1). Its containers cannot have changed meanwhile (ValidatePodUpdate).
UNGATING = (
    "request.operation == 'UPDATE' && oldObject != null && has(oldObject.spec.schedulingGates)"
    " && size(oldObject.spec.schedulingGates) > 0"
    " && (!has(object.spec.schedulingGates) || size(object.spec.schedulingGates) == 0)"
)
JUDGED_WHOLE = f"{CREATING[1]} || ({UNGATING})"
# What the optional mutating policy sets: the toolkit gives a container with it no GPU.
VOID = NO_GPU_VALUES[0]
REQUEST = "request one with resources.limits['nvidia.com/gpu'] (or a .shared or mig- resource)"


def cel(value: object) -> str:
    """A CEL literal: JSON strings and lists of strings are CEL literals too."""
    return json.dumps(value)


@dataclass(frozen=True)
class Rule:
    name: str
    expression: str
    message: str


@dataclass(frozen=True)
class PolicySpec:
    """One ValidatingAdmissionPolicy: its name, what it matches, its variables and rules."""

    name: str
    match: dict[str, list[str]]
    """The one resource rule of its match constraints, in wire names (cluster.verify compares them)."""
    variables: list[tuple[str, str]]
    rules: list[Rule]
    conditions: list[tuple[str, str]] = field(default_factory=list)
    """Its match conditions (guard_scope: the pods a scope judges), by name; the exemptions are its namespace
    selector."""


@dataclass(frozen=True)
class GuardSettings:
    """What the rules are written from: a stack's `guard` settings and the namespaces it exempts."""

    mode: GuardMode
    """enforce (deny), warn (admit, warn, audit) or audit (annotate only)."""
    exempt_namespaces: list[str]
    """Namespaces the guard does not check: trusted system namespaces and the plugin's."""
    exempt_namespace_labels: dict[str, str]
    """Label pairs that exempt a namespace carrying any of them."""
    allowed_host_paths: list[str]
    """Host paths tenant pods may mount, exactly, read-only."""
    allowed_capabilities: list[str]
    """Capabilities tenant containers may add."""
    plain_runtime_classes: list[str]
    """RuntimeClasses whose handler does not run the NVIDIA toolkit; a pod naming any other is judged as under it."""
    nvidia_is_default_runtime: bool
    """Every container runs the toolkit, whatever its RuntimeClass."""
    allowed_device_classes: list[str]
    """DeviceClasses tenants may claim from, and whose DRA extended resource their containers may request."""
    gpu_device_classes: list[str]
    """The stack's own DeviceClasses (hidden-gpu:dra), each selecting only exposed GPUs: tenants may claim from them,
    one device count at a time."""
    add_void: bool
    """Also declare the MutatingAdmissionPolicy that adds NVIDIA_VISIBLE_DEVICES=void to new containers that would
    otherwise be denied for lack of a GPU request."""
    scope: GuardScope = GuardScope.CLUSTER
    """Which pods the pod rules judge (guard_scope)."""

    @classmethod
    def of(cls, stack: StackConfig) -> GuardSettings:
        return cls.of_guard(stack.guard, stack.device_plugin.namespace, sorted(gpu_device_classes(stack)))

    @classmethod
    def of_guard(cls, guard: GuardConfig, plugin_namespace: str, gpu_classes: list[str]) -> GuardSettings:
        return cls(
            mode=guard.mode,
            exempt_namespaces=guard.exempt_with(plugin_namespace),
            exempt_namespace_labels=dict(guard.exempt_namespace_labels),
            allowed_host_paths=list(guard.allowed_host_paths),
            allowed_capabilities=list(guard.allowed_capabilities),
            plain_runtime_classes=list(guard.plain_runtime_classes),
            nvidia_is_default_runtime=guard.nvidia_is_default_runtime,
            allowed_device_classes=list(guard.allowed_device_classes),
            gpu_device_classes=list(gpu_classes),
            add_void=guard.add_void,
            scope=guard.scope,
        )


def _listed(obj: str, kinds: tuple[str, ...]) -> str:
    """The containers of these kinds of a pod object (`dyn`: each kind has its own element type)."""
    return " + ".join(f"dyn(has({obj}.spec.{kind}) ? {obj}.spec.{kind} : [])" for kind in kinds)


def nvidia_runtime(args: GuardSettings, obj: str = "object") -> str:
    """CEL: the pod's containers may run under the NVIDIA toolkit. A list of NVIDIA classes is never
    complete (k3s ships `nvidia-experimental`, an admin adds their own), so every named class counts
    unless the stack lists it as plain; judging a plain pod so costs it only a `void`."""
    if args.nvidia_is_default_runtime:
        return "true"
    return (
        f"has({obj}.spec.runtimeClassName) && {obj}.spec.runtimeClassName != ''"
        f" && !({obj}.spec.runtimeClassName in {cel(sorted(args.plain_runtime_classes))})"
    )


def judged_whole(args: GuardSettings) -> tuple[str, str]:
    """The `creating` variable: the request is judged as the pod's create (a CREATE, a last gate removed, or a pod
    entering the guard's scope)."""
    entering = entering_scope(args.scope, nvidia_runtime(args, "oldObject"))
    return ("creating", JUDGED_WHOLE + (f" || ({entering})" if entering else ""))


def _new_ephemeral() -> str:
    """On `kubectl debug`'s UPDATE, the ephemeral containers oldObject lacks, by name: names are unique
    in a pod and existing ephemeral containers cannot change, so one string compare per pair."""
    return (
        "request.subResource != 'ephemeralcontainers' || !has(object.spec.ephemeralContainers) ? []"
        " : object.spec.ephemeralContainers.filter(c, oldObject == null || !has(oldObject.spec.ephemeralContainers)"
        " || !oldObject.spec.ephemeralContainers.exists(o, o.name == c.name))"
    )


def variables(args: GuardSettings) -> list[tuple[str, str]]:
    allowed_paths = cel(sorted(args.allowed_host_paths))
    return [
        judged_whole(args),
        # What this request adds. CREATE: every container. UPDATE: only `kubectl debug`'s new ephemeral
        # containers; a pod update may change nothing else of a container but its image (the API server's
        # ValidatePodUpdate, which runs before validating admission), and no rule here reads the image.
        ("regularContainers", f"variables.creating ? {_listed('object', CONTAINER_KINDS[:2])} : []"),
        (
            "debugContainers",
            f"variables.creating ? {_listed('object', CONTAINER_KINDS[2:])} : {_new_ephemeral()}",
        ),
        ("containers", "dyn(variables.regularContainers) + dyn(variables.debugContainers)"),
        ("nvidiaRuntime", nvidia_runtime(args)),
        # The kubelet refuses a pod whose os.name is not its node's; Windows paths follow other rules.
        ("linux", "!has(object.spec.os) || object.spec.os.name != 'windows'"),
        (
            "hostPathVolumes",
            "has(object.spec.volumes) ? object.spec.volumes.filter(v, has(v.hostPath)).map(v, v.name) : []",
        ),
        (
            "allowedHostPathVolumes",
            "has(object.spec.volumes) ? object.spec.volumes.filter(v, has(v.hostPath)"
            f" && v.hostPath.path in {allowed_paths}).map(v, v.name) : []",
        ),
        fast_path(args),
    ]


def _sets_no_gpu(env: str) -> str:
    return f"{env}.name == {cel(VISIBLE_DEVICES_ENV)} && has({env}.value) && {env}.value in {cel(list(NO_GPU_VALUES))}"


def _requests_nvidia(c: str) -> str:
    return (
        f"has({c}.resources) && has({c}.resources.limits) && {c}.resources.limits.exists(k,"
        f" k.matches({cel(NVIDIA_RESOURCE_PATTERN)}) && {c}.resources.limits[k].matches({cel(POSITIVE_QUANTITY)}))"
    )


def _requests_unlisted_dra_resource(c: str, allowed_classes: list[str]) -> str:
    """A container asks, in its requests or its limits, for a DRA extended resource of a class the stack does not
    allow. Both maps: the scheduler reads requests (an extended resource given only there is still allocated)."""
    allowed = cel(sorted(DRA_EXTENDED_RESOURCE_PREFIX + name for name in allowed_classes))
    unlisted = f"k.startsWith({cel(DRA_EXTENDED_RESOURCE_PREFIX)}) && !(k in {allowed})"
    either = " || ".join(
        f"(has({c}.resources.{part}) && {c}.resources.{part}.exists(k, {unlisted}))" for part in ("limits", "requests")
    )
    return f"has({c}.resources) && ({either})"


def _gpu_request_or_void(c: str) -> str:
    """A container under an NVIDIA runtime passes: it requests a GPU, or says void."""
    return f"({_requests_nvidia(c)}) || (has({c}.env) && {c}.env.exists(e, {_sets_no_gpu('e')}))"


def _visible_not_void(e: str) -> str:
    return f"{e}.name == {cel(VISIBLE_DEVICES_ENV)} && !({_sets_no_gpu(e)})"


def _feature_env(e: str) -> str:
    return f"{e}.name in {cel(list(TOOLKIT_FEATURE_ENV))}"


def _device_prefix(f: str) -> str:
    return f"has({f}.prefix) && {f}.prefix != '' && {cel(list(DEVICE_ENV))}.exists(n, n.startsWith({f}.prefix))"


def _privileged(c: str) -> str:
    return f"has({c}.securityContext) && has({c}.securityContext.privileged) && {c}.securityContext.privileged"


def _host_mount_ok(m: str) -> str:
    # A volume that is not allowed at all is host-path-volumes' to report, on CREATE; a debug container added
    # later may not mount it either.
    return (
        f"!({m}.name in variables.hostPathVolumes) || ({m}.name in variables.allowedHostPathVolumes"
        f" ? has({m}.readOnly) && {m}.readOnly : variables.creating)"
    )


def _normal_mount(m: str) -> str:
    return f"{m}.mountPath.startsWith('/') && !{m}.mountPath.matches({cel(PARENT_SEGMENT_PATTERN)})"


def _no_request_mount(m: str) -> str:
    return " && ".join(f"!{m}.mountPath.matches({cel(p)})" for p in DEVICE_REQUEST_PATTERNS)


def _names_visible_devices(c: str) -> str:
    return f"has({c}.env) && {c}.env.exists(e, e.name == {cel(VISIBLE_DEVICES_ENV)})"


def _capability_pattern(allowed: list[str]) -> str:
    return "(?i)^(CAP_)?(" + "|".join(sorted(allowed)) + ")$" if allowed else "^$"


def _adds_only(c: str, allowed: list[str]) -> str:
    return (
        f"!has({c}.securityContext) || !has({c}.securityContext.capabilities)"
        f" || !has({c}.securityContext.capabilities.add) || {c}.securityContext.capabilities.add.all(a,"
        f" a.matches({cel(_capability_pattern(allowed))}))"
    )


def container_checks(c: str, args: GuardSettings, capabilities: list[str]) -> list[str]:
    """Every per-container rule at once, each list of the container read once: the fast path's one scan. Each part
    is its rule's own predicate (an env entry that is neither route cannot start NVIDIA_, so most stop there)."""
    env_prefix = os.path.commonprefix(list(DEVICE_ENV))  # noqa: RUF071 (the names' shared start, NVIDIA_)
    allowed_classes = [*args.allowed_device_classes, *args.gpu_device_classes]
    return [
        f"!has({c}.env) || {c}.env.all(e, !e.name.startsWith({cel(env_prefix)})"
        f" || !({_visible_not_void('e')} || {_feature_env('e')}))",
        f"!variables.nvidiaRuntime || {_gpu_request_or_void(c)}",
        f"!has({c}.envFrom) || !{c}.envFrom.exists(f, {_device_prefix('f')})",
        f"!has({c}.volumeMounts) || {c}.volumeMounts.all(m, ({_host_mount_ok('m')})"
        f" && (!variables.linux || ({_normal_mount('m')} && {_no_request_mount('m')})))",
        f"!({_privileged(c)})",
        _adds_only(c, capabilities),
        f"!({_requests_unlisted_dra_resource(c, allowed_classes)})",
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


def _spec_flag(field: str) -> str:
    return f"(has(object.spec.{field}) && object.spec.{field})"


def rules(args: GuardSettings) -> list[Rule]:
    mounts = (
        f"variables.{FAST_PATH} || variables.containers.all(c, !has(c.volumeMounts) || c.volumeMounts.all(m, {{}}))"
    )
    debug_capabilities = sorted({*args.allowed_capabilities, *DEBUG_CAPABILITIES})
    fast = f"variables.{FAST_PATH} || "
    return [
        Rule(
            "node-name",
            "!variables.creating || !has(object.spec.nodeName) || object.spec.nodeName == ''",
            "spec.nodeName skips the scheduler, and the kubelet then drops any NVIDIA request its node does not "
            "serve, leaving the image's NVIDIA_VISIBLE_DEVICES (=all in CUDA images) to pick the GPUs: choose the "
            "node with nodeSelector kubernetes.io/hostname or node affinity instead",
        ),
        Rule(
            "host-namespaces",
            "!variables.creating || !(" + " || ".join(_spec_flag(f) for f in HOST_NAMESPACE_FIELDS) + ")",
            "hostPID, hostIPC and hostNetwork are not allowed here: the host's process namespace reaches other "
            "workloads' open GPU devices, its network host-local GPU services (a DCGM host engine)",
        ),
        Rule(
            "gpu-runtime-needs-a-request",
            f"{fast}!variables.nvidiaRuntime || variables.containers.all(c, {_gpu_request_or_void('c')})",
            "under an NVIDIA runtime class (any RuntimeClass the stack does not list as plain) every container, init "
            f"and debug containers too, must {REQUEST} with a positive quantity, or set env "
            "NVIDIA_VISIBLE_DEVICES=void: otherwise the image's own NVIDIA_VISIBLE_DEVICES (=all in CUDA images) "
            "decides which GPUs it sees",
        ),
        Rule(
            "visible-devices-env",
            f"{fast}!variables.containers.exists(c, has(c.env) && c.env.exists(e, {_visible_not_void('e')}))",
            "containers may set NVIDIA_VISIBLE_DEVICES only to void or none (no GPU), as a literal value: "
            f"to get a GPU, {REQUEST} and the device plugin chooses it",
        ),
        Rule(
            "toolkit-feature-env",
            f"{fast}!variables.containers.exists(c, has(c.env) && c.env.exists(e, {_feature_env('e')}))",
            f"containers may not set {', '.join(TOOLKIT_FEATURE_ENV)}: they make the NVIDIA toolkit add the node's "
            "NVSwitch, InfiniBand, GPUDirect Storage, GDRCopy or IMEX devices, shared with every other workload: drop "
            "them, or ask the platform team to exempt a namespace trusted with them",
        ),
        Rule(
            "visible-devices-env-from",
            f"{fast}!variables.containers.exists(c, has(c.envFrom) && c.envFrom.exists(f, {_device_prefix('f')}))",
            "an envFrom prefix may not begin NVIDIA_VISIBLE_DEVICES or a toolkit feature variable (the kubelet "
            "prepends it to each key, and the result picks devices past the device plugin): choose another prefix",
        ),
        Rule(
            "host-path-volumes",
            "!variables.creating || size(variables.hostPathVolumes) == size(variables.allowedHostPathVolumes)",
            "hostPath volumes are not allowed in this namespace (a host path can reach GPU devices, the "
            "kubelet's device-plugin socket, the container runtime or the toolkit's config); ask the platform "
            "team to allow the exact path (guard.allowedHostPaths), read-only",
        ),
        Rule(
            "host-path-mounts-read-only",
            mounts.format(_host_mount_ok("m")),
            "a hostPath volume may only be mounted with readOnly: true, and only one this namespace allows",
        ),
        Rule(
            "mount-paths-normal",
            "!variables.linux || " + mounts.format(_normal_mount("m")),
            "mountPath must be absolute, without a .. segment (write it in normal form): the NVIDIA toolkit resolves "
            "paths before it reads device requests from them",
        ),
        Rule(
            "device-request-mounts",
            "!variables.linux || " + mounts.format(_no_request_mount("m")),
            f"nothing may be mounted at or under {DEVICE_REQUEST_DIR} (or a path that merely starts with it, "
            f"however spelt): the NVIDIA toolkit reads device requests there; {REQUEST}",
        ),
        Rule(
            "privileged",
            f"{fast}!variables.containers.exists(c, {_privileged('c')})",
            f"privileged containers see every GPU of the node: drop privileged and {REQUEST}",
        ),
        Rule(
            "capabilities",
            f"{fast}variables.regularContainers.all(c, {_adds_only('c', args.allowed_capabilities)})"
            f" && variables.debugContainers.all(c, {_adds_only('c', debug_capabilities)})",
            "a container may add only the capabilities this namespace allows ("
            + (", ".join(sorted(args.allowed_capabilities)) or "none")
            + "; a kubectl debug container also "
            + ", ".join(DEBUG_CAPABILITIES)
            + "); the NVIDIA toolkit treats SYS_ADMIN (in any spelling) as privileged: every GPU",
        ),
        Rule(
            "cdi-annotations",
            "!(has(object.metadata.annotations) && object.metadata.annotations.exists(k,"
            f" k.matches({cel(CDI_ANNOTATION_PATTERN)}) && (variables.creating || oldObject == null"
            " || !has(oldObject.metadata.annotations) || !(k in oldObject.metadata.annotations)"
            " || oldObject.metadata.annotations[k] != object.metadata.annotations[k])))",
            f"annotations in the {CDI_ANNOTATION_DOMAIN} domain (cdi.k8s.io/..., nvidia.cdi.k8s.io/...) inject "
            f"devices directly, past the device plugin: {REQUEST}",
        ),
        Rule(
            "dra-extended-resources",
            # The stack's own classes too: they select only exposed UUIDs, and the scheduler's claim for such a
            # request is of that class, judged by the claims policy and counted by the class quota.
            f"{fast}!variables.containers.exists(c, "
            f"{_requests_unlisted_dra_resource('c', [*args.allowed_device_classes, *args.gpu_device_classes])})",
            f"{DRA_EXTENDED_RESOURCE_PREFIX}<class> resources are allocated through Dynamic Resource Allocation from "
            "any device the class selects, hidden GPUs included, with no claim and no quota; only the stack's own "
            f"classes ({', '.join(sorted(args.gpu_device_classes)) or 'none'}) and those in guard.allowedDeviceClasses "
            f"({', '.join(sorted(args.allowed_device_classes)) or 'none'}) may be requested here: {REQUEST}",
        ),
    ]


ENV_KEY_RULE = Rule(
    "no-visible-devices-key",
    f"!has(object.data) || !object.data.exists(k, k in {cel(list(DEVICE_ENV))})",
    "ConfigMaps and Secrets here may not carry a key NVIDIA_VISIBLE_DEVICES (or "
    + ", ".join(TOOLKIT_FEATURE_ENV)
    + "): a container's envFrom would turn it into a variable that picks devices, over the device plugin's "
    "choice; set env NVIDIA_VISIBLE_DEVICES=void in the container instead, or request a GPU",
)


def void_variables() -> list[tuple[str, str]]:
    """Per container kind, the names of the new containers the pod rules would deny for want of a GPU request:
    no positive NVIDIA request and no NVIDIA_VISIBLE_DEVICES of their own. New: every one on CREATE; on UPDATE
    (`kubectl debug`) those oldObject lacks. A container that requests a GPU is never among them."""
    result = [CREATING]
    for kind in CONTAINER_KINDS:
        new = (
            f"variables.creating || oldObject == null || !has(oldObject.spec.{kind})"
            f" || !oldObject.spec.{kind}.exists(o, o.name == c.name)"
        )
        result.append(
            (
                f"{kind}ToVoid",
                f"!has(object.spec.{kind}) ? [] : object.spec.{kind}.filter(c, !({_requests_nvidia('c')})"
                f" && !({_names_visible_devices('c')}) && ({new})).map(c, c.name)",
            )
        )
    return result


def void_mutation() -> str:
    """CEL: an apply configuration that adds NVIDIA_VISIBLE_DEVICES=void to exactly the containers
    void_variables names. Pod container lists and env are lists keyed by name, so the API server's
    merge keeps every container and variable it does not name (docs/security.md has the lines)."""

    def named(kind: str) -> str:
        item = f"Object.spec.{kind}"
        env = f"{item}.env{{name: {cel(VISIBLE_DEVICES_ENV)}, value: {cel(VOID)}}}"
        return f"variables.{kind}ToVoid.map(n, {item}{{name: n, env: [{env}]}})"

    fields = ", ".join(f"{kind}: {named(kind)}" for kind in CONTAINER_KINDS)
    return f"Object{{spec: Object.spec{{{fields}}}}}"


def denial(rule: Rule) -> str:
    """What a denied user reads: which rule, why, and what to do instead."""
    return f"{PROJECT} guard, rule {rule.name}: {rule.message}"


def namespace_selector(args: GuardSettings) -> dict[str, list[dict[str, Any]]]:
    """The label selector (wire form) of the namespaces the policies judge: not one exempt by name (the API server's
    own immutable `kubernetes.io/metadata.name` label), nor one carrying an exempt label pair. In the match
    constraints, not the match conditions: the API server evaluates match conditions with `namespaceObject` null
    (k8s.io/apiserver v0.36.3 pkg/admission/plugin/webhook/matchconditions/matcher.go:82-85), and converts the whole
    object to evaluate one (issue 43: a name exemption there was 13-15% of the guard's cost on v1.36.3). `NotIn` also
    matches a namespace without the key; the expressions are ANDed."""
    by_name = {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": sorted(args.exempt_namespaces)}
    by_label = [
        {"key": key, "operator": "NotIn", "values": [value]}
        for key, value in sorted(args.exempt_namespace_labels.items())
    ]
    return {"matchExpressions": [by_name, *by_label]}


def resource_rule(resources: list[str]) -> dict[str, list[str]]:
    """Creates and updates of these core (v1) resources and subresources, in wire names."""
    return {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": resources}


# Claims and templates are judged when created: their spec is immutable (kubernetes v1.36.3
# pkg/apis/resource/validation/validation.go:116-122, 621-626). And a claim again when the scheduler's status write
# allocates it or reserves it for one more pod (the subresource `resourceclaims/status`): a claim made while the guard
# only warned is then never allocated, nor handed to a new pod (issue 40, 1); deallocation passes. Requests through
# v1beta1/v1beta2 match too (matchPolicy Equivalent, the default), converted to v1.
CLAIMS_RULE = {
    "apiGroups": [DRA_GROUP],
    "apiVersions": [DRA_VERSION],
    "operations": ["CREATE", "UPDATE"],
    "resources": ["resourceclaims", "resourceclaimtemplates", "resourceclaims/status"],
}


def _given(field: str) -> str:
    """CEL: the field is there and not null. The API server hands a policy a claim's `null` as written (`requests:
    null` has it, then fails "got 'types.Null', expected iterable type"): null reads as absent, as the API does."""
    return f"(has({field}) && {field} != null)"


def _reservations(obj: str) -> str:
    return f"({_given(obj + '.status')} && {_given(obj + '.status.reservedFor')} ? {obj}.status.reservedFor : [])"


def _allocated(obj: str) -> str:
    return f"({_given(obj + '.status')} && {_given(obj + '.status.allocation')})"


def claim_variables() -> list[tuple[str, str]]:
    """Whether the request is judged (a create; a status write that allocates the claim or reserves it for one more
    pod), and then its device requests, or a template's (under spec.spec); none otherwise, so every rule passes.
    `dyn`: the two kinds have different types."""
    return [
        (
            "judged",
            "request.operation == 'CREATE' || (request.subResource == 'status' && oldObject != null && ("
            f"(!{_allocated('oldObject')} && {_allocated('object')})"
            # A consumer the old list lacks, by uid: a swap that keeps the count is a new reservation too.
            f" || {_reservations('object')}.exists(r, !{_reservations('oldObject')}.exists(o, o.uid == r.uid))))",
        ),
        (
            "claimSpec",
            "request.kind.kind == 'ResourceClaimTemplate' ? dyn(object).spec.spec : dyn(object).spec",
        ),
        (
            "requests",
            f"variables.judged && {_given('variables.claimSpec.devices')}"
            f" && {_given('variables.claimSpec.devices.requests')} ? variables.claimSpec.devices.requests : []",
        ),
    ]


def _every_alternative(check: str) -> str:
    """CEL: `check` (over `d`) holds for each request's `exactly` and for each of its `firstAvailable`
    alternatives, which name their own classes (the allocator takes the first it can satisfy)."""
    return (
        f"variables.requests.all(r, (!{_given('r.exactly')} || [r.exactly].all(d, {check}))"
        f" && (!{_given('r.firstAvailable')} || r.firstAvailable.all(d, {check})))"
    )


def claim_rules(args: GuardSettings) -> list[Rule]:
    tenant_classes = sorted({*args.allowed_device_classes, *args.gpu_device_classes})
    ours = cel(sorted(args.gpu_device_classes))
    return [
        Rule(
            "claim-device-classes",
            _every_alternative(f"d.deviceClassName in {cel(tenant_classes)}"),
            "a claim may name only the DeviceClasses this stack lets tenants use ("
            + (", ".join(tenant_classes) or "none")
            + "): any other class selects whatever devices it matches, hidden GPUs included; for a GPU, "
            f"{REQUEST}" + (", or claim from the stack's own classes" if args.gpu_device_classes else ""),
        ),
        Rule(
            "claim-admin-access",
            f"variables.requests.all(r, !{_given('r.exactly')} || !{_given('r.exactly.adminAccess')}"
            " || !r.exactly.adminAccess)",
            "adminAccess reaches devices already allocated to other pods, whatever their class: not here",
        ),
        Rule(
            "claim-tolerations",
            _every_alternative(f"!{_given('d.tolerations')} || size(d.tolerations) == 0"),
            "a claim may not tolerate device taints: the platform taints the devices no tenant may have",
        ),
        Rule(
            "claim-exact-count",
            _every_alternative(
                f"!(d.deviceClassName in {ours}) || !{_given('d.allocationMode')} || d.allocationMode == 'ExactCount'"
            ),
            "claims from the stack's GPU classes ask for an exact count (allocationMode ExactCount, the default), "
            "which the namespace's quota caps",
        ),
    ]


def policy_specs(args: GuardSettings) -> tuple[PolicySpec, ...]:
    """The three ValidatingAdmissionPolicies: over pods, over the keys envFrom turns into env, and over the
    DeviceClasses tenants' claims name."""
    return (
        PolicySpec(
            POLICY_NAME,
            resource_rule(POD_RESOURCES),
            variables(args),
            rules(args),
            scope_conditions(args.scope, nvidia_runtime(args)),
        ),
        PolicySpec(ENV_KEYS_POLICY_NAME, resource_rule(ENV_KEYS_RESOURCES), [], [ENV_KEY_RULE]),
        PolicySpec(CLAIMS_POLICY_NAME, CLAIMS_RULE, claim_variables(), claim_rules(args)),
    )
