"""AccessGuard: the admission policies of desired/guard_rules.py, as retained Kubernetes objects."""

# No `from __future__ import annotations`: Pulumi's analyzer (package/) reads the annotations as types.
import typing
from typing import NotRequired, TypedDict

import pulumi
import pulumi_kubernetes as k8s

from common.names import VOID_POLICY_NAME
from common.tokens import Token
from components.inputs import as_args
from components.stack_types import GuardSpec
from desired.guard_objects import binding, node_switches_policy, validating_policy, void_policy
from desired.guard_rules import VALIDATION_ACTIONS, policy_specs
from desired.guard_settings import GuardSettings, PolicySpec
from desired.node_labels import gpu_device_classes
from desired.node_switches import POLICY_NAME as NODE_SWITCHES
from desired.node_switches import VALIDATION_ACTIONS as NODE_SWITCHES_ACTIONS
from stack_config.errors import as_written, validated
from stack_config.guard_config import GuardConfig
from stack_config.models import StackConfig
from stack_config.values import NamespaceName, ObjectName


class AccessGuardArgs(TypedDict):
    """The guard's settings. A TypedDict: what Pulumi's component provider hands the component."""

    guard: GuardSpec
    """The stack's `guard` settings, as the stack file writes them."""
    plugin_namespace: str
    """The device plugin's namespace, which the guard always exempts (its pods mount host paths). Plain, not an Output:
    it is written into every policy's CEL, which the guard composes whole, and a preview must show whom the guard
    exempts."""
    gpu_device_classes: NotRequired[list[str]]
    """The stack's own DeviceClasses (hidden-gpu:dra), which tenants may claim from; none if absent. Plain: they are
    the names of GpuDeviceClasses' resources. The guard takes no node name and no UUID: a composed node's Outputs
    never reach it."""


def guard_args(stack: StackConfig) -> AccessGuardArgs:
    """The args for the guard of a validated stack."""
    return AccessGuardArgs(
        guard=typing.cast(GuardSpec, as_written(stack.guard)),
        plugin_namespace=stack.device_plugin.namespace,
        gpu_device_classes=sorted(gpu_device_classes(stack)),
    )


class AccessGuard(pulumi.ComponentResource):
    """Four ValidatingAdmissionPolicies and their bindings: one over Pods (and `kubectl debug`'s
    ephemeral containers), one over the ConfigMap and Secret keys envFrom would turn into env, one over the
    DeviceClasses ResourceClaims and their templates name, one over the operator switches of hidden nodes; with
    `add_void`, a MutatingAdmissionPolicy that lets new containers without a GPU request pass."""

    policy: k8s.admissionregistration.v1.ValidatingAdmissionPolicy
    """The pod rules, in standard CEL."""
    binding: k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding
    """Binds the pod rules with the mode's validation actions."""
    env_keys_policy: k8s.admissionregistration.v1.ValidatingAdmissionPolicy
    """The ConfigMap and Secret rule."""
    env_keys_binding: k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding
    """Binds the ConfigMap and Secret rule with the same actions."""
    claims_policy: k8s.admissionregistration.v1.ValidatingAdmissionPolicy
    """The DeviceClasses tenants' ResourceClaims and ResourceClaimTemplates may name, and how."""
    claims_binding: k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding
    """Binds the claim rules with the same actions."""
    node_switches_policy: k8s.admissionregistration.v1.ValidatingAdmissionPolicy
    """On a hidden node, the GPU Operator switches hidden-gpu holds off stay off, whoever writes the node."""
    node_switches_binding: k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding
    """Binds it to deny, in every mode: it judges no tenant."""
    adds_void: bool
    """Whether the MutatingAdmissionPolicy that adds NVIDIA_VISIBLE_DEVICES=void (where the pod rules would deny a
    container for want of a request) is declared. The policy and its binding are no outputs: a consumer's YAML
    binds every output's type, and kubernetes provider v4.25.0's schema has no `admissionregistration.k8s.io/v1`
    MutatingAdmissionPolicy (the real tier found it)."""

    def __init__(self, name: str, args: AccessGuardArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(Token.ACCESS_GUARD, name, None, opts)
        guard = validated(GuardConfig, args["guard"], ("guard",))
        # Checked as a namespace name: it is written into the policies' CEL.
        settings = GuardSettings.of_guard(
            guard,
            validated(NamespaceName, args["plugin_namespace"], ("pluginNamespace",)),
            # Checked as object names: they are written into the claims policy's CEL.
            validated(list[ObjectName], args.get("gpu_device_classes", []), ("gpuDeviceClasses",)),
        )
        # Fail closed: `pulumi destroy` keeps the node patches (the nodes stay hidden), so it keeps the guard
        # too; without it a retained node is open to `runtimeClassName: nvidia` + `ENV=all`. Removing it is a
        # deliberate step once every node is released (docs/operations.md).
        self._retained = pulumi.ResourceOptions(parent=self, retain_on_delete=True)
        pods, keys, claims = policy_specs(settings)
        self.policy, self.binding = self._policy(f"{name}-policy", f"{name}-binding", pods, settings)
        self.env_keys_policy, self.env_keys_binding = self._policy(
            f"{name}-env-keys-policy", f"{name}-env-keys-binding", keys, settings
        )
        self.claims_policy, self.claims_binding = self._policy(
            f"{name}-claims-policy", f"{name}-claims-binding", claims, settings
        )
        self.node_switches_policy, self.node_switches_binding = self._node_switches(name)
        self.adds_void = settings.add_void
        if self.adds_void:
            self._void_policy(f"{name}-void-policy", f"{name}-void-binding", settings)
        self.register_outputs(
            {"policy": self.policy.metadata.name, "mode": str(settings.mode), "addsVoid": self.adds_void}
        )

    def _node_switches(
        self, name: str
    ) -> tuple[
        k8s.admissionregistration.v1.ValidatingAdmissionPolicy,
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding,
    ]:
        declared = node_switches_policy()
        v1 = k8s.admissionregistration.v1
        policy = v1.ValidatingAdmissionPolicy(
            f"{name}-node-switches-policy",
            metadata=as_args(declared["metadata"]),
            spec=as_args(declared["spec"]),
            opts=self._retained,
        )
        bound = binding(NODE_SWITCHES, policy.metadata.name, NODE_SWITCHES_ACTIONS)
        return policy, v1.ValidatingAdmissionPolicyBinding(
            f"{name}-node-switches-binding",
            metadata=as_args(bound["metadata"]),
            spec=as_args(bound["spec"]),
            opts=self._retained,
        )

    def _void_policy(self, policy_resource: str, binding_resource: str, args: GuardSettings) -> None:
        declared = void_policy(args)
        policy = k8s.admissionregistration.v1.MutatingAdmissionPolicy(
            policy_resource,
            metadata=as_args(declared["metadata"]),
            spec=as_args(declared["spec"]),
            opts=self._retained,
        )
        bound = binding(VOID_POLICY_NAME, policy.metadata.name)
        k8s.admissionregistration.v1.MutatingAdmissionPolicyBinding(
            binding_resource, metadata=as_args(bound["metadata"]), spec=as_args(bound["spec"]), opts=self._retained
        )

    def _policy(
        self, policy_resource: str, binding_resource: str, spec: PolicySpec, args: GuardSettings
    ) -> tuple[
        k8s.admissionregistration.v1.ValidatingAdmissionPolicy,
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding,
    ]:
        declared = validating_policy(spec, args)
        policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            policy_resource,
            metadata=as_args(declared["metadata"]),
            spec=as_args(declared["spec"]),
            opts=self._retained,
        )
        bound = binding(spec.name, policy.metadata.name, VALIDATION_ACTIONS[args.mode])
        return policy, k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            binding_resource, metadata=as_args(bound["metadata"]), spec=as_args(bound["spec"]), opts=self._retained
        )
