"""Give a node back to the GPU Operator, on purpose: python -m cluster.release --stack prod --node NAME --yes

A node that leaves a stack keeps the labels hidden-gpu set (the label patches are retained on
delete), so it stays hidden: the safe state. This command is the deliberate way back, and it gives
back only what hidden-gpu hid:
- the node must carry hidden-gpu's mark: its `hidden-gpu.io/node` label, and the device-plugin switch
  owned by the field manager `hidden-gpu` (a node hidden by hand is refused: whoever hid it gives it back);
- no stack may still hide it in the cluster this command talks to: every stack's record there (a
  ConfigMap `pulumi up` writes and `pulumi destroy` deletes) is read, not only the file given here.
The release is a server-side apply of nothing by `hidden-gpu`: the API server removes every field
only hidden-gpu owns. A switch another manager also set stays, and is named (exit 1). The GPU Operator
does not notice a removed switch by itself, so on a node it has labelled (NFD's NVIDIA PCI label and
`nvidia.com/gpu.present=true`) the release also removes `gpu.present`, which makes the operator label the
node as a GPU node it just found, and waits (--wait) until it has: its device plugin, which advertises every
GPU of the node, then deploys there (exit 1, with the command that makes it reconcile, if it did not).
Without --yes it only says what it would do. Run `python -m host.discover --check` on the node first.

A release sent and not answered (the connection dropped, the answer never came) may have been applied:
the node is read again, within the deadline (the write keeps part of it for that), and the command says
which state it is in: released (exit 0, or 1 as above), still hidden (nothing changed, exit 3), or unknown
(it could not be read, exit 3, with the command that tells).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

from cluster.kube import ForbiddenError, Reader, UnansweredError, add_cluster_options, api_client
from common.cli import (
    EXIT_FINDING,
    EXIT_OK,
    UnavailableError,
    UsageError,
    add_stack_source,
    parser,
    run,
    stack_file,
)
from common.names import (
    CLUSTER_POLICIES_PATH,
    DEVICE_PLUGIN_LABEL,
    FIELD_MANAGER,
    GPU_PRESENT_LABEL,
    NFD_GPU_LABELS,
    NODE_LABEL,
    OPERAND_LABELS,
    OPERANDS_LABEL,
    OPERATOR_NAMESPACE,
    STACK_LABEL,
)
from desired.stack_claims import Claim
from stack_config import parse_project_config, read_stack_file

SWITCHES = (DEVICE_PLUGIN_LABEL, *OPERAND_LABELS.values())
LABEL_FIELD = "f:"
# Seconds of the deadline kept, after a write, to read the node again should the write go unanswered (at most a
# third of what is left).
REREAD_SECONDS = 10.0


def label_owners(node: dict[str, Any]) -> dict[str, set[str]]:
    """Label -> the field managers that own it, from the node's managedFields."""
    owners: dict[str, set[str]] = {}
    for entry in (node.get("metadata") or {}).get("managedFields") or []:
        labels = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:labels") or {}
        for key in labels:
            if key.startswith(LABEL_FIELD):
                owners.setdefault(key[len(LABEL_FIELD) :], set()).add(str(entry.get("manager")))
    return owners


def _claims(reader: Reader, node: str) -> Iterator[Claim]:
    for config_map in reader.list("/api/v1/configmaps", STACK_LABEL):
        claim = Claim.of(config_map)
        if claim.lists(node):
            yield claim


def release(reader: Reader, node_name: str, confirmed: bool) -> tuple[list[str], dict[str, set[str]], str]:
    """The labels given back (or, unconfirmed, that would be), those that stay with their other owners, and a
    note when the write went unanswered and a new read of the node told what it did."""
    path = f"/api/v1/nodes/{node_name}"
    node = reader.find(path)
    if node is None:
        raise UsageError(f"--node {node_name}: no such node in the cluster")
    labels = (node.get("metadata") or {}).get("labels") or {}
    owners = label_owners(node)
    ours = [label for label, managers in sorted(owners.items()) if FIELD_MANAGER in managers]
    if not ours and not any(labels.get(s) == "false" for s in SWITCHES):
        return [], {}, ""
    if labels.get(NODE_LABEL) != node_name or DEVICE_PLUGIN_LABEL not in ours:
        others = ", ".join(sorted(owners.get(DEVICE_PLUGIN_LABEL, set()))) or "no recorded manager"
        raise UsageError(
            f"--node {node_name}: not hidden by hidden-gpu ({DEVICE_PLUGIN_LABEL} set by {others}, "
            f"not by the field manager {FIELD_MANAGER}): release gives back only what hidden-gpu hid"
        )
    for claim in _claims(reader, node_name):
        raise UsageError(
            f"--node {node_name}: stack {claim.stack} still hides it in this cluster ({claim.where}): "
            "remove it from that stack and run `pulumi up` there first"
        )
    shared = {label: owners[label] - {FIELD_MANAGER} for label in ours if owners[label] - {FIELD_MANAGER}}
    if not confirmed:
        return [label for label in ours if label not in shared], shared, ""
    # Applying an object that names no field gives up every field this manager owns; resourceVersion makes
    # the apply fail rather than act on a node that changed since it was judged.
    metadata = {"name": node_name, "resourceVersion": node["metadata"]["resourceVersion"]}
    body = {"apiVersion": "v1", "kind": "Node", "metadata": metadata}
    note = ""
    try:
        written = reader.apply(path, body, FIELD_MANAGER, until=reader.deadline - _reread_reserve(reader))
    except UnansweredError as unanswered:
        written, note = _read_again(reader, node_name, str(unanswered))
    after = (written.get("metadata") or {}).get("labels") or {}
    return [label for label in ours if label not in after], {k: v for k, v in shared.items() if k in after}, note


def hand_back(reader: Reader, node_name: str, wait: float) -> tuple[str, bool]:
    """After a release, have the GPU Operator label the node as it labels a GPU node it finds, and wait for it: what
    happened, and whether the node is as the operator would have it. The operator does not reconcile when a
    `gpu.deploy.*` label goes, and does not requeue in steady state (gpu-operator@v0.0.0-20250917190837-d73a0086a6ba
    controllers/clusterpolicy_controller.go:214-233, 289-318); a GPU node without `gpu.present` makes it reconcile
    (:294), and it then adds the absent switches as `true` (state_manager.go:377-391, 528-546)."""
    path = f"/api/v1/nodes/{node_name}"
    node = reader.get(path)
    labels = (node.get("metadata") or {}).get("labels") or {}
    if labels.get(OPERANDS_LABEL) == "false":
        return f"{OPERANDS_LABEL}=false: the GPU Operator deploys no operand there", True
    if not any(labels.get(label) == "true" for label in NFD_GPU_LABELS) or labels.get(GPU_PRESENT_LABEL) != "true":
        return (
            f"not a node the GPU Operator has labelled (NFD's NVIDIA PCI label, {GPU_PRESENT_LABEL}=true): "
            "nothing asks it to deploy there",
            True,
        )
    try:
        policies = reader.find(CLUSTER_POLICIES_PATH)
    except ForbiddenError:  # this identity may not read it: an operator may well be there
        policies = {"items": ["unknown"]}
    if policies is None or not policies.get("items"):
        return "no ClusterPolicy in the cluster: no GPU Operator deploys there", True
    started = time.monotonic()
    # No resourceVersion: the kubelet's status writes move it all the time, and removing the label is harmless
    # whatever changed meanwhile (the operator sets it again on a node that still has NFD's label).
    reader.merge_patch(path, {"metadata": {"labels": {GPU_PRESENT_LABEL: None}}}, FIELD_MANAGER)
    until = min(reader.deadline, started + wait)
    while True:
        labels = (reader.get(path).get("metadata") or {}).get("labels") or {}
        if (value := labels.get(DEVICE_PLUGIN_LABEL)) is not None:
            return (
                f"the GPU Operator labelled it again in {time.monotonic() - started:.1f} s "
                f"({DEVICE_PLUGIN_LABEL}={value}): its device plugin, which advertises every GPU of the node, "
                "deploys there",
                True,
            )
        if time.monotonic() >= until:
            return (
                f"removed {GPU_PRESENT_LABEL} so that the GPU Operator labels it as a GPU node it found, and it "
                f"has not within {wait:.0f} s: it deploys its device plugin there (and sets {GPU_PRESENT_LABEL} "
                f"again) at its next reconcile; `kubectl -n {OPERATOR_NAMESPACE} rollout restart "
                "deployment/gpu-operator` starts one now",
                False,
            )
        time.sleep(0.25)


def _reread_reserve(reader: Reader) -> float:
    return min(REREAD_SECONDS, max(0.0, reader.deadline - time.monotonic()) / 3)


def _read_again(reader: Reader, node_name: str, unanswered: str) -> tuple[dict[str, Any], str]:
    """The node as it is after a release that went unanswered, if the release took effect; otherwise the state
    it is in (still hidden, or unknown) as UnavailableError: exit 3, the release not done."""
    check = f"`kubectl get node {node_name} --show-labels` ({DEVICE_PLUGIN_LABEL}=false: still hidden)"
    try:
        node = reader.get(f"/api/v1/nodes/{node_name}")
    except UnavailableError as error:
        raise UnavailableError(
            f"node {node_name}: state unknown: the release was sent and not answered ({unanswered}), and the "
            f"node could not be read again ({error}): see {check}, then run this command again"
        ) from None
    if any(FIELD_MANAGER in managers for managers in label_owners(node).values()):
        raise UnavailableError(
            f"node {node_name}: still hidden: the release was sent and not answered ({unanswered}), and the node "
            f"read again still has hidden-gpu's labels: nothing changed; run this command again"
        ) from None
    return node, f"the release was sent and not answered ({unanswered}); the node read again shows it released"


def main(argv: list[str] | None = None) -> int:
    arguments = parser("python -m cluster.release", __doc__)
    add_stack_source(arguments)
    arguments.add_argument("--node", required=True, help="the node to give back")
    arguments.add_argument(
        "--yes", action="store_true", help="remove the labels (without it: only say what it would do)"
    )
    arguments.add_argument("--deadline", type=float, default=60.0, help="seconds for the whole command (default 60)")
    arguments.add_argument(
        "--wait",
        type=float,
        default=30.0,
        help="seconds to wait for the GPU Operator to label the node again (default 30; within --deadline)",
    )
    add_cluster_options(arguments)
    args = arguments.parse_args(argv)

    def command() -> int:
        path = stack_file(args)
        config = read_stack_file(path)
        if any(node.name == args.node for node in parse_project_config(config).nodes):
            raise UsageError(
                f"--node {args.node}: still in {path}: remove it from the stack and run `pulumi up` first "
                "(its labels stay, so it stays hidden meanwhile)"
            )
        reader = Reader(api_client(args, config), deadline=time.monotonic() + args.deadline)
        given, kept, note = release(reader, args.node, args.yes)
        if note:
            print(f"node {args.node}: {note}")
        if not given and not kept:
            print(f"node {args.node}: no hidden-gpu switch set to false; nothing to give back")
            return EXIT_OK
        if args.yes:
            print(f"node {args.node}: removed {', '.join(given) or 'nothing'}")
        else:
            print(f"node {args.node}: would remove {', '.join(given) or 'nothing'} (dry run; --yes to do it)")
        for label, managers in sorted(kept.items()):
            print(
                f"node {args.node}: {label} stays: also set by {', '.join(sorted(managers))}; "
                f"remove it with `kubectl label node {args.node} {label}-` if that is meant"
            )
        if kept and any(label in SWITCHES for label in kept):
            return EXIT_FINDING
        if args.yes and DEVICE_PLUGIN_LABEL in given:
            said, done = hand_back(reader, args.node, args.wait)
            print(f"node {args.node}: {said}")
            return EXIT_OK if done else EXIT_FINDING
        return EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
