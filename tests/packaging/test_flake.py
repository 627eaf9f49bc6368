"""flake.nix, its lock and its wheel pins (Nix cannot build here: there is no binary cache)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib

import pytest

from support.env import ROOT

NIX = shutil.which("nix-instantiate")
NIX_FILES = ["flake.nix", *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("nix/*.nix"))]


def _normalise(name: str) -> str:
    # PEP 503, written here again on purpose: the test checks nix/wheels.py, not with it.
    return re.sub(r"[-_.]+", "-", name).lower()


def _project_name(requirement: str) -> str:
    return _normalise(re.split(r"[\s\[<>=!~;(]", requirement, maxsplit=1)[0])


@pytest.mark.skipif(NIX is None, reason="nix-instantiate is not installed (apt: nix-bin)")
@pytest.mark.parametrize("path", NIX_FILES)
def test_nix_files_parse(path: str) -> None:
    """nix-instantiate --parse accepts flake.nix and every nix/*.nix."""
    assert NIX is not None
    done = subprocess.run(
        [NIX, "--parse", str(ROOT / path)], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_flake_offers_what_the_readme_says() -> None:
    """The flake defines the default package, the bundle, the image, the app and a dev shell."""
    text = (ROOT / "flake.nix").read_text()
    for needle in (
        "packages = forAll",
        "default = skilld",
        "bundle",
        "dockerTools",
        "apps = forAll",
        "devShells = forAll",
        "nixpkgs.url",
    ):
        assert needle in text


def test_flake_lock_pins_nixpkgs() -> None:
    """flake.lock is version-7 JSON pinning the flake's nixpkgs branch to one rev and narHash."""
    lock = json.loads((ROOT / "flake.lock").read_text())
    assert lock["version"] == 7
    root = lock["nodes"][lock["root"]]
    nixpkgs = lock["nodes"][root["inputs"]["nixpkgs"]]
    assert re.fullmatch(r"[0-9a-f]{40}", nixpkgs["locked"]["rev"])
    assert re.fullmatch(r"sha256-[A-Za-z0-9+/]{43}=", nixpkgs["locked"]["narHash"])
    original = nixpkgs["original"]
    url = f"{original['type']}:{original['owner']}/{original['repo']}/{original['ref']}"
    assert f'inputs.nixpkgs.url = "{url}";' in (ROOT / "flake.nix").read_text()


def test_wheels_json_covers_runtime_dependencies() -> None:
    """nix/wheels.json pins every runtime and build dependency, per system, by tags and sha256;
    the runtime set includes the otel extra (the Nix package traces when OTEL_* says so)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    otel = project["optional-dependencies"]["otel"]
    runtime = {_project_name(r) for r in [*project["dependencies"], *otel]}
    build = {_project_name(r) for r in project["optional-dependencies"]["build"]}
    systems = json.loads((ROOT / "nix" / "wheels.json").read_text())["systems"]
    assert "x86_64-linux" in systems
    fields = {"name", "pname", "version", "dist", "python", "abi", "platform", "sha256"}
    for system, sets in systems.items():
        for name, wanted in (("runtime", runtime), ("build", build)):
            wheels = sets[name]
            assert wanted <= {_normalise(w["name"]) for w in wheels}, (system, name)
            for wheel in wheels:
                # exactly what fetchPypi's wheel form takes (no url: it derives that)
                assert set(wheel) == fields, wheel
                assert re.fullmatch(r"[0-9a-f]{64}", wheel["sha256"]), wheel
                assert _normalise(wheel["pname"]) == _normalise(wheel["name"]), wheel
                assert wheel["dist"] == wheel["python"], wheel
                for tag in ("pname", "version", "python", "abi", "platform"):
                    assert re.fullmatch(r"[A-Za-z0-9_.+]+", wheel[tag]), (tag, wheel)


def test_wheels_nix_fetches_with_fetchpypi() -> None:
    """nix/wheels.nix fetches each wheel with fetchPypi's wheel form, never from a URL."""
    text = (ROOT / "nix" / "wheels.nix").read_text()
    assert "fetchPypi" in text and 'format = "wheel"' in text
    assert "fetchurl" not in text and "url" not in text.replace("URL", "")
