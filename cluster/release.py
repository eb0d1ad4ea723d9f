"""Give a node back to the GPU Operator, on purpose: python -m cluster.release --stack prod --node NAME --yes

A node that leaves a stack keeps the labels hidden-gpu set (the label patches are retained on
delete), so it stays hidden: the safe state. This command is the deliberate way back. It removes
only the operator switches hidden-gpu sets where they still say `false`, and its own node and pool
labels; the operator then deploys its own device plugin, which advertises every GPU of the node.
Without --yes it only says what it would do. Run `python -m host.discover --check` on the node
first: after this, every GPU there is Kubernetes'.
"""

from __future__ import annotations

import sys
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from cluster.kube import TIMEOUTS, add_cluster_options, api_client
from common.cli import EXIT_OK, UnavailableError, UsageError, add_stack_source, parser, run, stack_file
from common.names import DEVICE_PLUGIN_LABEL, NODE_LABEL, OPERAND_LABELS, POOL_LABEL
from stack_config import parse_project_config, read_stack_file

SWITCHES = (DEVICE_PLUGIN_LABEL, *OPERAND_LABELS.values())
MERGE_PATCH = "application/merge-patch+json"


def release(core: Any, node_name: str, confirmed: bool) -> list[str]:
    """The labels removed (or, unconfirmed, that would be), in SWITCHES order."""
    try:
        node = core.read_node(node_name, _request_timeout=TIMEOUTS)
    except ApiException as error:
        if error.status == 404:
            raise UsageError(f"--node {node_name}: no such node in the cluster") from None
        raise
    labels = node.metadata.labels or {}
    ours = [label for label in SWITCHES if labels.get(label) == "false"]
    ours += [label for label in (NODE_LABEL, POOL_LABEL) if label in labels]  # the scheduling labels we set
    if ours and confirmed:
        # resourceVersion makes the patch fail rather than act on a node that changed meanwhile.
        patch = {"metadata": {"resourceVersion": node.metadata.resource_version, "labels": dict.fromkeys(ours)}}
        # This client's default for PATCH is a JSON *patch*; the body here is a merge patch.
        core.patch_node(node_name, patch, _content_type=MERGE_PATCH, _request_timeout=TIMEOUTS)
    return ours


def main(argv: list[str] | None = None) -> int:
    arguments = parser("python -m cluster.release", __doc__)
    add_stack_source(arguments)
    arguments.add_argument("--node", required=True, help="the node to give back")
    arguments.add_argument(
        "--yes", action="store_true", help="remove the labels (without it: only say what it would do)"
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
        core = client.CoreV1Api(api_client(args, config))
        try:
            labels = release(core, args.node, args.yes)
        except ApiException as error:
            raise UnavailableError(f"the API server answered {error.status} {error.reason}") from None
        except HTTPError as error:
            raise UnavailableError(f"cannot reach the API server: {error}") from None
        if not labels:
            print(f"node {args.node}: no hidden-gpu switch set to false; nothing to give back")
        elif args.yes:
            print(f"node {args.node}: removed {', '.join(labels)}")
            print("the GPU Operator now deploys its device plugin there, which advertises every GPU of the node")
        else:
            print(f"node {args.node}: would remove {', '.join(labels)} (dry run; --yes to do it)")
        return EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
