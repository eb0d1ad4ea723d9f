"""The shipped alert rules as one PrometheusRule object, for clusters that run the Prometheus Operator:
python -m offline.prometheus_rule [--namespace monitoring] [--label release=prometheus] > hidden-gpu-rules.yaml

The groups are those of host/hidden-gpu-audit.rules.yml and cluster/hidden-gpu-verify.rules.yml, read as they are
(the one home of every rule): a Prometheus without the operator loads those files with `rule_files:`. The Prometheus
Operator picks the object up where its `ruleSelector` matches the labels given (`--label`, repeated).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from common.cli import EXIT_OK, UsageError, parser, run
from common.names import PART_OF, PART_OF_LABEL, PROJECT

ROOT = Path(__file__).resolve().parent.parent
RULE_FILES = (ROOT / "host" / "hidden-gpu-audit.rules.yml", ROOT / "cluster" / "hidden-gpu-verify.rules.yml")


def prometheus_rule(namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    groups = [group for path in RULE_FILES for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": PROJECT, "namespace": namespace, "labels": {PART_OF_LABEL: PART_OF, **labels}},
        "spec": {"groups": groups},
    }


def main(argv: list[str] | None = None) -> int:
    arguments = parser("python -m offline.prometheus_rule", __doc__)
    arguments.add_argument("--namespace", default="monitoring", help="the object's namespace (default monitoring)")
    arguments.add_argument("--label", action="append", default=[], help="KEY=VALUE on the object (repeatable)")
    args = arguments.parse_args(argv)

    def command() -> int:
        labels = {}
        for pair in args.label:
            key, equals, value = pair.partition("=")
            if not equals or not key:
                raise UsageError(f"--label {pair}: KEY=VALUE")
            labels[key] = value
        sys.stdout.write(yaml.safe_dump(prometheus_rule(args.namespace, labels), sort_keys=False))
        return EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
