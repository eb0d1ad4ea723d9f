"""What the GPU-host tools share: reading one node from a stack file, and turning failures into
one-line messages and exit statuses instead of tracebacks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tools.cli import EXIT_UNAVAILABLE, EXIT_USAGE, UsageError, print_errors
from tools.nvml import NvmlUnavailableError

if TYPE_CHECKING:
    from stack_config import NodeConfig


def stack_node(stack_file: Path, node_name: str) -> NodeConfig:
    """The stack's entry for one node, validated exactly as `pulumi up` validates it."""
    # Imported here: listing GPUs must stay light, only the stack-reading modes need pydantic.
    from stack_config import InvalidConfigError, load_stack_file  # noqa: PLC0415

    try:
        stack = load_stack_file(stack_file)
    except InvalidConfigError as error:
        raise UsageError(str(error)) from None
    node = next((n for n in stack.nodes if n.name == node_name), None)
    if node is None:
        names = ", ".join(n.name for n in stack.nodes)
        raise UsageError(f"--node {node_name}: not in {stack_file} (nodes: {names})")
    return node


def run(command: Callable[[], int]) -> int:
    try:
        return command()
    except NvmlUnavailableError as error:
        print_errors(str(error))
        return EXIT_UNAVAILABLE
    except UsageError as error:
        print_errors(str(error))
        return EXIT_USAGE
