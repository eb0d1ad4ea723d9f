"""StackRecord: what a stack hides, written into the cluster it hides it in.

`cluster.release` and `cluster.verify` read every stack's record from the cluster they talk to, so
"does any stack still hide this node" is answered by the cluster, not by whichever file an operator
handed them. Deleted on destroy (unlike the node patches): a destroyed stack no longer claims its nodes.
"""

import typing
from collections.abc import Mapping, Sequence
from typing import TypedDict

import pulumi
import pulumi_kubernetes as k8s

from common.names import PART_OF, PART_OF_LABEL, STACK_LABEL, stack_record_name
from common.tokens import Token
from desired.stack_claims import record_data


class StackRecordArgs(TypedDict):
    stack: str
    """The Pulumi stack's name."""
    namespace: pulumi.Input[str]
    """Where the record lives: the plugin namespace."""
    exposed: pulumi.Input[Mapping[str, pulumi.Input[Sequence[pulumi.Input[str]]]]]
    """Node name -> the UUIDs it exposes (never a hidden one: the cluster must not learn those). May be an Output, or
    hold them (a HiddenGpuNode's `summary`, a node named by an Output): the record's data is then one too."""


class StackRecord(pulumi.ComponentResource):
    """One ConfigMap, `hidden-gpu-stack-<stack>`, labelled with the stack's name."""

    config_map: k8s.core.v1.ConfigMap

    def __init__(self, name: str, args: StackRecordArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(Token.STACK_RECORD, name, None, opts)
        self.config_map = k8s.core.v1.ConfigMap(
            f"{name}-config-map",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=stack_record_name(args["stack"]),
                namespace=args["namespace"],
                labels={PART_OF_LABEL: PART_OF, STACK_LABEL: stack_record_name(args["stack"])},
            ),
            # from_input unwraps every Output within, which its type does not say.
            data=pulumi.Output.from_input(args["exposed"]).apply(
                lambda exposed: record_data(args["stack"], typing.cast(Mapping[str, Sequence[str]], exposed))
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"name": self.config_map.metadata.name})
