"""The CPython runner: one component, built once, that runs short Python programs.

It is a skilld_sdk skill like any other (``skilld skill build`` builds it, the
components cache keeps it by digest). The host never ``exec``s a program itself:
it validates it (``skilld.delegate``) and hands it to this guest, whose only way
out of the wasm sandbox is the host's ``invoke`` and whose deadline and memory cap
are the sandbox's.

Each method sits on its own below the shared helpers:

- ``run_program`` (delegate): a program over a *kit*; every kit tool is a plain
  function here that calls ``invoke`` (so the call goes through the registry, the
  callee's own sandbox and policy, and the audit log).
- ``run_script`` (Agent Skills' ``wasm`` executor): a script of a skill, whose
  directory the host preopens read-only at ``/skill``, run as ``__main__`` with argv
  and stdin, in a fresh writable workspace at ``/workspace`` (its working directory
  and ``TMPDIR``); no sockets, the call's memory cap and deadline.

A guest blocked in a WASI call (a sleep, a poll) runs no wasm code, so the host's epoch
check, which stops a guest at its deadline or on cancel, never sees it: a 25 s
``time.sleep`` under a 5 s wall time returned after 25.1 s. wasmtime-py gives the host
no way to cut a WASI wait short (its clocks and polls are wasmtime's own, with no hook
and no handle on their pollables), so this runner waits in slices instead: ``time.sleep``,
``select.select`` and ``select.poll`` (and ``selectors``, which holds its own references)
block for at most ``WAIT_SLICE_S`` at a time and run guest code in between, where the
epoch check stops the call within a slice of its deadline or cancel.

componentize-py keeps only what was imported while it pre-initialised this module
(the guest has no standard library files at run time), so the standard library is
imported here, all of it that runs in WASI: a script may import any of it.
"""

from __future__ import annotations

import builtins
import importlib
import io
import json
import os
import pkgutil
import runpy
import select
import selectors
import sys
import time
import traceback
from typing import Any

from skilld_sdk import Skill, SkillError, invoke

skill = Skill()

# Not preloaded: modules with side effects on import, GUI, tests and the build tooling.
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

# -- waits in slices (see the module docstring) ------------------------------------------

WAIT_SLICE_S = 0.005
_wasi_sleep = time.sleep
_wasi_select = getattr(select, "select", None)
_wasi_poll = getattr(select, "poll", None)


def _sliced_sleep(seconds: float) -> None:
    """``time.sleep``, in slices of at most ``WAIT_SLICE_S`` with guest code between them."""
    seconds = float(seconds)
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        _wasi_sleep(min(left, WAIT_SLICE_S))


def _sliced_select(rlist: Any, wlist: Any, xlist: Any, timeout: float | None = None) -> Any:
    """``select.select``, waiting in slices until something is ready or ``timeout`` passes."""
    assert _wasi_select is not None
    end = None if timeout is None else time.monotonic() + float(timeout)
    while True:
        left = WAIT_SLICE_S if end is None else min(max(end - time.monotonic(), 0), WAIT_SLICE_S)
        ready = _wasi_select(rlist, wlist, xlist, left)
        if any(ready) or (end is not None and time.monotonic() >= end):
            return ready


class _SlicedPoll:
    """A ``select.poll`` object whose ``poll`` waits in slices."""

    def __init__(self) -> None:
        assert _wasi_poll is not None
        self._poll = _wasi_poll()
        self.register = self._poll.register
        self.modify = self._poll.modify
        self.unregister = self._poll.unregister

    def poll(self, timeout: float | None = None) -> list[tuple[int, int]]:
        """Ready descriptors, waiting at most ``timeout`` ms (None or negative: forever)."""
        forever = timeout is None or timeout < 0
        end = 0.0 if forever else time.monotonic() + float(timeout or 0) / 1000
        while True:
            left = WAIT_SLICE_S if forever else min(max(end - time.monotonic(), 0), WAIT_SLICE_S)
            ready: list[tuple[int, int]] = self._poll.poll(left * 1000)
            if ready or (not forever and time.monotonic() >= end):
                return ready


time.sleep = _sliced_sleep  # type: ignore[assignment]
if _wasi_select is not None:
    select.select = _sliced_select
    selectors.SelectSelector._select = staticmethod(_sliced_select)  # type: ignore[attr-defined]
if _wasi_poll is not None:
    select.poll = _SlicedPoll  # type: ignore[misc,assignment]
    if hasattr(selectors, "PollSelector"):
        selectors.PollSelector._selector_cls = _SlicedPoll  # type: ignore[attr-defined]

PROGRAM_FILE = "<program>"

# The builtins a program may call. No getattr/type/vars/open/__import__: the
# validator refuses them first, and here they simply do not exist.
SAFE_BUILTINS: dict[str, Any] = {
    name: getattr(builtins, name)
    for name in (
        "abs", "all", "any", "bool", "dict", "enumerate", "filter", "float", "int", "len",
        "list", "map", "max", "min", "range", "reversed", "round", "set", "sorted", "str",
        "sum", "tuple", "zip",
    )
}  # fmt: skip


class _Limit(Exception):
    """A cap of the run was reached (tool calls or output size)."""


def _json_only(value: Any, what: str) -> Any:
    """``value`` when it is JSON data (dict with str keys, list, str, number, bool, None)."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        raise SkillError(
            "invalid-argument", f"{what} must be JSON data, not {type(value).__name__}"
        ) from None


def _program_line(exc: BaseException) -> int | None:
    """The line of the program (not of this runner) where ``exc`` was raised."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename == PROGRAM_FILE:
            return frame.lineno
    return getattr(exc, "lineno", None)


class _Printed:
    """``print`` for programs: text kept up to a cap, never written anywhere."""

    def __init__(self, cap: int):
        self.parts: list[str] = []
        self.size = 0
        self.cap = cap

    def __call__(self, *values: Any, sep: str = " ", end: str = "\n") -> None:
        text = str(sep).join(str(v) for v in values) + str(end)
        self.size += len(text.encode())
        if self.size > self.cap:
            raise _Limit(f"printed output exceeds the cap of {self.cap} bytes")
        self.parts.append(text)


@skill.method
def run_program(
    program: str,
    tools: dict[str, Any],
    params: dict[str, Any] | None = None,
    max_calls: int = 64,
    max_output: int = 65536,
) -> dict[str, Any]:
    """Run a validated program whose kit tools call the host's invoke.

    The program's answer is the value it binds to ``result`` (JSON data), or,
    without one, what it printed.

    Args:
        program: the program's source (validated by the host first).
        tools: function name -> {"skill": id, "method": name, "params": [names]}, where
            ``params`` are the names positional arguments bind, in order.
        params: values bound as names before the program runs (JSON data).
        max_calls: at most this many tool calls.
        max_output: at most this many bytes of result (as JSON) or printed text.
    """
    calls = [0]

    def make_tool(name: str, spec: dict[str, Any]) -> Any:
        target_skill, target_method = str(spec["skill"]), str(spec["method"])
        order = [str(p) for p in spec.get("params", [])]

        def tool(*args: Any, **kwargs: Any) -> Any:
            if len(args) > len(order):
                raise TypeError(
                    f"{name}() takes at most {len(order)} positional arguments; "
                    "pass the others by name"
                )
            for pname, value in zip(order, args, strict=False):
                if pname in kwargs:
                    raise TypeError(f"{name}() got two values for '{pname}'")
                kwargs[pname] = value
            calls[0] += 1
            if calls[0] > max_calls:
                raise _Limit(f"more than {max_calls} tool calls")
            return invoke.call(target_skill, target_method, _json_only(kwargs, f"{name}() args"))

        tool.__name__ = name
        return tool

    printed = _Printed(max_output)
    namespace: dict[str, Any] = {"__builtins__": {**SAFE_BUILTINS, "print": printed}}
    namespace.update(_json_only(params or {}, "params"))
    for name, spec in tools.items():
        namespace[name] = make_tool(name, spec)
    try:
        code = compile(program, PROGRAM_FILE, "exec", dont_inherit=True)
        exec(code, namespace)  # noqa: S102 - the guest is the sandbox; the host validated it
    except _Limit as exc:
        return _failed("limit-exceeded", str(exc), _program_line(exc), calls[0], printed)
    except SkillError as exc:  # HostError too: a tool refused or failed
        return _failed(exc.code, exc.message, _program_line(exc), calls[0], printed, exc.rule)
    except (MemoryError, RecursionError) as exc:
        kind = "memory" if isinstance(exc, MemoryError) else "recursion depth"
        return _failed("limit-exceeded", f"out of {kind}", _program_line(exc), calls[0], printed)
    except Exception as exc:  # noqa: BLE001 - a program's bug is its result, not the runner's
        message = f"{type(exc).__name__}: {exc}"
        return _failed("program-error", message, _program_line(exc), calls[0], printed)
    output: Any = "".join(printed.parts)
    if "result" in namespace:
        try:
            output = _json_only(namespace["result"], "result")
        except SkillError as exc:
            return _failed(exc.code, exc.message, None, calls[0], printed)
    size = len(json.dumps(output).encode())
    if size > max_output:
        message = f"the result is {size} bytes, over the cap of {max_output}"
        return _failed("limit-exceeded", message, None, calls[0], printed)
    return {"success": True, "output": output, "error": None, "tool_calls": calls[0]}


def _failed(
    code: str,
    message: str,
    line: int | None,
    calls: int,
    printed: _Printed,
    rule: str | None = None,
) -> dict[str, Any]:
    return {
        "success": False,
        "output": "".join(printed.parts),
        "error": {"code": code, "message": message, "line": line, "rule": rule},
        "tool_calls": calls,
    }


# -- run_script (Agent Skills) ---------------------------------------------------

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
