"""Kept outputs are their caller's, and a hostile workspace costs the server nothing.

A real ``skilld serve`` (HTTP with two named tokens, alice and mallory; or stdio) of a
native Agent Skill whose script leaves what an attacker would: a secret too large to
embed (kept as ``skill://reporter/runs/...``), sparse files at the size cap, a name that
is not UTF-8, a tree 70 levels deep. Issue 27 item 4 and issue 28 item 4.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import ClientSession
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from skilld.agentskills._collect import COLLECT_MEMORY, MAX_KEPT_FILE
from skilld.agentskills._kept import KeptOutputs, digest_uri
from skilld.sandbox import Sandbox
from skilld.types import Caller
from support.agentskills import serve_built
from support.mcp_fakes import as_caller, client_tokens, token_of
from support.modern_http import modern, payload, stalled
from support.serve_process import ServeProcess

REPORT = """\
import os, sys
what = sys.argv[1]
if what == "secret":
    with open("report.txt", "w") as f:
        f.write(sys.argv[2] + "\\n" + "x" * (600 << 10))
elif what == "sparse":
    for i in range(int(sys.argv[2])):
        with open("big%02d.bin" % i, "wb") as f:
            f.truncate(int(sys.argv[3]))
elif what == "badname":
    open(b"bad\\xff.txt", "wb").write(b"not utf-8")
    open("ok.txt", "w").write("fine")
elif what == "deep":
    fd = os.open(".", os.O_RDONLY)
    for _ in range(int(sys.argv[2])):
        os.mkdir("d", dir_fd=fd)
        sub = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = sub
    leaf = os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
    os.write(leaf, b"bottom")
elif what == "cat":
    print(open(sys.argv[2]).read()[:40])
print("done")
"""
# Each caller's room for kept outputs on the served node (--kept-mib-per-caller).
CALLER_MIB = 128


def _skill(root: Path) -> None:
    skill = root / "skills" / "reporter"
    (skill / "scripts").mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: reporter\ndescription: Writes reports. Test use only.\n---\nRun it.\n"
    )
    (skill / "scripts" / "report.py").write_text(REPORT)
    (root / "policies").mkdir()
    (root / "policies" / "reporter.yaml").write_text(
        "skill: reporter\nscripts:\n  executor: native\nlimits:\n  wall_time: 60s\n"
    )


@pytest.fixture(scope="module")
def served(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The reporter skill served over HTTP; alice's and mallory's tokens in a 0600 file;
    each caller may keep CALLER_MIB."""
    root = tmp_path_factory.mktemp("kept")
    _skill(root)
    # With authentication on, a caller no rule names gets nothing: both may use reporter.
    (root / "policies" / "callers").mkdir()
    (root / "policies" / "callers" / "team.yaml").write_text(
        "rules:\n  - id: team\n    who: [{token: alice}, {token: mallory}]\n"
        "    skills: [reporter]\n"
    )
    serve_built(root, sandbox, strict=True)
    tokens = client_tokens(root, "alice", "mallory")
    server = ServeProcess(
        root / "bundle",
        root / "state",
        extra=["--token-file", str(tokens), "--kept-mib-per-caller", str(CALLER_MIB)],
    )
    try:
        yield {"server": server, "root": root}
    finally:
        server.stop()


def _as(served: dict[str, Any], who: str, fn: Any) -> Any:
    async def go() -> Any:
        with anyio.fail_after(180):
            return await as_caller(served["server"].url, who, fn)

    return anyio.run(go)


def _run(served: dict[str, Any], who: str, *args: str, files: Any = None) -> Any:
    arguments: dict[str, Any] = {"script": "scripts/report.py", "args": list(args)}
    if files is not None:
        arguments["files"] = files

    async def call(s: ClientSession) -> Any:
        return await s.call_tool("reporter/run_script", arguments)

    return _as(served, who, call)


def _value(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content[0].text
    value: dict[str, Any] = json.loads(result.content[0].text)
    return value


def _read_error(served: dict[str, Any], who: str, uri: str) -> tuple[int, str]:
    """The error ``who`` gets reading ``uri``, its digest replaced by ``URI``."""

    async def read(s: ClientSession) -> tuple[int, str]:
        with pytest.raises(MCPError) as err:
            await s.read_resource(uri)  # type: ignore[arg-type]
        return err.value.error.code, err.value.error.message.replace(digest_uri(uri), "URI")

    result: tuple[int, str] = _as(served, who, read)
    return result


def _never_kept(uri: str) -> str:
    """A URI of the same form as ``uri`` that no run ever kept."""
    base, _run_id, name = uri.rsplit("/", 2)
    return f"{base}/{secrets.token_hex(8)}/{name}"


def test_a_kept_output_is_its_callers_alone(served: dict[str, Any]) -> None:
    """alice's secret report is kept for her: she reads it (the control); for mallory,
    reading it and handing it to her own run as an input file answer exactly what a URI
    never kept answers; the audit log never holds the URI, only its digest."""
    value = _value(_run(served, "alice", "secret", "alice-s3cret"))
    [kept] = value["resources"]
    uri = kept["uri"]

    async def read(s: ClientSession) -> str:
        got = await s.read_resource(uri)  # type: ignore[arg-type]
        return str(got.contents[0].text)  # type: ignore[union-attr]

    assert _as(served, "alice", read).startswith("alice-s3cret")
    other = _never_kept(uri)
    assert _read_error(served, "mallory", uri) == _read_error(served, "mallory", other)
    assert _read_error(served, "alice", other) == _read_error(served, "mallory", other)

    def handed(target: str) -> str:
        result = _run(served, "mallory", "cat", "in.txt", files=[{"path": "in.txt", "uri": target}])
        assert result.is_error
        return str(result.content[0].text).replace(digest_uri(target), "URI")

    assert handed(uri) == handed(other)
    # The control: alice may hand it to her own run.
    ran = _value(_run(served, "alice", "cat", "in.txt", files=[{"path": "in.txt", "uri": uri}]))
    assert ran["stdout"].startswith("alice-s3cret")
    audit = served["server"].audit_log.read_text()
    assert uri not in audit
    assert digest_uri(uri) in audit


def test_mallorys_runs_never_evict_alices_kept_output(served: dict[str, Any]) -> None:
    """mallory's nine runs of 5 files at the size cap (sparse, so they cost no disk) each
    pass her own cap (--kept-mib-per-caller 128): her own outputs make room, alice's
    report stays readable; each answer lists only what is kept (2 files), the other
    three counted as omitted."""
    value = _value(_run(served, "alice", "secret", "still-mine"))
    uri = value["resources"][0]["uri"]
    fit = (CALLER_MIB << 20) // MAX_KEPT_FILE
    for _ in range(9):
        ran = _value(_run(served, "mallory", "sparse", "5", str(MAX_KEPT_FILE)))
        assert len(ran["resources"]) == fit == 2
        assert ran["files_omitted"] == 5 - fit

    async def read(s: ClientSession) -> str:
        got = await s.read_resource(uri)  # type: ignore[arg-type]
        return str(got.contents[0].text)  # type: ignore[union-attr]

    assert _as(served, "alice", read).startswith("still-mine")


def _status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) << 10
    raise AssertionError(f"no {field} for {pid}")


def test_sparse_outputs_do_not_grow_the_servers_memory(served: dict[str, Any]) -> None:
    """The attack: 40 sparse files at the size cap (2.5 GiB by size, no blocks) took the
    server to 2.6 GiB RSS. Now its peak RSS during the call stays within COLLECT_MEMORY
    of what it held before (the peak is reset first, so nothing earlier hides it)."""
    pid = served["server"].proc.pid
    _value(_run(served, "mallory", "sparse", "1", "1"))  # warm: threads, imports
    if os.geteuid() != 0:
        pytest.skip("resetting the peak RSS (clear_refs) needs to own the process")
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = _status(pid, "VmRSS")
    ran = _value(_run(served, "mallory", "sparse", "40", str(MAX_KEPT_FILE)))
    peak = _status(pid, "VmHWM")
    # The control: the files were there, at the cap, each counted by its size.
    assert len(ran["resources"]) + ran["files_omitted"] == 40
    assert {r["size"] for r in ran["resources"]} == {MAX_KEPT_FILE}
    print(f"peak RSS {peak >> 20} MiB, {(peak - before) >> 10} KiB over {before >> 20} MiB")
    assert peak - before <= COLLECT_MEMORY, (peak - before) >> 20


def test_skillds_files_are_private(served: dict[str, Any]) -> None:
    """The state directory is 0700, the audit log and the state database 0600."""
    state = served["root"] / "state"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for name in ("audit.jsonl", "state.sqlite3"):
        if (state / name).exists():
            assert stat.S_IMODE((state / name).stat().st_mode) == 0o600, name


def test_a_name_not_utf8_and_a_deep_tree_cost_one_call_not_the_server(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """Over stdio (where such a name made the SDK's writer fail and end the server): the
    name is refused, listed escaped, the other file comes back; a tree 70 levels deep is
    handed back and removed; the server answers the next call, nothing is left in its
    work directory, and a new server starts on the same state directory."""
    _skill(tmp_path)
    params = serve_built(tmp_path, sandbox, strict=True)

    async def main() -> None:
        with anyio.fail_after(180):
            await calls()

    async def calls() -> None:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            bad = await s.call_tool(
                "reporter/run_script", {"script": "scripts/report.py", "args": ["badname"]}
            )
            value = _value(bad)
            assert value["files_refused"] == ["bad\\xff.txt"]
            assert value["files"] == ["workspace://reporter/ok.txt"]
            deep = await s.call_tool(
                "reporter/run_script", {"script": "scripts/report.py", "args": ["deep", "70"]}
            )
            assert _value(deep)["exit_status"] == 0
            again = await s.call_tool(
                "reporter/run_script", {"script": "scripts/report.py", "args": ["cat", "/dev/null"]}
            )
            assert _value(again)["stdout"].strip() == "done"

    anyio.run(main)
    left = [p for p in _work_dirs(tmp_path / "state") if p.name.startswith("ws-")]
    assert left == []

    async def restart() -> None:
        with anyio.fail_after(120):
            async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
                await s.initialize()
                assert (await s.list_tools()).tools

    anyio.run(restart)


def _work_dirs(state: Path) -> list[Path]:
    """What is in the server's work directory (STATE/work, or root's shared one)."""
    from skilld import paths

    found: list[Path] = []
    for work in (paths.work_dir(state), *paths.SHARED_WORK.glob("*")):
        if work.is_dir():
            found += list(work.iterdir())
    return found


def test_one_callers_runs_evict_only_its_own(tmp_path: Path) -> None:
    """The store's caps: a caller past its own cap loses its own oldest outputs; with the
    node full, a new output is not kept (the answer lists none) and nobody else's goes."""
    store = KeptOutputs(tmp_path, caller_bytes=300, total_bytes=500)
    alice, mallory = Caller.token("alice"), Caller.token("mallory")

    def keep(caller: Caller, size: int) -> list[dict[str, object]]:
        from skilld.agentskills._kept import Spooled

        reservation = store.reserve(caller)
        if reservation.room < size:
            store.release(reservation)
            return []
        path = store.spool_path()
        path.write_bytes(b"x" * size)
        return store.commit(reservation, "s", [Spooled("f", "text/plain", path.name, size)])

    [first] = keep(alice, 200)
    for _ in range(5):
        assert len(keep(mallory, 150)) == 1
        assert store.used(mallory) <= 300
    assert store.open(alice, str(first["uri"])) is not None
    assert store.open(mallory, str(first["uri"])) is None
    assert keep(Caller.token("eve"), 100) == []  # 200 + 300 held: no room for eve
    assert store.open(alice, str(first["uri"])) is not None


BLOCKED = Path("/tmp/skilld-test-cannot-start")


@pytest.mark.skipif(os.geteuid() != 0, reason="declared temporary paths need a uid per skill")
def test_a_call_that_cannot_start_leaves_nothing_behind(sandbox: Sandbox, tmp_path: Path) -> None:
    """A declared temporary path already taken (a link planted there) refuses the call
    before the script starts: the call is answered with an error, its call directory is
    gone, and the next call of another skill runs."""
    _skill(tmp_path)
    (tmp_path / "skills" / "blocked").mkdir()
    shutil.copytree(
        tmp_path / "skills" / "reporter" / "scripts", tmp_path / "skills" / "blocked" / "scripts"
    )
    (tmp_path / "skills" / "blocked" / "SKILL.md").write_text(
        "---\nname: blocked\ndescription: Cannot start. Test use only.\n---\nRun it.\n"
    )
    (tmp_path / "policies" / "blocked.yaml").write_text(
        f"skill: blocked\nscripts:\n  executor: native\n  temp_paths: [{BLOCKED}]\n"
    )
    params = serve_built(tmp_path, sandbox, strict=True)
    BLOCKED.unlink(missing_ok=True)
    BLOCKED.symlink_to("/etc")
    try:

        async def main() -> None:
            with anyio.fail_after(120):
                async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
                    await s.initialize()
                    args = {"script": "scripts/report.py", "args": ["cat", "/dev/null"]}
                    refused = await s.call_tool("blocked/run_script", args)
                    assert refused.is_error
                    assert "already exists" in refused.content[0].text  # type: ignore[union-attr]
                    assert [
                        p for p in _work_dirs(tmp_path / "state") if p.name.startswith("ws-")
                    ] == []
                    ran = await s.call_tool("reporter/run_script", args)
                    assert _value(ran)["exit_status"] == 0

        anyio.run(main)
    finally:
        BLOCKED.unlink()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["alice", "mallory", "eve"]), st.integers(1, 400)),
        min_size=1,
        max_size=30,
    )
)
def test_the_store_never_evicts_another_callers_output(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, int]]
) -> None:
    """Any sequence of runs by three callers: no caller ever holds more than its cap,
    the node never more than its own, and an output disappears only by a commit of the
    caller that owns it (never another caller's); what a commit lists is readable."""
    from skilld.agentskills._kept import Spooled

    store = KeptOutputs(tmp_path_factory.mktemp("store"), caller_bytes=500, total_bytes=900)
    owned: dict[str, str] = {}
    for who, size in steps:
        caller = Caller.token(who)
        reservation = store.reserve(caller)
        if reservation.room < size:
            store.release(reservation)
            continue
        path = store.spool_path()
        path.write_bytes(b"x" * size)
        listed = store.commit(reservation, "s", [Spooled("f", "text/plain", path.name, size)])
        for entry in listed:
            owned[str(entry["uri"])] = who
            assert store.open(caller, str(entry["uri"])) is not None
        for uri, owner in list(owned.items()):
            if owner != who:
                assert store.open(Caller.token(owner), uri) is not None, "another's evicted"
            elif store.open(caller, uri) is None:
                del owned[uri]
        used = {name: store.used(Caller.token(name)) for name in ("alice", "mallory", "eve")}
        assert all(v <= 500 for v in used.values())
        assert sum(used.values()) <= 900


def _reader(served: dict[str, Any], who: str) -> Any:
    """An MCP session of ``who`` that takes events of any size (the SDK's client refuses
    events over 1 MiB; a client that reads large outputs raises that limit)."""

    @contextlib.asynccontextmanager
    async def session() -> AsyncIterator[ClientSession]:
        headers = {"Authorization": f"Bearer {token_of(who)}"}
        async with (
            httpx2.AsyncClient(timeout=120, headers=headers) as http,
            streamable_http_client(
                served["server"].url, http_client=http, max_sse_event_size=None
            ) as (read, write),
            ClientSession(read, write) as s,
        ):
            await s.initialize()
            yield s

    return session()


def test_one_callers_reads_of_large_outputs_take_turns(served: dict[str, Any]) -> None:
    """The attack: mallory keeps two outputs of 64 MiB (sparse: they cost her nothing)
    and reads them 16 times at once. Each read is several times its size in the server
    while it is encoded, and the event loop serializes slower than threads read: 12
    such reads took the server 2.2 GiB over what it held, 40 took 7 GiB. Now one
    caller's reads take turns (``max_reads_per_caller``, 2) from before they read until
    their response is written: every read is answered in full, the server's peak stays
    within 1.2 GiB of where it was, and alice's read meanwhile is answered."""
    pid = served["server"].proc.pid
    ran = _value(_run(served, "mallory", "sparse", "2", str(MAX_KEPT_FILE)))
    uris = [r["uri"] for r in ran["resources"]]
    mine = _value(_run(served, "alice", "secret", "alice-s3cret"))["resources"][0]["uri"]
    if os.geteuid() != 0:
        pytest.skip("resetting the peak RSS (clear_refs) needs to own the process")
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = _status(pid, "VmRSS")
    sizes: list[int] = []
    alices: list[str] = []

    async def mallory() -> None:
        async with _reader(served, "mallory") as s:

            async def one(uri: str) -> None:
                got = await s.read_resource(uri)  # type: ignore[arg-type]
                sizes.append(len(base64.b64decode(got.contents[0].blob)))  # type: ignore[union-attr]

            async with anyio.create_task_group() as tg:
                for i in range(16):
                    tg.start_soon(one, uris[i % 2])

    async def alice() -> None:
        await anyio.sleep(2)  # mallory's reads are under way
        async with _reader(served, "alice") as s:
            got = await s.read_resource(mine)  # type: ignore[arg-type]
            alices.append(str(got.contents[0].text))  # type: ignore[union-attr]

    async def both() -> None:
        with anyio.fail_after(300):
            async with anyio.create_task_group() as tg:
                tg.start_soon(mallory)
                tg.start_soon(alice)

    anyio.run(both)
    peak = _status(pid, "VmHWM")
    print(f"peak RSS {peak >> 20} MiB, {(peak - before) >> 20} MiB over {before >> 20} MiB")
    assert sizes == [MAX_KEPT_FILE] * 16
    assert alices[0].startswith("alice-s3cret")
    assert peak - before <= 1200 << 20, (peak - before) >> 20


def test_a_kept_output_too_large_for_a_run_is_refused_unread(served: dict[str, Any]) -> None:
    """mallory hands her own 64 MiB kept output (sparse) to a run as an input file, past
    the 32 MiB a run's files may take: refused, naming its size, before the server reads
    it (its peak RSS grows by far less than the file; it grew by the whole file, read
    only to be refused, before)."""
    ran = _value(_run(served, "mallory", "sparse", "1", str(MAX_KEPT_FILE)))
    uri = ran["resources"][0]["uri"]
    pid = served["server"].proc.pid
    _run(served, "mallory", "cat", "in.txt", files=[{"path": "in.txt", "text": "warm"}])
    if os.geteuid() != 0:
        pytest.skip("resetting the peak RSS (clear_refs) needs to own the process")
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = _status(pid, "VmRSS")
    result = _run(served, "mallory", "cat", "in.bin", files=[{"path": "in.bin", "uri": uri}])
    peak = _status(pid, "VmHWM")
    assert result.is_error
    assert peak - before < 16 << 20, (peak - before) >> 20
    assert f"is {MAX_KEPT_FILE} bytes, more than the" in result.content[0].text


async def _modern_read(
    http: httpx2.AsyncClient, url: str, who: str, uri: str, scheme: str = "Bearer"
) -> dict[str, Any]:
    """A 2026-07-28 (stateless) ``resources/read`` of ``uri`` as ``who``: its JSON-RPC answer."""
    read = await modern(
        http, url, "resources/read", {"uri": uri}, {}, token=token_of(who), scheme=scheme
    )
    return payload(read)


def _reads_at_once(url: str, who: str, uris: list[str], count: int) -> list[int]:
    """The sizes of the blobs ``count`` 2026-07-28 reads at once (of ``uris`` in turn)
    bring back to ``who``."""
    sizes: list[int] = []

    async def reads() -> None:
        async with httpx2.AsyncClient(timeout=120) as http:

            async def one(uri: str) -> None:
                answer = await _modern_read(http, url, who, uri)
                sizes.append(len(base64.b64decode(answer["result"]["contents"][0]["blob"])))

            with anyio.fail_after(300):
                async with anyio.create_task_group() as tg:
                    for i in range(count):
                        tg.start_soon(one, uris[i % len(uris)])

    anyio.run(reads)
    return sizes


def test_reads_take_turns_over_2026_07_28_too(served: dict[str, Any]) -> None:
    """The same attack in the stateless revision, where each request is its own HTTP
    exchange: mallory's 16 reads at once of her 64 MiB outputs are all answered in full
    and the server's peak stays within 1.2 GiB of before (0.6 GiB measured; without the
    turns, or with a turn ending when its answer exists, her answers pile up and are
    dropped past her share of response bytes)."""
    pid = served["server"].proc.pid
    ran = _value(_run(served, "mallory", "sparse", "2", str(MAX_KEPT_FILE)))
    uris = [r["uri"] for r in ran["resources"]]
    if os.geteuid() != 0:
        pytest.skip("resetting the peak RSS (clear_refs) needs to own the process")
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = _status(pid, "VmRSS")
    sizes = _reads_at_once(served["server"].url, "mallory", uris, 16)
    peak = _status(pid, "VmHWM")
    print(f"peak RSS {peak >> 20} MiB, {(peak - before) >> 20} MiB over {before >> 20} MiB")
    assert sizes == [MAX_KEPT_FILE] * 16
    assert peak - before <= 1200 << 20, (peak - before) >> 20


def test_memory_of_large_answers_goes_back_once_they_are_written(
    served: dict[str, Any],
) -> None:
    """A fresh server answers mallory's reads of her two 8 MiB kept outputs (three rounds
    of 24 at once), then gives the memory back: its RSS comes back within 16 MiB of
    before (2-3 MiB measured). Blocks of this size come from glibc's heap once one was
    freed (its mmap threshold rises to the largest block freed), where freed memory stays:
    without ``give_back_large_frees`` the server kept 21-71 MiB more (eleven runs)."""
    root = served["root"]
    server = ServeProcess(
        root / "bundle",
        root / "state-fresh",
        extra=["--token-file", str(root / "tokens"), "--kept-mib-per-caller", str(CALLER_MIB)],
    )
    try:
        fresh = {"server": server, "root": root}
        ran = _value(_run(fresh, "mallory", "sparse", "2", str(8 << 20)))
        uris = [r["uri"] for r in ran["resources"]]
        before = _status(server.proc.pid, "VmRSS")
        sizes = [n for _ in range(3) for n in _reads_at_once(server.url, "mallory", uris, 24)]
        time.sleep(0.5)
        after = _status(server.proc.pid, "VmRSS")
        print(f"RSS {before >> 20} MiB before, {after >> 20} MiB after")
        assert sizes == [8 << 20] * 72
        assert after - before <= 16 << 20, (before >> 20, after >> 20)
    finally:
        server.stop()


def test_reads_never_read_hold_only_their_callers_turns(served: dict[str, Any]) -> None:
    """mallory holds both her turns with two reads of 64 MiB she never reads (one with her
    scheme spelled 'bearer'). Her third read, spelled 'bearer' too, waits: the same caller,
    the same turns. alice's read is answered meanwhile. Once mallory drops her two
    connections her turns come back: her waiting read is answered, and so is a later one
    (a burst, then quiet, leaves nothing held)."""
    url = served["server"].url
    ran = _value(_run(served, "mallory", "sparse", "1", str(MAX_KEPT_FILE)))
    big = ran["resources"][0]["uri"]
    small = _value(_run(served, "mallory", "secret", "m"))["resources"][0]["uri"]
    mine = _value(_run(served, "alice", "secret", "alice-s3cret"))["resources"][0]["uri"]
    held = [
        stalled(url, "resources/read", {"uri": big}, token_of("mallory"), scheme)
        for scheme in ("Bearer", "bearer")
    ]
    got: dict[str, Any] = {}

    async def read(key: str, who: str, uri: str, scheme: str = "Bearer") -> None:
        async with httpx2.AsyncClient(timeout=120) as http:
            answer = await _modern_read(http, url, who, uri, scheme)
            got[key] = answer["result"]["contents"][0]

    async def attack() -> None:
        async with anyio.create_task_group() as tg:
            await anyio.sleep(2)  # the two stalled reads hold mallory's turns
            tg.start_soon(read, "waiting", "mallory", small, "bearer")
            with anyio.fail_after(60):
                await read("alice", "alice", mine)
            await anyio.sleep(2)
            assert "waiting" not in got  # mallory's third read still waits for a turn
            for sock in held:
                sock.close()
            with anyio.fail_after(60):
                while "waiting" not in got:
                    await anyio.sleep(0.1)
        with anyio.fail_after(60):
            await read("later", "mallory", small)

    anyio.run(attack)
    assert got["alice"]["text"].startswith("alice-s3cret")
    assert got["waiting"]["text"].startswith("m\n")
    assert got["later"]["text"].startswith("m\n")
