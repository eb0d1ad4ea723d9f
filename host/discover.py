"""List this host's GPUs by UUID, write a node's stack entry, or check a stack against the host.

    python -m host.discover                 # table: index, UUID, name, PCI bus, memory, MIG
    python -m host.discover --json
    python -m host.discover --expose 0,3 [--node NAME]          # --expose none: every GPU hidden
    python -m host.discover --check --stack prod [--node NAME]     # or --stack-file PATH

Runs on the GPU host with only nvidia-ml-py; --check also reads the stack file (PyYAML, pydantic).
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from types import ModuleType

from common.cli import (
    EXIT_FINDING,
    EXIT_OK,
    UsageError,
    add_stack_source,
    bounded,
    format_table,
    parser,
    run,
    stack_file,
)
from host.nvml import Gpu, list_gpus, load_nvml, session
from host.stack import stack_node

GIB = 1024**3
EXPOSE_NONE = "none"


def table(gpus: list[Gpu]) -> str:
    rows = [("INDEX", "UUID", "NAME", "PCI BUS ID", "MEMORY", "MIG")]
    for gpu in gpus:
        mig = f"on, {len(gpu.mig_devices)} devices" if gpu.mig_enabled else "off"
        rows.append(
            (str(gpu.index), gpu.uuid, gpu.name, gpu.pci_bus_id, f"{gpu.memory_total_bytes / GIB:.1f} GiB", mig)
        )
        rows += [("", f"  {mig_device.uuid}", "", "", "", "") for mig_device in gpu.mig_devices]
    return format_table(rows)


def parse_indices(text: str, gpus: list[Gpu]) -> list[int]:
    """The indices `--expose` names: ASCII digits only (str.isdigit also takes "٣" and "³"), each once; `none`
    for a node whose GPUs are all hidden. An empty value is refused: it is more often a variable left unset."""
    indices: list[int] = []
    shown = bounded(text)
    if text.strip() == EXPOSE_NONE:
        return indices
    if not text.strip():
        raise UsageError(f"--expose '{shown}': no index given; to expose no GPU, say --expose {EXPOSE_NONE}")
    for part in (p.strip() for p in text.split(",")):
        # Length first: int() refuses (ValueError) a string of more than 4,300 digits.
        if not (part.isascii() and part.isdigit() and len(part) <= len(str(len(gpus)))) or int(part) >= len(gpus):
            what = f"'{bounded(part)}' is" if part else "an empty item is"
            raise UsageError(f"--expose {shown}: {what} not a GPU index on this host (0-{len(gpus) - 1})")
        if int(part) in indices:
            raise UsageError(f"--expose {shown}: index {part} given twice")
        indices.append(int(part))
    return indices


def stack_entry(node: str, gpus: list[Gpu], exposed_indices: list[int]) -> str:
    """The node's entry for `hidden-gpu:nodes`, by UUID: the index only served to pick.

    An exposed GPU in MIG mode is exposed as its MIG devices (what the plugin then advertises),
    with the node's MIG layout; a hidden one is hidden whole, by its own UUID.
    """
    chosen = [gpus[i] for i in exposed_indices]
    mig_gpus = [gpu for gpu in chosen if gpu.mig_enabled]
    exposed = [
        uuid for gpu in chosen for uuid in ([m.uuid for m in gpu.mig_devices] if gpu.mig_enabled else [gpu.uuid])
    ]
    hidden = [gpu.uuid for gpu in gpus if gpu.index not in exposed_indices]
    lines = [
        f"# {node}: {len(chosen)} of {len(gpus)} GPUs exposed; paste under hidden-gpu:nodes",
        f"- name: {node}",
    ]
    for key, uuids in (("exposedGpus", exposed), ("hiddenGpus", hidden)):
        lines += [f"  {key}:"] + [f"    - {uuid}" for uuid in uuids] if uuids else [f"  {key}: []"]
    if mig_gpus:
        lines += ["  migStrategy: mixed", "  migDevices:"]
        for gpu in mig_gpus:
            lines += [f"    {gpu.uuid}:"] + [f"      - {mig.uuid}" for mig in gpu.mig_devices]
    return "\n".join(lines)


def check(stack_file: Path, node_name: str, gpus: list[Gpu]) -> tuple[str, bool]:
    """Does the stack name exactly this host's GPUs for this node? Returns (report, all_ok)."""
    node = stack_node(stack_file, node_name)
    listed = node.roles
    on_host = {gpu.uuid for gpu in gpus} | {mig.uuid for gpu in gpus for mig in gpu.mig_devices}
    lines = [f"node {node_name} in {stack_file} against this host ({len(gpus)} GPUs):"]
    problems = 0
    for gpu in gpus:
        role: str | None = listed.get(gpu.uuid)
        slices = [mig.uuid for mig in gpu.mig_devices]
        if role is None and slices and all(uuid in listed for uuid in slices):
            role = "by its MIG devices"
        if role is None:
            problems += 1
            lines.append(f"  UNLISTED  {gpu.uuid}  index {gpu.index}: on this host, neither exposed nor hidden")
        else:
            lines.append(f"  ok        {gpu.uuid}  index {gpu.index}: {role}")
    for uuid, role in listed.items():
        if uuid not in on_host:
            problems += 1
            lines.append(f"  MISSING   {uuid}: {role} in the stack, not on this host")
    lines.append("result: every GPU accounted for" if problems == 0 else f"result: {problems} problem(s)")
    return "\n".join(lines), problems == 0


def main(argv: list[str] | None = None, nvml: ModuleType | None = None) -> int:
    arguments = parser("python -m host.discover", __doc__)
    mode = arguments.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true", help="print the GPUs as JSON")
    mode.add_argument("--expose", metavar="INDICES", help="comma-separated indices to expose, e.g. 0,3; none for none")
    mode.add_argument(
        "--check", action="store_true", help="check the stack (--stack or --stack-file) against this host"
    )
    add_stack_source(arguments, required=False)
    arguments.add_argument("--node", default=socket.gethostname(), help="node name (default: this hostname)")
    arguments.add_argument(
        "--record", type=Path, help="read a recorded host (JSON as discover --json prints) instead of NVML"
    )
    args = arguments.parse_args(argv)
    if args.check != (args.stack is not None or args.stack_file is not None):
        arguments.error("--check needs --stack or --stack-file, and they need --check")

    def command() -> int:
        module = nvml if nvml is not None else load_nvml(args.record)
        with session(module):
            gpus = list_gpus(module)
        if args.json:
            print(json.dumps([gpu.as_json() for gpu in gpus], indent=2))
        elif args.expose is not None:
            print(stack_entry(args.node, gpus, parse_indices(args.expose, gpus)))
        elif args.check:
            report, ok = check(stack_file(args), args.node, gpus)
            print(report)
            return EXIT_OK if ok else EXIT_FINDING
        else:
            print(table(gpus))
        return EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
