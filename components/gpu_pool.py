"""GpuPool: one RuntimeClass for a pool of interchangeable shared nodes."""

from typing import TypedDict

import pulumi
import pulumi_kubernetes as k8s

from common.names import pool_class_name
from common.tokens import Token
from components.inputs import as_args
from desired.pods import pool_class


class GpuPoolArgs(TypedDict):
    """A TypedDict: what Pulumi's component provider hands the component (package/)."""

    pool: str
    """The pool's name, as the nodes' `pool:` key says it; the node patches label them with it."""


class GpuPool(pulumi.ComponentResource):
    """A workload that names the pool's RuntimeClass lands on any node of the pool (the scheduler
    picks one with a free exposed GPU), instead of on one named node."""

    runtime_class: k8s.node.v1.RuntimeClass
    """`hidden-gpu-pool-<pool>`: handler nvidia, scheduled onto the nodes labelled with the pool."""

    def __init__(self, name: str, args: GpuPoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(Token.GPU_POOL, name, None, opts)
        declared = pool_class(args["pool"])
        self.runtime_class = k8s.node.v1.RuntimeClass(
            f"{name}-runtime-class",
            metadata=as_args(declared["metadata"]),
            handler=declared["handler"],
            scheduling=as_args(declared["scheduling"]),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"runtimeClass": pool_class_name(args["pool"])})
