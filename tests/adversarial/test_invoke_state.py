"""invoke, kv and MCP client requests from the real prober under real compiled tables, and the
audit trail of such calls through the registry."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from skilld.audit import JsonLinesSink
from skilld.permissions import SkillPermissions
from skilld.policy import Tables
from skilld.registry import Call, NullChannel, Registry, SkillEntry
from skilld.sandbox import CallContext, Component
from skilld.state import SqliteState
from skilld.types import KeyValueStore
from support.adversarial import Outcome, Probe, assert_outcome, case_ids, compile_dir

DENY = "default-deny"

INVOKE = {
    "inv-a": "invoke: {calls: [inv-b, inv-c, inv-d], called_by: [inv-b], max_depth: 3}\n",
    "inv-b": "invoke: {calls: [inv-a, inv-c], called_by: [inv-a], max_depth: 1}\n",
    "inv-c": "invoke: {calls: [inv-d], called_by: [inv-a, inv-b], max_depth: 8}\n",
    "inv-d": "invoke: {calls: [], called_by: [], max_depth: 8}\n",
    "ch1": "invoke: {calls: [ch2], called_by: [], max_depth: 64}\n",
    **{
        f"ch{i}": f"invoke: {{calls: [ch{i + 1}], called_by: [ch{i - 1}], max_depth: 64}}\n"
        for i in range(2, 6)
    },
    "ch6": "invoke: {calls: [], called_by: [ch5], max_depth: 64}\n",
    # ch4 may also call dp5, whose own max_depth (4) stops it calling on at depth 5
    "dp5": "invoke: {calls: [dp6], called_by: [ch4], max_depth: 4}\n",
    "dp6": "invoke: {calls: [], called_by: [dp5]}\n",
}
INVOKE["ch4"] = "invoke: {calls: [ch5, dp5], called_by: [ch3], max_depth: 64}\n"


@pytest.fixture(scope="module")
def invoke_tables(tmp_path_factory: pytest.TempPathFactory) -> Tables:
    """Invoke graphs: a<->b (a cycle), b with max_depth 1, d that nobody may call, a chain."""
    return compile_dir(tmp_path_factory.mktemp("policies"), INVOKE)


def register(registry: Registry, component: Component, tables: Tables, skill_id: str) -> None:
    """Register the prober under ``skill_id`` with that skill's compiled checker."""
    checker = SkillPermissions.from_tables(tables, skill_id)
    spec = component.describe(CallContext(skill_id, checker.limits, NullChannel()))
    registry.add(
        SkillEntry(
            spec=dataclasses.replace(spec, id=skill_id),
            component=component,
            limits=checker.limits,
            checker=checker,
            exposure=checker.exposure,
        )
    )


@pytest.fixture(scope="module")
def invoke_registry(prober: Component, invoke_tables: Tables) -> Registry:
    """A registry holding the prober under every id of the invoke graph."""
    registry = Registry()
    for skill_id in INVOKE:
        register(registry, prober, invoke_tables, skill_id)
    registry.mark_ready()
    return registry


def chain(*hops: str) -> dict[str, Any]:
    """Arguments for invoke_call that make each skill of ``hops`` call the next, then read env."""
    args: dict[str, Any] = {"name": "HOME"}
    method = "env_get"
    for hop in reversed(hops[1:]):
        args = {"skill_id": hop, "method": method, "args": args}
        method = "invoke_call"
    return args


def innermost(report: dict[str, Any]) -> dict[str, Any]:
    """The deepest report of nested invoke_call results."""
    while "ok" in report and isinstance(report["ok"], dict):
        report = report["ok"]
    return report


# (id, chain of skills, expected innermost report)
INVOKE_CASES: list[tuple[str, tuple[str, ...], tuple[Any, ...]]] = [
    ("both-agree", ("inv-a", "inv-b"), ("deny", DENY, "add 'HOME' to env")),
    ("both-agree-other", ("inv-a", "inv-c"), ("deny", DENY, "add 'HOME' to env")),
    ("self-call", ("inv-a", "inv-a"), ("deny", "invoke.cycle", "cycle inv-a → inv-a")),
    (
        "two-cycle",
        ("inv-a", "inv-b", "inv-a"),
        ("deny", "invoke.cycle", "cycle inv-a → inv-b → inv-a"),
    ),
    ("callee-refuses", ("inv-a", "inv-d"), ("deny", DENY, "'inv-d' does not list 'inv-a'")),
    ("not-in-calls", ("inv-a", "ch1"), ("deny", DENY, "add 'ch1' to invoke.calls")),
    ("unknown-skill", ("inv-a", "inv-zz"), ("deny", DENY, "add 'inv-zz' to invoke.calls")),
    (
        "caller-max-depth",
        ("inv-a", "inv-b", "inv-c"),
        ("deny", "inv-b.invoke", "depth 2 exceeds max_depth 1"),
    ),
    ("no-invoke-grant", ("inv-d", "inv-a"), ("deny", DENY, "add 'inv-a' to invoke.calls")),
    (
        "chain-of-four",
        ("ch1", "ch2", "ch3", "ch4", "ch5"),
        ("deny", DENY, "add 'HOME' to env"),
    ),
    # max_depth 64 is the limit: no smaller host cap cuts the chain at depth 5
    (
        "chain-of-five-within-max-depth",
        ("ch1", "ch2", "ch3", "ch4", "ch5", "ch6"),
        ("deny", DENY, "add 'HOME' to env"),
    ),
    (
        "chain-past-a-hops-max-depth",
        ("ch1", "ch2", "ch3", "ch4", "dp5", "dp6"),
        ("deny", "dp5.invoke", "depth 5 exceeds max_depth 4"),
    ),
]


@pytest.mark.parametrize(("name", "hops", "expected"), INVOKE_CASES, ids=case_ids(INVOKE_CASES))
def test_invoke_case(
    invoke_registry: Registry, name: str, hops: tuple[str, ...], expected: tuple[Any, ...]
) -> None:
    """Each call graph trick ends in exactly the outcome in the table, at the deepest hop."""
    out = invoke_registry.call_method(Call(hops[0], "invoke_call", chain(*hops)))
    report = innermost(out.value)
    assert_outcome(Outcome(report), expected)


def test_invoke_without_orchestrator(prober: Component, invoke_tables: Tables) -> None:
    """Outside a registry there is no orchestrator: invoke is refused, not attempted."""
    out = Probe(prober, invoke_tables, "inv-a")("invoke_call", **chain("inv-a", "inv-b"))
    assert_outcome(out, ("deny", DENY, "no orchestrator"))


def test_policy_depth_denial_is_audited(
    prober: Component, invoke_tables: Tables, tmp_path: Path
) -> None:
    """A call past the caller's max_depth lands in the audit as a denial with the rule id."""
    log = tmp_path / "audit.jsonl"
    with JsonLinesSink(log) as sink:
        registry = Registry(audit=sink)
        for skill_id in ("ch4", "dp5", "dp6"):
            register(registry, prober, invoke_tables, skill_id)
        registry.mark_ready()
        registry.call_method(Call("ch4", "invoke_call", chain("ch4", "dp5", "dp6"), depth=3))
    records = {r["skill"]: r for r in map(json.loads, log.read_text().splitlines())}
    assert [(d["allowed"], d["rule"], d["reason"]) for d in records["dp5"]["decisions"]] == [
        (False, "dp5.invoke", "depth 5 exceeds max_depth 4")
    ]


class NoOrchestrator:
    """An invoker that fails the test if the host ever calls it."""

    def __call__(self, callee: str, method: str, args: str, depth: int) -> str:
        raise AssertionError(f"invoked {callee} at depth {depth}")


def test_host_ceiling_is_a_recorded_denial(prober: Component, invoke_tables: Tables) -> None:
    """Past depth 64 (the largest max_depth) the host refuses and records the decision itself."""
    checker = SkillPermissions.from_tables(invoke_tables, "ch1")
    ctx = CallContext(
        "ch1", checker.limits, NullChannel(), checker=checker, invoker=NoOrchestrator(), depth=64
    )
    args = json.dumps({"skill_id": "ch2", "method": "env_get", "args": {"name": "HOME"}})
    report = prober.call("invoke_call", args, ctx).value
    assert_outcome(
        Outcome(report), ("deny", "invoke.max-depth", "depth 65 exceeds the host's ceiling of 64")
    )
    assert [(d.allowed, d.rule) for d in ctx.decisions] == [(False, "invoke.max-depth")]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[KeyValueStore]:
    """A real SQLite namespace for the prober."""
    state = SqliteState(tmp_path / "state.db")
    yield state.store("prober")
    state.close()


# (id, policy, whether the call gets a store, method, args, expected)
KV: list[tuple[str, str, bool, str, dict[str, Any], tuple[Any, ...]]] = [
    ("granted-set", "kv: {}\n", True, "kv_set", {"key": "k", "value": "v"}, ("ok", None)),
    ("granted-get-missing", "kv: {}\n", True, "kv_get", {"key": "nope"}, ("ok", None)),
    (
        "no-grant-with-store",
        "env: [X]\n",
        True,
        "kv_set",
        {"key": "k", "value": "v"},
        ("deny", DENY, "no kv grant"),
    ),
    ("no-grant-get", "env: [X]\n", True, "kv_get", {"key": "k"}, ("deny", DENY, "no kv grant")),
    (
        "no-grant-no-store",
        "env: [X]\n",
        False,
        "kv_set",
        {"key": "k", "value": "v"},
        ("deny", DENY, "no kv grant"),
    ),
    (
        "grant-without-store",
        "kv: {}\n",
        False,
        "kv_get",
        {"key": "k"},
        ("deny", "kv", "no key-value state"),
    ),
    (
        "empty-key",
        "kv: {}\n",
        True,
        "kv_set",
        {"key": "", "value": "v"},
        ("error", "invalid-argument", "keys must be"),
    ),
]


@pytest.mark.parametrize(
    ("name", "policy", "with_store", "method", "args", "expected"), KV, ids=case_ids(KV)
)
def test_kv_case(
    prober: Component,
    store: KeyValueStore,
    tmp_path: Path,
    name: str,
    policy: str,
    with_store: bool,
    method: str,
    args: dict[str, Any],
    expected: tuple[Any, ...],
) -> None:
    """kv needs the grant in the tables, not only a store handed to the call."""
    tables = compile_dir(tmp_path / "policies", {"prober": policy})
    probe = Probe(prober, tables, kv=store if with_store else None)
    assert_outcome(probe(method, **args), expected)
    if expected[0] != "ok":
        assert store.get("k") is None


class Client:
    """An MCP client channel that answers sampling and elicitation and remembers the asks."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Progress is always allowed; nothing to keep."""

    def log(self, level: str, data: Any) -> None:
        """Logs are always allowed; nothing to keep."""

    def sample(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """A canned model answer."""
        self.asked.append("sample")
        return {"role": "assistant", "content": {"type": "text", "text": "hi"}}

    def elicit(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """A canned user answer."""
        self.asked.append("elicit")
        return {"action": "accept", "content": {"ok": True}}

    def cancelled(self) -> bool:
        """Never cancelled."""
        return False


# (id, mcp.client list or None, kind, expected)
MCP: list[tuple[str, str | None, str, tuple[Any, ...]]] = [
    ("sample-granted", "[sample]", "sample", ("ok", lambda v: v["content"]["text"] == "hi")),
    ("elicit-granted", "[elicit]", "elicit", ("ok", {"action": "accept", "content": {"ok": True}})),
    ("elicit-not-granted", "[sample]", "elicit", ("deny", DENY, "add 'elicit' to mcp.client")),
    ("sample-not-granted", "[elicit]", "sample", ("deny", DENY, "add 'sample' to mcp.client")),
    ("sample-no-client-list", None, "sample", ("deny", DENY, "add 'sample' to mcp.client")),
    ("elicit-no-client-list", None, "elicit", ("deny", DENY, "add 'elicit' to mcp.client")),
]


@pytest.mark.parametrize(("name", "client", "kind", "expected"), MCP, ids=case_ids(MCP))
def test_mcp_client_case(
    prober_mcp: Component,
    tmp_path: Path,
    name: str,
    client: str | None,
    kind: str,
    expected: tuple[Any, ...],
) -> None:
    """Sampling and elicitation reach the client only when mcp.client lists them."""
    policy = f"mcp: {{client: {client}}}\n" if client else "env: [X]\n"
    channel = Client()
    probe = Probe(
        prober_mcp, compile_dir(tmp_path / "policies", {"prober": policy}), channel=channel
    )
    assert_outcome(probe("mcp_ask", kind=kind, params={"messages": []}), expected)
    assert channel.asked == ([kind] if expected[0] == "ok" else [])


def test_audit_has_one_line_per_call_with_rule_ids(
    prober: Component, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls through the registry write one JSON line each, holding every decision and its rule."""
    tmp_path = tmp_path.resolve()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("a")
    policy = f"fs:\n  - id: data\n    path: {tmp_path}/data\nenv: [SKILLD_AUDIT_OK]\n"
    tables = compile_dir(tmp_path / "policies", {"prober": policy})
    monkeypatch.setenv("SKILLD_AUDIT_OK", "1")
    log = tmp_path / "audit.jsonl"
    with JsonLinesSink(log) as sink:
        registry = Registry(audit=sink)
        register(registry, prober, tables, "prober")
        registry.call_method(Call("prober", "fs_read", {"path": f"{tmp_path}/data/a.txt"}))
        registry.call_method(Call("prober", "fs_read", {"path": f"{tmp_path}/data/../secret"}))
        registry.call_method(Call("prober", "env_get", {"name": "SKILLD_AUDIT_OK"}))
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["method"] for r in lines] == ["fs_read", "fs_read", "env_get"]
    assert [[(d["allowed"], d["rule"]) for d in r["decisions"]] for r in lines] == [
        [(True, "prober.data")],
        [(False, "default-deny")],
        [(True, "prober.env[0]")],
    ]
    assert lines[1]["decisions"][0]["target"] == f"{tmp_path}/secret"
    assert all(r["skill"] == "prober" and r["outcome"] == "ok" for r in lines)
