"""What the access guard's policies are written from and written as: a stack's guard settings, a rule, a policy,
and CEL literals. Plain data (no Pulumi): the components, cluster.verify and the policy pack read it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from common.names import GuardMode, GuardScope
from desired.node_labels import gpu_device_classes
from stack_config.guard_config import GuardConfig
from stack_config.models import StackConfig

# How a denial tells a tenant to get a GPU the allowed way.
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
