"""Write nix/wheels.json: every wheel the flake installs, by name, version, tags and sha256.

Run it with ``just nix-wheels`` after changing dependencies in ``pyproject.toml``. For each
Nix system it asks pip (``install --dry-run --report``) to resolve the runtime dependencies,
then the runtime and ``build`` dependencies together, for CPython 3.11 on that system's
manylinux platform; pip resolves for a foreign platform too, so one machine writes every
system. The runtime set is the first resolution; the build set is what the second adds.

No URL is written: each wheel is pinned by the fields of its file name and its sha256, and
nixpkgs' ``fetchPypi`` (``format = "wheel"``) derives where PyPI serves it from
(``/packages/DIST/P/PNAME/PNAME-VERSION-PYTHON-ABI-PLATFORM.whl``, with DIST the python tag).

Only the standard library is used, so any Python 3.11 with pip runs it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "nix" / "wheels.json"
PYTHON = "3.11"
# The glibc of the pinned nixpkgs (nixos-24.11 ships 2.40): newer manylinux wheels would not load.
GLIBC_MINOR = 40
SYSTEMS = {"x86_64-linux": "x86_64", "aarch64-linux": "aarch64"}
# Legacy manylinux names (glibc 2.5, 2.12, 2.17; PEP 600): pip matches tags as strings.
LEGACY = {"x86_64": ("manylinux1", "manylinux2010", "manylinux2014"), "aarch64": ("manylinux2014",)}
FILES = "https://files.pythonhosted.org/"


class WheelsError(Exception):
    """A wheel cannot be pinned: no hash, not from PyPI, a build tag, or the sets disagree."""


def normalise(name: str) -> str:
    """The PEP 503 form of a project name (``PyYAML`` and ``pyyaml`` are one project)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def platforms(arch: str) -> list[str]:
    """Every manylinux tag a wheel may carry to load on ``arch`` with the pinned glibc."""
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(GLIBC_MINOR, 4, -1)]
    return tags + [f"{name}_{arch}" for name in LEGACY[arch]]


def fetchpypi_fields(url: str) -> dict[str, str]:
    """What ``fetchPypi { format = "wheel"; ... }`` needs to find the wheel pip chose at ``url``.

    Raises:
        WheelsError: the wheel came from anywhere but PyPI's file host, or its name has a
            build tag (fetchPypi's file name pattern has no place for one).
    """
    filename = url.rsplit("/", 1)[1]
    if not url.startswith(FILES):
        raise WheelsError(f"{filename}: {url} is not on {FILES}; pin only public wheels")
    parts = filename.removesuffix(".whl").split("-")
    if len(parts) != 5:
        raise WheelsError(f"{filename}: not NAME-VERSION-PYTHON-ABI-PLATFORM.whl")
    pname, version, python, abi, platform = parts
    # PyPI files a wheel under its python tag, the first path segment fetchPypi writes.
    return {
        "pname": pname,
        "version": version,
        "dist": python,
        "python": python,
        "abi": abi,
        "platform": platform,
    }


def resolve(requirements: list[str], arch: str) -> dict[str, dict[str, str]]:
    """The wheels pip would install for ``requirements`` on ``arch``, keyed by normalised name.

    Raises:
        WheelsError: pip failed, or a wheel has no sha256 in its report.
    """
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        # --target only because pip refuses --platform without it; --dry-run installs nothing.
        argv = [
            sys.executable,
            "-m",
            "pip",
            # --isolated: no pip configuration, so no local mirror or extra index answers;
            # the URLs in the report are PyPI's own, which is where Nix will fetch them.
            "--isolated",
            "install",
            "--quiet",
            "--dry-run",
            "--ignore-installed",
            "--only-binary=:all:",
            "--target",
            str(Path(tmp) / "t"),
            "--python-version",
            PYTHON,
            "--implementation",
            "cp",
            "--abi",
            "cp" + PYTHON.replace(".", ""),
            "--abi",
            "abi3",
            "--abi",
            "none",
            *(arg for tag in platforms(arch) for arg in ("--platform", tag)),
            "--report",
            str(report),
            *requirements,
        ]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise WheelsError(f"pip could not resolve for {arch}:\n{done.stderr}")
        items = json.loads(report.read_text())["install"]
    wheels = {}
    for item in items:
        info, meta = item["download_info"], item["metadata"]
        sha256 = info.get("archive_info", {}).get("hashes", {}).get("sha256")
        if not sha256:
            raise WheelsError(f"pip's report gives no sha256 for {info['url']}")
        wheels[normalise(meta["name"])] = {
            "name": normalise(meta["name"]),
            **fetchpypi_fields(info["url"]),
            "sha256": sha256,
        }
    return wheels


def pin(runtime: list[str], build: list[str], arch: str) -> dict[str, list[dict[str, str]]]:
    """The runtime and build wheel sets for ``arch``, each sorted by name.

    Raises:
        WheelsError: resolving the build set changes a runtime wheel's version.
    """
    run = resolve(runtime, arch)
    both = resolve(runtime + build, arch)
    for name, wheel in run.items():
        if both[name] != wheel:
            raise WheelsError(
                f"{name}: the build set needs {both[name]['version']}, "
                f"the runtime set {wheel['version']}; tighten pyproject.toml"
            )
    return {
        "runtime": [run[n] for n in sorted(run)],
        "build": [both[n] for n in sorted(both) if n not in run],
    }


def main() -> int:
    """Resolve every system and write nix/wheels.json."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    # The otel extra is part of the Nix package as of the image: tracing is then a matter
    # of OTEL_* variables, never of a rebuild (docs/tracing.md).
    runtime = [*project["dependencies"], *extras["otel"]]
    build = extras["build"]
    try:
        systems = {system: pin(runtime, build, arch) for system, arch in SYSTEMS.items()}
    except WheelsError as exc:
        print(f"nix-wheels: {exc}", file=sys.stderr)
        return 1
    lock: dict[str, Any] = {
        "_comment": "Written by nix/wheels.py (just nix-wheels) from pyproject.toml; do not edit.",
        "python": PYTHON,
        "systems": systems,
    }
    OUT.write_text(json.dumps(lock, indent=2) + "\n")
    count = sum(len(s["runtime"]) + len(s["build"]) for s in systems.values())
    print(f"nix-wheels: {count} wheels for {', '.join(systems)} in {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
