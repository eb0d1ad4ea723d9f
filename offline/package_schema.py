"""The component package's schema, committed as package/schema.json so a change to what consumers bind against
shows in review and a stale copy fails CI.

    python -m offline.package_schema [--check]

The schema is the one package/'s provider serves: Pulumi's analyzer over the components' annotations, at the
distribution's version (pyproject.toml). --check exits 1 if the committed file differs.
"""

from __future__ import annotations

import gc
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from common.cli import EXIT_FINDING, EXIT_OK, parser, run
from common.names import PROJECT
from offline.config_reference import replace_text

SCHEMA = Path(__file__).resolve().parent.parent / "package" / "schema.json"


def schema() -> dict[str, Any]:
    from pulumi.provider.experimental.component import ComponentProvider  # noqa: PLC0415 (only this tool needs it)

    from package.__main__ import COMPONENTS, VERSION  # noqa: PLC0415

    # The SDK's analyzer opens pulumi-kubernetes' pulumi-plugin.json without closing it: collected here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        served = ComponentProvider(list(COMPONENTS), PROJECT, version=VERSION).schema
        gc.collect()
    assert served is not None
    found: dict[str, Any] = json.loads(served)
    return found


def text() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    arguments = parser("python -m offline.package_schema", __doc__)
    arguments.add_argument("--check", action="store_true", help="exit 1 if the committed schema is stale")
    args = arguments.parse_args(argv)

    def command() -> int:
        wanted = text()
        if args.check:
            if not SCHEMA.exists() or SCHEMA.read_text(encoding="utf-8") != wanted:
                print(f"{SCHEMA.name} is stale: run python -m offline.package_schema", file=sys.stderr)
                return EXIT_FINDING
            return EXIT_OK
        replace_text(SCHEMA, wanted)
        print(f"wrote {SCHEMA}")
        return EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
