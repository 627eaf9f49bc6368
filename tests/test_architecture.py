"""Dependencies point one way (docs/architecture.md's package table), checked on every import."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
# telemetry: OpenTelemetry behind one small module every layer may call (a no-op when off)
BASE = {
    "skilld",
    "skilld.errors",
    "skilld.types",
    "skilld.digest",
    "skilld.paths",
    "skilld.telemetry",
}

# package -> the skilld packages it may import (besides errors, types and the root's constants)
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "types": set(),
    "digest": set(),
    "paths": set(),
    "telemetry": set(),
    "policy": set(),
    "permissions": {"policy"},
    "package": set(),
    # permissions, state and audit only through the protocols in types; shell.run's
    # commands run through confine/ (DESIGN.md's table lists it for sandbox/)
    "sandbox": {"call", "confine"},
    "state": set(),
    "audit": set(),
    # the call contract below the sandbox: CallContext, the current call, outcomes
    "call": {"audit"},
    # the registry reaches every backend through SkillBackend: it imports no sandbox;
    # who may list and call what is the permissions' caller question
    "registry": {"call", "audit", "policy", "permissions"},
    # OCI artifacts: the registry client and image layouts, below the build only (a
    # bundle holds its packages: nothing that serves imports distribution).
    "distribution": {"package"},
    # Agent Skills directories are validated, packed and staged by the build; packages
    # listed in sources.yaml are pulled by it (distribution).
    "bundle": {"call", "package", "policy", "sandbox", "agentskills", "distribution"},
    "mcp": {"registry"},
    "cluster": {"call", "registry", "state", "package"},
    "confine": {"policy"},
    "agentskills": {"call", "policy", "package", "sandbox", "confine"},
    "delegate": {"call", "registry", "policy", "sandbox"},
    # one running node from a bundle: everything below mcp/
    "node": {
        "call",
        "sandbox",
        "registry",
        "state",
        "audit",
        "bundle",
        "cluster",
        "policy",
        "package",
        "permissions",
        "confine",
        "agentskills",
        "delegate",
    },
    "cli": {"*"},
}

# third-party library -> the only packages that may import it
BOUNDARIES = {
    "wasmtime": {"sandbox"},
    "mcp": {"mcp"},
    "uvicorn": {"mcp"},
    "starlette": {"mcp"},
    "jsonschema": {"mcp"},
    "nats": {"cluster", "state"},
    "cryptography": {"package"},
    # the OCI client (oras-py) and the HTTP library under it: distribution/ only
    "oras": {"distribution"},
    "requests": {"distribution"},
    "urllib3": {"distribution"},
    # delegate's Anthropic tier is the only user of the SDK (an optional extra).
    "anthropic": {"delegate"},
    "opentelemetry": {"telemetry"},
}

# The one exception: building a skill from WebAssembly text uses wasmtime's text
# assembler (no engine, no guest code) in the package toolchain.
TEXT_ONLY = {("skilld/package/build.py", "wasmtime"): {"wat2wasm", "WasmtimeError"}}


def _names_from(path: Path, line: int) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.lineno == line
        for alias in node.names
    }


def _module_of(path: Path) -> list[str]:
    """``path``'s dotted package parts (``src/skilld/registry/_dispatch.py``: skilld.registry)."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return parts if parts[-1] == "__init__" and parts.pop() else parts[:-1]


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every module ``path`` imports, absolute: ``from skilld import X`` counts as
    ``skilld.X`` when X is a module of skilld, and a relative import is resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _module_of(path)
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.append((module, node.lineno))
            for alias in node.names:
                sub = SRC.joinpath(*module.split("."), alias.name)
                if sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file():
                    found.append((f"{module}.{alias.name}", node.lineno))
    return found


def _package_of(path: Path) -> str:
    rel = path.relative_to(SRC / "skilld")
    return rel.parts[0].removesuffix(".py") if rel.parts else ""


def _modules() -> list[Path]:
    return sorted(
        p
        for p in (SRC / "skilld").rglob("*.py")
        if p.parent != SRC / "skilld" or p.stem in ("errors", "types", "digest", "paths", "call")
    )


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_imports_point_one_way(path: Path) -> None:
    """Each module imports only the skilld packages and libraries its package may use."""
    pkg = _package_of(path)
    allowed = ALLOWED[pkg]
    for name, line in _imports(path):
        top = name.split(".")[0]
        where = f"{path.relative_to(SRC)}:{line}"
        if top == "skilld" and name not in BASE:
            target = name.split(".")[1]
            assert target == pkg or "*" in allowed or target in allowed, (
                f"{where}: {pkg}/ may not import {name}"
            )
        if top in BOUNDARIES and (path.relative_to(SRC).as_posix(), name) in TEXT_ONLY:
            assert _names_from(path, line) <= TEXT_ONLY[(path.relative_to(SRC).as_posix(), name)], (
                f"{where}: only wasmtime's text assembler may be imported here"
            )
        elif top in BOUNDARIES:
            assert pkg in BOUNDARIES[top], (
                f"{where}: {top} may only be imported in {sorted(BOUNDARIES[top])}/"
            )


@pytest.mark.parametrize(
    ("source", "where", "imported"),
    [
        ("from skilld import sandbox\n", "skilld/registry/_x.py", "skilld.sandbox"),
        ("from skilld import ABI_VERSION\n", "skilld/registry/_x.py", None),
        ("from ..sandbox import Sandbox\n", "skilld/registry/_x.py", "skilld.sandbox"),
        ("from . import _catalogue\n", "skilld/registry/__init__.py", "skilld.registry._catalogue"),
        ("from .abi import shell\n", "skilld/sandbox/_x.py", "skilld.sandbox.abi.shell"),
    ],
)
def test_every_import_form_is_seen(
    source: str, where: str, imported: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``from skilld import X`` and relative imports are resolved to the module they name."""
    fake = SRC / where
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: source)
    names = {name for name, _line in _imports(fake)}
    if imported is None:
        assert names == {"skilld"}
    else:
        assert imported in names


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_private_module_of_another_package(path: Path) -> None:
    """A package uses another only through its public names, never a ``_module`` of it."""
    pkg = _package_of(path)
    for name, line in _imports(path):
        parts = name.split(".")
        if parts[0] == "skilld" and len(parts) > 2 and parts[1] != pkg:
            assert not any(part.startswith("_") for part in parts[2:]), (
                f"{path.relative_to(SRC)}:{line}: {pkg}/ imports {name}, a private module of "
                f"{parts[1]}/: export what it needs from {parts[1]}/__init__.py or a public module"
            )


def test_sdk_is_self_contained() -> None:
    """The guest SDK imports nothing from skilld (it runs inside the component)."""
    for path in (SRC / "skilld_sdk").rglob("*.py"):
        for name, line in _imports(path):
            assert not name.startswith("skilld.") and name != "skilld", f"{path}:{line}: {name}"


def test_errors_and_types_import_nothing_internal() -> None:
    """errors.py and types.py import nothing from skilld, which keeps cycles out."""
    for stem in ("errors", "types"):
        for name, line in _imports(SRC / "skilld" / f"{stem}.py"):
            assert not name.startswith("skilld"), f"{stem}.py:{line}: {name}"


def test_architecture_doc_lists_the_packages_of_this_table() -> None:
    """docs/architecture.md's subsystem table and ALLOWED name the same packages."""
    doc = (SRC.parent / "docs" / "architecture.md").read_text()
    first_cells = re.findall(r"^\| (`[^|]+)\|", doc, flags=re.MULTILINE)
    named = {name for cell in first_cells for name in re.findall(r"`([a-z_]+)(?:\.py|/)`", cell)}
    assert named == set(ALLOWED) - {"digest", "paths"}
