"""AccessGuard: the admission policies of desired/guard_rules.py, as retained Kubernetes objects."""

# No `from __future__ import annotations`: Pulumi's analyzer (package/) reads the annotations as types.
import typing
from typing import NotRequired, TypedDict

import pulumi
import pulumi_kubernetes as k8s

from common.names import (
    FIELD_MANAGER,
    FIELD_MANAGER_ANNOTATION,
    PART_OF,
    PART_OF_LABEL,
    PATCH_FORCE_ANNOTATION,
    VOID_POLICY_NAME,
)
from common.tokens import Token
from components.stack_types import GuardSpec
from desired.guard_rules import (
    POD_RESOURCES,
    VALIDATION_ACTIONS,
    denial,
    namespace_selector,
    nvidia_runtime,
    policy_specs,
    resource_rule,
    void_mutation,
    void_variables,
)
from desired.guard_settings import GuardSettings, PolicySpec
from desired.node_labels import gpu_device_classes
from desired.node_switches import POLICY_NAME as NODE_SWITCHES
from desired.node_switches import VALIDATION_ACTIONS as NODE_SWITCHES_ACTIONS
from desired.node_switches import policy_spec as node_switches_spec
from stack_config.errors import as_written, validated
from stack_config.guard_config import GuardConfig
from stack_config.models import StackConfig
from stack_config.values import NamespaceName, ObjectName


def _rule(rule: dict[str, list[str]]) -> k8s.admissionregistration.v1.NamedRuleWithOperationsArgs:
    """A resource rule in wire names, as the SDK's args."""
    return k8s.admissionregistration.v1.NamedRuleWithOperationsArgs(
        api_groups=rule["apiGroups"],
        api_versions=rule["apiVersions"],
        operations=rule["operations"],
        resources=rule["resources"],
    )


def _match(rule: dict[str, list[str]], args: GuardSettings) -> k8s.admissionregistration.v1.MatchResourcesArgs:
    """What this resource rule matches, in every namespace but the exempt ones (by name or label)."""
    return k8s.admissionregistration.v1.MatchResourcesArgs(
        namespace_selector=k8s.meta.v1.LabelSelectorArgs(
            match_expressions=[
                k8s.meta.v1.LabelSelectorRequirementArgs(**requirement)
                for requirement in namespace_selector(args)["matchExpressions"]
            ]
        ),
        resource_rules=[_rule(rule)],
    )


def _metadata(name: str) -> k8s.meta.v1.ObjectMetaArgs:
    # Retained on delete, so a later `up` (this stack's or a new one's) must take the objects back: one
    # well-known field manager, forcing over whoever changed them meanwhile.
    return k8s.meta.v1.ObjectMetaArgs(
        name=name,
        labels={PART_OF_LABEL: PART_OF},
        annotations={FIELD_MANAGER_ANNOTATION: FIELD_MANAGER, PATCH_FORCE_ANNOTATION: "true"},
    )


def _variable_args(named: list[tuple[str, str]]) -> list[k8s.admissionregistration.v1.VariableArgs]:
    return [k8s.admissionregistration.v1.VariableArgs(name=name, expression=expression) for name, expression in named]


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
        spec = node_switches_spec()
        v1 = k8s.admissionregistration.v1
        policy = v1.ValidatingAdmissionPolicy(
            f"{name}-node-switches-policy",
            metadata=_metadata(NODE_SWITCHES),
            spec=v1.ValidatingAdmissionPolicySpecArgs(
                failure_policy=spec["failurePolicy"],
                match_constraints=v1.MatchResourcesArgs(
                    resource_rules=[_rule(rule) for rule in spec["matchConstraints"]["resourceRules"]]
                ),
                match_conditions=[v1.MatchConditionArgs(**condition) for condition in spec["matchConditions"]],
                variables=[v1.VariableArgs(**variable) for variable in spec["variables"]],
                validations=[
                    v1.ValidationArgs(
                        expression=check["expression"],
                        message=check["message"],
                        message_expression=check["messageExpression"],
                        reason=check["reason"],
                    )
                    for check in spec["validations"]
                ],
            ),
            opts=self._retained,
        )
        binding = v1.ValidatingAdmissionPolicyBinding(
            f"{name}-node-switches-binding",
            metadata=_metadata(NODE_SWITCHES),
            spec=v1.ValidatingAdmissionPolicyBindingSpecArgs(
                policy_name=policy.metadata.name, validation_actions=NODE_SWITCHES_ACTIONS
            ),
            opts=self._retained,
        )
        return policy, binding

    def _void_policy(self, policy_resource: str, binding_resource: str, args: GuardSettings) -> None:
        policy = k8s.admissionregistration.v1.MutatingAdmissionPolicy(
            policy_resource,
            metadata=_metadata(VOID_POLICY_NAME),
            spec=k8s.admissionregistration.v1.MutatingAdmissionPolicySpecArgs(
                failure_policy="Fail",
                # A sidecar a webhook injects after this policy ran gets its void on the second pass.
                reinvocation_policy="IfNeeded",
                match_constraints=_match(resource_rule(POD_RESOURCES), args),
                match_conditions=[
                    k8s.admissionregistration.v1.MatchConditionArgs(
                        name="nvidia-runtime", expression=nvidia_runtime(args)
                    ),
                ],
                variables=_variable_args(void_variables()),
                mutations=[
                    k8s.admissionregistration.v1.MutationArgs(
                        patch_type="ApplyConfiguration",
                        apply_configuration=k8s.admissionregistration.v1.ApplyConfigurationArgs(
                            expression=void_mutation()
                        ),
                    )
                ],
            ),
            opts=self._retained,
        )
        k8s.admissionregistration.v1.MutatingAdmissionPolicyBinding(
            binding_resource,
            metadata=_metadata(VOID_POLICY_NAME),
            spec=k8s.admissionregistration.v1.MutatingAdmissionPolicyBindingSpecArgs(policy_name=policy.metadata.name),
            opts=self._retained,
        )

    def _policy(
        self, policy_resource: str, binding_resource: str, spec: PolicySpec, args: GuardSettings
    ) -> tuple[
        k8s.admissionregistration.v1.ValidatingAdmissionPolicy,
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding,
    ]:
        policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            policy_resource,
            metadata=_metadata(spec.name),
            spec=k8s.admissionregistration.v1.ValidatingAdmissionPolicySpecArgs(
                failure_policy="Fail",
                match_constraints=_match(spec.match, args),
                match_conditions=[
                    k8s.admissionregistration.v1.MatchConditionArgs(name=name, expression=expression)
                    for name, expression in spec.conditions
                ]
                or None,
                variables=_variable_args(spec.variables) or None,
                validations=[
                    k8s.admissionregistration.v1.ValidationArgs(
                        expression=rule.expression, message=denial(rule), reason="Forbidden"
                    )
                    for rule in spec.rules
                ],
            ),
            opts=self._retained,
        )
        binding = k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            binding_resource,
            metadata=_metadata(spec.name),
            spec=k8s.admissionregistration.v1.ValidatingAdmissionPolicyBindingSpecArgs(
                policy_name=policy.metadata.name,
                validation_actions=VALIDATION_ACTIONS[args.mode],
            ),
            opts=self._retained,
        )
        return policy, binding
