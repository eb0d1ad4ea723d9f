"""One node's entry from a stack file, validated exactly as `pulumi up` validates it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from common.cli import UsageError

if TYPE_CHECKING:
    from stack_config import NodeConfig


def stack_node(stack_file: Path, node_name: str) -> NodeConfig:
    # Imported here: listing GPUs must stay light, only the stack-reading modes need pydantic.
    from stack_config import load_stack_file  # noqa: PLC0415

    stack = load_stack_file(stack_file)
    node = next((n for n in stack.nodes if n.name == node_name), None)
    if node is None:
        names = ", ".join(n.name for n in stack.nodes)
        raise UsageError(f"--node {node_name}: not in {stack_file} (nodes: {names})")
    return node
