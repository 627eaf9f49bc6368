"""The sandbox runs real components under hard limits; a bad guest costs one call."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from skilld.errors import (
    CompileError,
    DeadlineExceeded,
    DigestMismatch,
    GuestError,
    GuestFault,
    GuestTrap,
    LinkError,
    MemoryExhausted,
    StackExhausted,
)
from skilld.registry import NullChannel
from skilld.sandbox import CallContext, Component, Sandbox
from skilld.sandbox._native import NativeCache
from skilld.state import SqliteState
from skilld.types import Limits

Loader = Callable[[str], Path]


@pytest.fixture(scope="module")
def echo(sandbox: Sandbox, component_path: Loader) -> Component:
    """The echo skill, loaded."""
    return sandbox.load(component_path("echo").read_bytes(), name="echo")


@pytest.fixture(scope="module")
def hostile(sandbox: Sandbox, component_path: Loader) -> Component:
    """The hostile test skill, loaded."""
    return sandbox.load(component_path("hostile").read_bytes(), name="hostile")


def ctx(skill: str = "echo", **limits: int) -> CallContext:
    """A call context with no client and the given limits."""
    return CallContext(skill, Limits(**limits), NullChannel())


def test_echo_roundtrip(echo: Component) -> None:
    """A method's JSON value comes back unchanged."""
    assert echo.call("echo", json.dumps({"text": "héllo"}), ctx()).value == "héllo"


def test_structured_result(echo: Component) -> None:
    """Dataclass results come back as JSON objects."""
    out = echo.call("structured", json.dumps({"name": "sq", "points": [{"x": 1, "y": 2}]}), ctx())
    assert out.value == {"name": "sq", "points": [{"x": 1.0, "y": 2.0}], "closed": False}


def test_typed_error(echo: Component) -> None:
    """A SkillError in the guest arrives as GuestError with its code."""
    with pytest.raises(GuestError) as info:
        echo.call("fail", json.dumps({"code": "not-found", "message": "gone"}), ctx())
    assert info.value.code == "not-found"
    assert "gone" in str(info.value)


def test_bad_arguments_are_invalid_argument(echo: Component) -> None:
    """Arguments that do not fit the signature are refused by the SDK, naming the field."""
    with pytest.raises(GuestError) as info:
        echo.call("echo", json.dumps({"text": 3}), ctx())
    assert info.value.code == "invalid-argument"
    assert "text" in str(info.value)


def test_unknown_method(echo: Component) -> None:
    """An unknown method is a not-found error listing the methods."""
    with pytest.raises(GuestError, match="echo"):
        echo.call("nope", "{}", ctx())


def test_describe(echo: Component) -> None:
    """describe returns the id, version and method schemas from the build."""
    spec = echo.describe(ctx())
    assert (spec.id, spec.version) == ("echo", "0.1.0")
    assert {m.name for m in spec.methods} == {"echo", "fail", "structured"}


def test_loop_stopped_at_deadline(hostile: Component) -> None:
    """A looping guest runs until its deadline, not before, and is stopped within 15 ms of it."""
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="200 ms"):
        hostile.call("loop", "{}", ctx("hostile", timeout_ms=200))
    elapsed_ms = (time.monotonic() - start) * 1000
    # The interrupt compares the wall clock with the deadline itself, so it is never early.
    assert 200 <= elapsed_ms <= 200 + 15, elapsed_ms


def test_memory_cap(hostile: Component) -> None:
    """A guest allocating without end gets a memory error at its cap."""
    with pytest.raises(MemoryExhausted, match="64 MiB"):
        hostile.call("alloc", "{}", ctx("hostile", memory_bytes=64 << 20))


def test_stack_overflow(hostile: Component) -> None:
    """Unbounded recursion becomes StackExhausted."""
    with pytest.raises(StackExhausted):
        hostile.call("recurse", "{}", ctx("hostile"))


def test_trap(hostile: Component) -> None:
    """An abort is a GuestTrap whose detail (for the audit only) names the trap, not its message."""
    with pytest.raises(GuestTrap) as trapped:
        hostile.call("trap", "{}", ctx("hostile"))
    assert trapped.value.detail is not None and "unreachable" in trapped.value.detail
    assert "unreachable" not in str(trapped.value)


def test_output_captured_not_printed(hostile: Component, capfd: pytest.CaptureFixture[str]) -> None:
    """Guest stdout/stderr are captured (capped), never written to the process's streams."""
    c = ctx("hostile")
    assert hostile.call("shout", json.dumps({"megabytes": 1}), c).value == 1
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert len(c.stdout) == 64 * 1024
    assert c.dropped_output > 0


def test_denied_capability_is_typed(hostile: Component) -> None:
    """A capability without a grant answers not-permitted with a rule, inside the guest."""
    assert hostile.call("forbidden", "{}", ctx("hostile")).value == "not-permitted:default-deny"


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_host_survives_hostile_calls(hostile: Component, echo: Component) -> None:
    """After 100 failing calls, each failing with its own fault type, the host answers
    normally and its memory grew by at most 10%."""
    bad: list[tuple[str, int, type[GuestFault]]] = [
        ("trap", 10_000, GuestTrap),
        ("alloc", 10_000, MemoryExhausted),
        ("recurse", 10_000, StackExhausted),
        ("loop", 50, DeadlineExceeded),
    ]

    def fail(method: str, timeout_ms: int, fault: type[GuestFault]) -> None:
        with pytest.raises(GuestFault) as info:
            hostile.call(method, "{}", ctx("hostile", timeout_ms=timeout_ms, memory_bytes=64 << 20))
        # Exact type: a subclass check would let a trap pass for a memory error.
        assert type(info.value) is fault, (method, info.value)

    for case in bad:  # warm up allocator arenas before measuring
        fail(*case)
    before = _rss()
    for i in range(100):
        fail(*bad[i % len(bad)])
    after = _rss()
    assert echo.call("echo", '{"text": "still here"}', ctx()).value == "still here"
    assert after <= before * 1.10, (before, after)


def test_ungranted_import_fails_at_load(sandbox: Sandbox, component_path: Loader) -> None:
    """A component importing an interface its policy does not grant is refused at load."""
    with pytest.raises(LinkError, match="kv") as info:
        sandbox.load(component_path("notes").read_bytes(), name="notes", granted=["log"])
    assert "policy does not grant" in str(info.value)


def test_not_a_component(sandbox: Sandbox) -> None:
    """Garbage bytes fail to compile with a CompileError naming the source."""
    with pytest.raises(CompileError, match="junk"):
        sandbox.load(b"\0asm junk", name="junk")


def test_native_cache_checks_digest(sandbox: Sandbox, component_path: Loader) -> None:
    """Cached native code is loaded only when its sha256 matches; a damaged entry is rebuilt."""
    import hashlib

    assert sandbox.cache is not None
    wasm = component_path("echo").read_bytes()
    key = hashlib.sha256(wasm).hexdigest()
    native = sandbox.cache.root / f"{key}.cwasm"
    sidecar = sandbox.cache.root / f"{key}.sha256"
    assert native.is_file() and sidecar.is_file()
    with pytest.raises(DigestMismatch, match="expected"):
        sandbox.load_native(native, "0" * 64, name="echo")
    data = bytearray(native.read_bytes())
    data[len(data) // 2] ^= 0xFF
    native.write_bytes(bytes(data))
    comp = sandbox.load(wasm, name="echo")  # recompiles instead of loading damaged code
    assert comp.call("echo", '{"text": "x"}', ctx()).value == "x"
    assert hashlib.sha256(native.read_bytes()).hexdigest() == sidecar.read_text().strip()


@pytest.mark.parametrize("level", [(), ("native",)])
def test_native_cache_refuses_group_writable_levels(
    sandbox: Sandbox, tmp_path: Path, level: tuple[str, ...]
) -> None:
    """A group-writable cache root, or a group-writable level below it, refuses the cache."""
    root = tmp_path / "cache"
    NativeCache(sandbox.engine, root)
    root.joinpath(*level).chmod(0o770)
    with pytest.raises(CompileError, match="writable by group or others") as info:
        NativeCache(sandbox.engine, root)
    assert info.value.location == str(root.joinpath(*level))


def test_native_cache_refuses_another_users_directory(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache directory owned by someone else is refused, however private its mode."""
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    me = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: me + 1)
    with pytest.raises(CompileError, match=f"owned by uid {me}"):
        NativeCache(sandbox.engine, root)


def test_native_cache_creates_private_levels(sandbox: Sandbox, tmp_path: Path) -> None:
    """Every level the cache creates is 0700, whatever the umask allows."""
    old = os.umask(0)
    try:
        cache = NativeCache(sandbox.engine, tmp_path / "cache")
    finally:
        os.umask(old)
    for path in (cache.root, cache.root.parent, cache.root.parent.parent):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path


def test_state_persists_through_guest(
    sandbox: Sandbox, component_path: Loader, tmp_path: Path
) -> None:
    """notes writes through kv land in SQLite and are read back by a new instance."""
    notes = sandbox.load(component_path("notes").read_bytes(), name="notes")
    state = SqliteState(tmp_path / "s.db")
    c = CallContext("notes", Limits(), NullChannel(), kv=state.store("notes"))
    notes.call("add", json.dumps({"title": "t", "body": "b"}), c)
    assert notes.call("get", json.dumps({"title": "t"}), c).value == {"title": "t", "body": "b"}
    assert notes.call("list", "{}", c).value == ["t"]
    assert notes.call("delete", json.dumps({"title": "t"}), c).value is True
    with pytest.raises(GuestError, match="not-found"):
        notes.call("get", json.dumps({"title": "t"}), c)
    state.close()
