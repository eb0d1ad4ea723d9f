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

from typing import Any

from common.names import (
    CDI_ANNOTATION_DOMAIN,
    CDI_ANNOTATION_PATTERN,
    CLAIMS_POLICY_NAME,
    DEBUG_CAPABILITIES,
    DEVICE_ENV,
    DEVICE_REQUEST_DIR,
    DRA_EXTENDED_RESOURCE_PREFIX,
    ENV_KEYS_POLICY_NAME,
    HOST_NAMESPACE_FIELDS,
    NAMESPACE_NAME_LABEL,
    NO_GPU_VALUES,
    POLICY_NAME,
    PROJECT,
    TOOLKIT_FEATURE_ENV,
    VISIBLE_DEVICES_ENV,
    GuardMode,
)
from desired.claim_rules import CLAIMS_RULE, claim_rules, claim_variables
from desired.guard_scope import entering_scope, scope_conditions
from desired.guard_settings import REQUEST, GuardSettings, PolicySpec, Rule, cel
from desired.pod_checks import (
    FAST_PATH,
    adds_only,
    device_prefix,
    fast_path,
    feature_env,
    gpu_request_or_void,
    host_mount_ok,
    names_visible_devices,
    no_request_mount,
    normal_mount,
    privileged,
    requests_nvidia,
    requests_unlisted_dra_resource,
    visible_not_void,
)

VALIDATION_ACTIONS = {GuardMode.ENFORCE: ["Deny"], GuardMode.WARN: ["Warn", "Audit"], GuardMode.AUDIT: ["Audit"]}
# Pods, and `kubectl debug`'s way of adding a container to a running one.
POD_RESOURCES = ["pods", "pods/ephemeralcontainers"]
# What envFrom turns into environment variables.
ENV_KEYS_RESOURCES = ["configmaps", "secrets"]
# The pod's container lists, in the order the kubelet starts them.
CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")
# Both pod policies judge CREATE and UPDATE apart.
CREATING = ("creating", "request.operation == 'CREATE'")
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
            f"{fast}!variables.nvidiaRuntime || variables.containers.all(c, {gpu_request_or_void('c')})",
            "under an NVIDIA runtime class (any RuntimeClass the stack does not list as plain) every container, init "
            f"and debug containers too, must {REQUEST} with a positive quantity, or set env "
            "NVIDIA_VISIBLE_DEVICES=void: otherwise the image's own NVIDIA_VISIBLE_DEVICES (=all in CUDA images) "
            "decides which GPUs it sees",
        ),
        Rule(
            "visible-devices-env",
            f"{fast}!variables.containers.exists(c, has(c.env) && c.env.exists(e, {visible_not_void('e')}))",
            "containers may set NVIDIA_VISIBLE_DEVICES only to void or none (no GPU), as a literal value: "
            f"to get a GPU, {REQUEST} and the device plugin chooses it",
        ),
        Rule(
            "toolkit-feature-env",
            f"{fast}!variables.containers.exists(c, has(c.env) && c.env.exists(e, {feature_env('e')}))",
            f"containers may not set {', '.join(TOOLKIT_FEATURE_ENV)}: they make the NVIDIA toolkit add the node's "
            "NVSwitch, InfiniBand, GPUDirect Storage, GDRCopy or IMEX devices, shared with every other workload: drop "
            "them, or ask the platform team to exempt a namespace trusted with them",
        ),
        Rule(
            "visible-devices-env-from",
            f"{fast}!variables.containers.exists(c, has(c.envFrom) && c.envFrom.exists(f, {device_prefix('f')}))",
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
            mounts.format(host_mount_ok("m")),
            "a hostPath volume may only be mounted with readOnly: true, and only one this namespace allows",
        ),
        Rule(
            "mount-paths-normal",
            "!variables.linux || " + mounts.format(normal_mount("m")),
            "mountPath must be absolute, without a .. segment (write it in normal form): the NVIDIA toolkit resolves "
            "paths before it reads device requests from them",
        ),
        Rule(
            "device-request-mounts",
            "!variables.linux || " + mounts.format(no_request_mount("m")),
            f"nothing may be mounted at or under {DEVICE_REQUEST_DIR} (or a path that merely starts with it, "
            f"however spelt): the NVIDIA toolkit reads device requests there; {REQUEST}",
        ),
        Rule(
            "privileged",
            f"{fast}!variables.containers.exists(c, {privileged('c')})",
            f"privileged containers see every GPU of the node: drop privileged and {REQUEST}",
        ),
        Rule(
            "capabilities",
            f"{fast}variables.regularContainers.all(c, {adds_only('c', args.allowed_capabilities)})"
            f" && variables.debugContainers.all(c, {adds_only('c', debug_capabilities)})",
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
            f"{requests_unlisted_dra_resource('c', [*args.allowed_device_classes, *args.gpu_device_classes])})",
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
                f"!has(object.spec.{kind}) ? [] : object.spec.{kind}.filter(c, !({requests_nvidia('c')})"
                f" && !({names_visible_devices('c')}) && ({new})).map(c, c.name)",
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
