"""The CPython runner: Python code run inside a skilld component, not on the host.

One component, built once like any Python skill and cached by digest. The host
gives each call its own instance and decides what the code can reach: WASI
preopens for that call only, no sockets (the component imports no socket
interface the host would give it), the call's memory cap and deadline.

``run_script`` (Agent Skills' ``wasm`` executor): run a script of a skill, whose
directory the host preopens read-only at ``/skill``, with a fresh writable
workspace at ``/workspace`` (its working directory and ``TMPDIR``).
"""

from __future__ import annotations

import importlib
import io
import os
import pkgutil
import runpy
import sys
import traceback
from typing import Any

from skilld_sdk import Skill, SkillError

# componentize-py keeps only what was imported while it pre-initialised this module
# (the guest has no standard library files at run time), so the standard library is
# imported here, all of it that can run in WASI: a script may import any of it.
# Left out: modules with side effects on import, GUI, tests and the build tooling.
_NOT_IMPORTED = frozenset(
    {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "ensurepip",
     "venv", "lib2to3", "test", "pydoc", "pydoc_data", "distutils", "msilib", "winreg",
     "winsound", "msvcrt", "_winapi", "nt", "__main__"}
)  # fmt: skip


def _preload_stdlib() -> None:
    for name in sorted(sys.stdlib_module_names - _NOT_IMPORTED):
        try:
            module = importlib.import_module(name)
        except BaseException:  # noqa: BLE001, S112 - not available in WASI (sockets, threads, C)
            continue
        for info in pkgutil.walk_packages(getattr(module, "__path__", []), f"{name}."):
            if info.name.rsplit(".", 1)[-1].startswith(("test", "_test")) or ".test" in info.name:
                continue
            try:
                importlib.import_module(info.name)
            except BaseException:  # noqa: BLE001, S112 - as above
                continue


_preload_stdlib()

skill = Skill()

SKILL_DIR = "/skill"
WORKSPACE = "/workspace"


@skill.method
def run_script(path: str, argv: list[str], stdin: str = "") -> dict[str, Any]:
    """Run a Python script of the skill as ``__main__`` and report how it ended.

    Args:
        path: the script's path inside the skill directory (``scripts/x.py``).
        argv: its arguments (``sys.argv[1:]``).
        stdin: what it reads from standard input.
    """
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise SkillError("invalid-argument", f"not a path inside the skill: {path!r}")
    script = f"{SKILL_DIR}/{path}"
    out, err = io.StringIO(), io.StringIO()
    saved = (sys.argv, sys.stdin, sys.stdout, sys.stderr, list(sys.path))
    sys.argv = [script, *argv]
    sys.stdin = io.StringIO(stdin)
    sys.stdout, sys.stderr = out, err
    sys.path.insert(0, script.rsplit("/", 1)[0])
    os.environ["TMPDIR"] = WORKSPACE
    status = 0
    try:
        os.chdir(WORKSPACE)
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        status = _exit_status(exc.code, err)
    except BaseException:  # noqa: BLE001 - the script's failure is its exit status, as in CPython
        traceback.print_exc(file=err)
        status = 1
    finally:
        sys.argv, sys.stdin, sys.stdout, sys.stderr, sys.path[:] = saved
    return {"exit_status": status, "stdout": out.getvalue(), "stderr": err.getvalue()}


def _exit_status(code: object, err: io.StringIO) -> int:
    """What ``sys.exit(code)`` makes the process's exit status (as CPython does)."""
    if code is None:
        return 0
    if isinstance(code, int) and not isinstance(code, bool):
        return code & 0xFF
    print(code, file=err)
    return 1
