"""AccessGuard: an admission policy that keeps pods from reaching GPUs the scheduler did not give them.

Scheduling only decides who gets `nvidia.com/gpu`; the container toolkit still honours a pod's
own NVIDIA_VISIBLE_DEVICES, device-request mounts, privileged containers and CDI annotations.
The expressions use standard CEL only, so tests run them unchanged in a CEL engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from common.names import (
    DEVICE_REQUEST_DIR,
    OPERATOR_RUNTIME_CLASSES,
    PART_OF,
    PART_OF_LABEL,
    POLICY_NAME,
    RUNTIME_CLASS_PREFIX,
    SYS_ADMIN_CAPABILITIES,
    GuardMode,
    Token,
)

VALIDATION_ACTIONS = {GuardMode.ENFORCE: ["Deny"], GuardMode.WARN: ["Warn", "Audit"], GuardMode.AUDIT: ["Audit"]}
# The toolkit's device-request directory, in both spellings a pod may mount it by (/var/run is /run).
DEVICE_REQUEST_MOUNTS = [DEVICE_REQUEST_DIR.removeprefix("/var"), DEVICE_REQUEST_DIR]
# Host paths that lead to GPU device nodes or to the toolkit's device-request mounts.
GPU_HOST_PATHS = ["/dev", *DEVICE_REQUEST_MOUNTS]


def _cel_list(values: list[str]) -> str:
    return json.dumps(sorted(values))  # a JSON list of strings is a CEL list literal


def _under(path: str, roots: list[str]) -> str:
    """CEL: `path` is one of `roots`, below one, or above one (mounting / exposes /dev too)."""
    return (
        f"{_cel_list(roots)}.exists(r, {path} == r || {path}.startsWith(r + '/') "
        f"|| r.startsWith({path}.endsWith('/') ? {path} : {path} + '/'))"
    )


@dataclass(frozen=True)
class Rule:
    name: str
    expression: str
    message: str


VARIABLES = [
    (
        "containers",
        "(has(object.spec.containers) ? object.spec.containers : [])"
        " + (has(object.spec.initContainers) ? object.spec.initContainers : [])"
        " + (has(object.spec.ephemeralContainers) ? object.spec.ephemeralContainers : [])",
    ),
    (
        "hostPaths",
        "has(object.spec.volumes) ? object.spec.volumes.filter(v, has(v.hostPath)).map(v, v.hostPath.path) : []",
    ),
    (
        "nvidiaRuntime",
        f"has(object.spec.runtimeClassName) && (object.spec.runtimeClassName.startsWith('{RUNTIME_CLASS_PREFIX}')"
        f" || object.spec.runtimeClassName in {_cel_list(list(OPERATOR_RUNTIME_CLASSES))})",
    ),
    (
        "requestsGpu",
        "variables.containers.exists(c, has(c.resources) && ("
        "(has(c.resources.limits) && 'nvidia.com/gpu' in c.resources.limits)"
        " || (has(c.resources.requests) && 'nvidia.com/gpu' in c.resources.requests)))",
    ),
]


RULES = [
    Rule(
        "visible-devices-env",
        "!variables.containers.exists(c, has(c.env) && c.env.exists(e, e.name == 'NVIDIA_VISIBLE_DEVICES'))",
        "containers may not set NVIDIA_VISIBLE_DEVICES: request GPUs with resources.limits['nvidia.com/gpu'] "
        "and the device plugin chooses them",
    ),
    Rule(
        "gpu-host-paths",
        "!variables.hostPaths.exists(p, p.contains('..') || " + _under("p", GPU_HOST_PATHS) + ")",
        "hostPath volumes may not reach /dev or the NVIDIA device-request paths: "
        "request GPUs with resources.limits['nvidia.com/gpu'] instead",
    ),
    Rule(
        "device-request-mounts",
        "!variables.containers.exists(c, has(c.volumeMounts) && c.volumeMounts.exists(m, "
        + _under("m.mountPath", DEVICE_REQUEST_MOUNTS)
        + "))",
        "volumes may not be mounted under /var/run/nvidia-container-devices: "
        "request GPUs with resources.limits['nvidia.com/gpu'] instead",
    ),
    Rule(
        "privileged",
        "!variables.containers.exists(c, has(c.securityContext) && has(c.securityContext.privileged)"
        " && c.securityContext.privileged)",
        "privileged containers see every GPU of the node: drop privileged and request "
        "resources.limits['nvidia.com/gpu']",
    ),
    Rule(
        "sys-admin",
        "!variables.containers.exists(c, has(c.securityContext) && has(c.securityContext.capabilities)"
        " && has(c.securityContext.capabilities.add)"
        f" && c.securityContext.capabilities.add.exists(a, a in {_cel_list(list(SYS_ADMIN_CAPABILITIES))}))",
        "the NVIDIA toolkit treats SYS_ADMIN as privileged (every GPU): drop it and request "
        "resources.limits['nvidia.com/gpu']",
    ),
    Rule(
        "cdi-annotations",
        "!(has(object.metadata.annotations) && object.metadata.annotations.exists(k, k.startsWith('cdi.k8s.io/')))",
        "cdi.k8s.io/ annotations inject devices directly: request resources.limits['nvidia.com/gpu'] instead",
    ),
    Rule(
        "gpu-runtime-without-request",
        "!variables.nvidiaRuntime || variables.requestsGpu",
        "a pod using an NVIDIA runtime class must request resources.limits['nvidia.com/gpu']: "
        "without a request the image's own NVIDIA_VISIBLE_DEVICES decides which GPUs it sees",
    ),
]


@dataclass(frozen=True)
class AccessGuardArgs:
    mode: GuardMode
    """enforce (deny), warn (admit, warn, audit) or audit (annotate only)."""
    exempt_namespaces: list[str]
    """Namespaces the guard does not check: trusted system namespaces and the plugin's."""


class AccessGuard(pulumi.ComponentResource):
    """A ValidatingAdmissionPolicy over Pods (and `kubectl debug`'s ephemeral containers) plus its binding."""

    policy: k8s.admissionregistration.v1.ValidatingAdmissionPolicy
    """The rules, in standard CEL."""
    binding: k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding
    """Binds the rules with the mode's validation actions."""

    def __init__(self, name: str, args: AccessGuardArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(Token.ACCESS_GUARD, name, None, opts)
        mode, exempt_namespaces = args.mode, args.exempt_namespaces
        labels = {PART_OF_LABEL: PART_OF}
        self.policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-policy",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=POLICY_NAME, labels=labels),
            spec=k8s.admissionregistration.v1.ValidatingAdmissionPolicySpecArgs(
                failure_policy="Fail",
                match_constraints=k8s.admissionregistration.v1.MatchResourcesArgs(
                    resource_rules=[
                        k8s.admissionregistration.v1.NamedRuleWithOperationsArgs(
                            api_groups=[""],
                            api_versions=["v1"],
                            operations=["CREATE", "UPDATE"],
                            resources=["pods", "pods/ephemeralcontainers"],
                        )
                    ]
                ),
                match_conditions=[
                    k8s.admissionregistration.v1.MatchConditionArgs(
                        name="not-exempt-namespace",
                        expression=f"!(request.namespace in {_cel_list(exempt_namespaces)})",
                    )
                ],
                variables=[
                    k8s.admissionregistration.v1.VariableArgs(name=var_name, expression=expression)
                    for var_name, expression in VARIABLES
                ],
                validations=[
                    k8s.admissionregistration.v1.ValidationArgs(
                        expression=rule.expression, message=rule.message, reason="Forbidden"
                    )
                    for rule in RULES
                ],
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.binding = k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-binding",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=POLICY_NAME, labels=labels),
            spec=k8s.admissionregistration.v1.ValidatingAdmissionPolicyBindingSpecArgs(
                policy_name=self.policy.metadata.name,
                validation_actions=VALIDATION_ACTIONS[mode],
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"policy": self.policy.metadata.name, "mode": str(mode)})
