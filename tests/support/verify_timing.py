"""Time cluster.verify on a 1,000-node stack against the loopback API server the tests use.

    .venv/bin/python -m tests.support.verify_timing [--nodes 1000] [--repeat 3]

Prints the median seconds and the API requests of one run (docs/performance.md).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster import verify
from offline.bench import synthetic_stack
from tests.support.fake_apiserver import serve
from tests.support.stacks import write_stack
from tests.support.verify_cluster import healthy


def main() -> int:
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("--nodes", type=int, default=1000)
    arguments.add_argument("--repeat", type=int, default=3)
    args = arguments.parse_args()
    work = Path(tempfile.mkdtemp(prefix="verify-timing-"))
    config = {**synthetic_stack(args.nodes), "kubernetes:context": "admin@test"}
    cluster = healthy(config, "fleet")
    stack = write_stack(work, config, "fleet")
    seconds = []
    with serve(work, cluster) as kubeconfig:
        for _ in range(args.repeat):
            cluster.requests.clear()
            start = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                status = verify.main(["--stack-file", str(stack), "--kubeconfig", str(kubeconfig)])
            seconds.append(time.perf_counter() - start)
    print(
        f"nodes={args.nodes} status={status} median={statistics.median(seconds):.2f}s requests={len(cluster.requests)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
