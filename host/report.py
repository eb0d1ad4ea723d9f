"""One audit scan's findings: what `audit` prints and `audit --watch` publishes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Report:
    node: str
    pod_resources: str = "read"
    gpus: list[dict[str, Any]] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    # Sources that failed during the scan: it reports what the others show, and is not a clean scan.
    failed_sources: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "podResources": self.pod_resources,
            "failedSources": self.failed_sources,
            "gpus": self.gpus,
            "violations": self.violations,
            "warnings": self.warnings,
        }
