"""Build a skill from source into a WebAssembly component (componentize-py, or WAT).

A skill source directory holds ``skill.yaml`` (id, name, version, description,
needs) and ``skill.py`` (the module with one ``skilld_sdk.Skill``). The build
stages the sources, the SDK and a generated entry module, narrows the WIT world
to the interfaces the skill declares under ``needs`` (plus ``log``), and runs
componentize-py. Outputs are cached by a digest of everything that goes in, so
a second build of unchanged sources costs one hash.

A directory with ``skill.wat`` instead of ``skill.py`` holds a component written
in WebAssembly text; it is assembled as it is (``skills/echo-wat`` shows the ABI
spelled out by hand). It imports whatever its text imports: the load-time check
against the policy's grants is what bounds it, as for any component.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from skilld import paths
from skilld.errors import BuildError
from skilld.package._pack import read_skill_meta

INTERFACES = ("log", "kv", "fs", "http", "tcp", "shell", "invoke", "transfer", "env", "mcp")
# The preamble of a component binary (magic, version 0x0d, layer 1), not a core module.
_COMPONENT_HEADER = b"\x00asm\x0d\x00\x01\x00"
_SKIP = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def imports_of(needs: Mapping[str, Any]) -> tuple[str, ...]:
    """The host interfaces a component built with these needs imports (``log`` always)."""
    return tuple(i for i in INTERFACES if i == "log" or i in needs)


def _files(root: Path) -> list[Path]:
    out = []
    for path in sorted(root.rglob("*")):
        if any(part in _SKIP for part in path.relative_to(root).parts):
            continue
        if path.is_file() and path.suffix not in (".pyc", ".wasm", ".skill"):
            out.append(path)
    return out


def _tool_version() -> str:
    from importlib.metadata import version

    return version("componentize-py")


def source_digest(src_dir: Path) -> str:
    """sha256 over everything a build depends on.

    That is the skill's files, the SDK, the WIT, this module (its entry-module and
    world templates shape every component) and the versions of componentize-py and
    of the Python running the build.
    """
    h = hashlib.sha256()
    h.update(f"componentize-py {_tool_version()}\npython {sys.version}\n".encode())
    builder = Path(__file__).read_bytes()
    h.update(f"builder {len(builder)}\n".encode())
    h.update(builder)
    for label, root in (("skill", src_dir), ("sdk", paths.sdk_dir()), ("wit", paths.wit_dir())):
        for path in _files(root):
            rel = path.relative_to(root).as_posix()
            data = path.read_bytes()
            h.update(f"{label}/{rel} {len(data)}\n".encode())
            h.update(data)
    return h.hexdigest()


def _world(imports: tuple[str, ...]) -> str:
    lines = [f"    import {name};" for name in imports]
    return "\nworld skill-built {\n" + "\n".join(lines) + "\n    export guest;\n}\n"


def _componentize() -> list[str]:
    exe = Path(sys.executable).with_name("componentize-py")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("componentize-py")
    if found is None:
        raise BuildError("componentize-py is not installed", hint="pip install 'skilld[build]'")
    return [found]


def _components_dir(cache_root: Path) -> Path:
    """``cache_root/components``, created 0700 whatever the umask: the native-code
    cache shares this root and refuses one that group or others can write."""
    cache = cache_root / "components"
    cache_root.mkdir(parents=True, exist_ok=True, mode=0o700)
    cache.mkdir(exist_ok=True, mode=0o700)
    return cache


def _build_wat(source: Path, cache_dir: Path, out: Path | None) -> Path:
    """Assemble a component written in WebAssembly text (milliseconds: not looked up)."""
    # wasmtime's text assembler only, no engine: running code stays in sandbox/.
    from wasmtime import WasmtimeError, wat2wasm

    try:
        wasm = bytes(wat2wasm(source.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError) as exc:
        raise BuildError(f"cannot read {source}: {exc}") from exc
    except WasmtimeError as exc:
        # wat2wasm's message names the line and column and quotes the source line.
        raise BuildError(f"{source}: {str(exc).strip()}") from exc
    if not wasm.startswith(_COMPONENT_HEADER):
        raise BuildError(
            f"{source} is a core module, not a component",
            hint="wrap it in (component ...) that exports skilld:skill/guest; see skills/echo-wat",
        )
    if out is not None:
        target = Path(out)
        target.parent.mkdir(parents=True, exist_ok=True)
    else:
        target = _components_dir(cache_dir) / f"{hashlib.sha256(wasm).hexdigest()}.wasm"
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(wasm)
    tmp.replace(target)
    return target


def build_component(
    src_dir: Path, *, cache_dir: Path | None = None, out: Path | None = None
) -> Path:
    """Build the skill in ``src_dir``; returns the path of its ``component.wasm``.

    The result is cached under ``cache_dir/components/<digest>.wasm``; with
    ``out`` it is also copied there.

    Raises:
        BuildError: bad ``skill.yaml``, or componentize-py failed (the message
            holds its output, including the Python traceback).
    """
    src_dir = Path(src_dir)
    source = read_skill_meta(src_dir)
    has_py, has_wat = (src_dir / "skill.py").is_file(), (src_dir / "skill.wat").is_file()
    if has_py == has_wat:
        raise BuildError(
            f"{'both' if has_py else 'neither'} skill.py {'and' if has_py else 'nor'} "
            f"skill.wat in {src_dir}",
            hint="a skill is built from skill.py (Python) or skill.wat (a component in "
            "WebAssembly text), one of them",
        )
    if has_wat:
        return _build_wat(src_dir / "skill.wat", cache_dir or paths.cache_dir(), out)
    digest = source_digest(src_dir)
    cached = (cache_dir or paths.cache_dir()) / "components" / f"{digest}.wasm"
    if not cached.is_file():
        _components_dir(cache_dir or paths.cache_dir())
        with tempfile.TemporaryDirectory(prefix="skilld-build-") as tmp:
            stage = Path(tmp)
            app = stage / "app"
            shutil.copytree(src_dir, app, ignore=shutil.ignore_patterns(*_SKIP, "*.wasm"))
            shutil.copytree(
                paths.sdk_dir(), app / "skilld_sdk", ignore=shutil.ignore_patterns(*_SKIP)
            )
            (app / "_skilld_entry.py").write_text(
                "import skill as _skill_module\n"
                "from skilld_sdk._export import export\n\n"
                f"Guest = export(_skill_module, id={source.id!r}, version={source.version!r}, "
                f"description={json.dumps(source.description)})\n"
            )
            wit = stage / "wit"
            wit.mkdir()
            abi = (paths.wit_dir() / "skill.wit").read_text()
            (wit / "skill.wit").write_text(abi + _world(imports_of(source.needs)))
            target = stage / "component.wasm"
            cmd = [
                *_componentize(),
                "-q",
                "-d",
                str(wit),
                "-w",
                "skill-built",
                "componentize",
                "-p",
                str(app),
                "_skilld_entry",
                "-o",
                str(target),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=stage)
            if proc.returncode != 0 or not target.is_file():
                output = (proc.stderr or proc.stdout).strip()
                # componentize-py appends a Rust backtrace after the Python one; keep ours.
                output = output.split("\nStack backtrace:")[0]
                raise BuildError(f"building skill '{source.id}' from {src_dir} failed:\n{output}")
            tmp_out = cached.with_suffix(f".{os.getpid()}.tmp")
            shutil.copyfile(target, tmp_out)
            tmp_out.replace(cached)
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cached, out)
        return out
    return cached
