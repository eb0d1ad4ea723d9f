"""What a GPU host run carries, as the fast tier can check it without a GPU: the packages the device lacks."""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

from lab import gpu_host


def test_the_carried_packages_are_unpacked_first_on_the_runs_path(tmp_path: Path) -> None:
    """What a GPU host run imports the testbed's client from: the carry's one archive, unpacked into the run's own
    directory and put before the device's own packages (a CI machine cannot run it, the fast tier can run this)."""
    carry, work, package = tmp_path / "carry", tmp_path / "work", tmp_path / "site"
    (package / "hidden_gpu_carried").mkdir(parents=True)
    (package / "hidden_gpu_carried" / "__init__.py").write_text("WHERE = 'carried'\n")
    carry.mkdir()
    work.mkdir()
    with tarfile.open(carry / gpu_host.SITE, "w:xz") as archive:
        archive.add(package, arcname=".")
    before = list(sys.path)
    try:
        site = gpu_host.unpack_site(carry, work)
        assert sys.path[0] == str(site) and site == work / "site"
        import hidden_gpu_carried  # type: ignore[import-not-found]  # noqa: PLC0415

        assert hidden_gpu_carried.WHERE == "carried"
    finally:
        sys.path[:] = before
        sys.modules.pop("hidden_gpu_carried", None)
