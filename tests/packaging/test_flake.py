"""flake.nix and its helper parse (Nix cannot build here: there is no binary cache)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests_env import ROOT

NIX = shutil.which("nix-instantiate")


@pytest.mark.skipif(NIX is None, reason="nix-instantiate is not installed (apt: nix-bin)")
@pytest.mark.parametrize("path", ["flake.nix", "nix/wheels.nix"])
def test_nix_files_parse(path: str) -> None:
    """nix-instantiate --parse accepts the file."""
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
