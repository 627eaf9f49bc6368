"""Who-may-call-what latency: skilld's compiled caller rules beside Cedar (``cedarpy``).

Run: python bench/bench_callers.py [--iterations N] [--cedar-iterations N] [--rounds N]
[--no-cedar] (Cedar is an optional install: ``pip install cedarpy``)

The same 1,000 rules (250 each naming a token, an OAuth subject, a group and a scope, each
allowing one whole skill and one tool pattern of another; plus 10 deny rules) over 100
skills of 5 tools, asked the question the MCP layer asks: may this caller call this tool?

- ``CallerPolicy.may`` (``skilld.permissions``): a principal seen before (its rules
  gathered and kept), and a principal new to the policy (gathered on that question);
- Cedar, through its Python binding: the policy set and the resource graph (tools in
  their skills) parsed once, the caller's claims (issuer, groups, scopes) passed as the
  request's context, since a token's claims change per request;
- the whole ``tools/list`` of one caller (500 tools filtered), both ways.

Iterations are split into rounds going over every case in turn; each case reports its
least disturbed round (lowest p50). Prints p50 and p99 in microseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from skilld.permissions import CallerPolicy, Target
from skilld.policy import compile_documents, load_yaml
from skilld.types import Caller

RULES_PER_KIND = 250
SKILLS = 100
TOOLS_PER_SKILL = 5
IDP = "https://idp.example.com"


def rules_yaml() -> str:
    """The caller rules: 250 per kind of principal, 10 deny rules."""
    out = ["rules:"]
    kinds = (
        lambda i: f"{{token: t{i}}}",
        lambda i: f"{{issuer: '{IDP}', subject: u{i}}}",
        lambda i: f"{{issuer: '{IDP}', group: g{i}}}",
        lambda i: f"{{scope: 's{i}'}}",
    )
    for k, who in enumerate(kinds):
        for i in range(RULES_PER_KIND):
            n = k * RULES_PER_KIND + i
            out.append(
                f"  - id: r{n}\n    who: [{who(i)}]\n    skills: [skill{n % SKILLS}]\n"
                f"    tools: ['skill{(n + 1) % SKILLS}/m*']"
            )
    for i in range(10):
        out.append(
            f"  - id: deny{i}\n    effect: deny\n    who: [{{token: t{i}}}]\n"
            f"    tools: [skill{(i + 50) % SKILLS}/m0]"
        )
    return "\n".join(out) + "\n"


def cedar_policies() -> str:
    """The same rules in Cedar: principals by type and id, claims from the context."""
    out = []
    actions = 'action in [Action::"list", Action::"call"]'
    for k in range(4):
        for i in range(RULES_PER_KIND):
            n = k * RULES_PER_KIND + i
            if k == 0:
                who, cond = f'principal == Token::"t{i}"', "true"
            elif k == 1:
                who = f'principal == User::"{IDP}#u{i}"'
                cond = "true"
            elif k == 2:
                who = "principal is User"
                cond = f'context.issuer == "{IDP}" && context.groups.contains("g{i}")'
            else:
                who, cond = "principal", f'context.scopes.contains("s{i}")'
            skill, other = n % SKILLS, (n + 1) % SKILLS
            out.append(
                f'permit({who}, {actions}, resource in Skill::"skill{skill}") when {{ {cond} }};'
            )
            out.append(
                f"permit({who}, {actions}, resource) when "
                f'{{ {cond} && resource.name like "skill{other}/m*" }};'
            )
    for i in range(10):
        out.append(
            f'forbid(principal == Token::"t{i}", {actions}, '
            f'resource == Tool::"skill{(i + 50) % SKILLS}/m0");'
        )
    return "\n".join(out)


def cedar_entities() -> list[dict[str, Any]]:
    """Every tool, in its skill (the resource graph, parsed once)."""
    out: list[dict[str, Any]] = []
    for s in range(SKILLS):
        out.append({"uid": {"type": "Skill", "id": f"skill{s}"}, "attrs": {}, "parents": []})
        for m in range(TOOLS_PER_SKILL):
            out.append(
                {
                    "uid": {"type": "Tool", "id": f"skill{s}/m{m}"},
                    "attrs": {"name": f"skill{s}/m{m}"},
                    "parents": [{"type": "Skill", "id": f"skill{s}"}],
                }
            )
    return out


def callers(pool: int) -> list[Caller]:
    """Distinct callers of every kind, each named by at least one rule."""
    out: list[Caller] = []
    for i in range(pool):
        j = i % RULES_PER_KIND
        kind = i % 4
        if kind == 0:
            out.append(Caller.token(f"t{j}" if i < RULES_PER_KIND * 4 else f"t{j}-{i}"))
        elif kind == 1:
            out.append(Caller.oauth(IDP, f"u{j}" if i < RULES_PER_KIND * 4 else f"u{j}-{i}"))
        elif kind == 2:
            out.append(Caller.oauth(IDP, f"v{i}", groups=frozenset({f"g{j}", "staff"})))
        else:
            out.append(Caller.token(f"x{i}", scopes=frozenset({f"s{j}", "openid"})))
    return out


def cedar_request(caller: Caller, action: str, tool: str) -> dict[str, Any]:
    """A Cedar request for ``caller`` calling ``tool``."""
    if caller.kind == "token":
        principal = f'Token::"{caller.name}"'
    else:
        principal = f'User::"{caller.issuer}#{caller.name}"'
    return {
        "principal": principal,
        "action": f'Action::"{action}"',
        "resource": f'Tool::"{tool}"',
        "context": {
            "issuer": caller.issuer,
            "groups": sorted(caller.groups),
            "scopes": sorted(caller.scopes),
        },
    }


def timed(fn: Callable[[int], object], n: int) -> list[float]:
    """``n`` calls of ``fn(i)``, each timed, in microseconds."""
    out = []
    clock = time.perf_counter_ns
    for i in range(n):
        t0 = clock()
        fn(i)
        out.append((clock() - t0) / 1000)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Run every case and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--cedar-iterations", type=int, default=300, help="per case (Cedar takes milliseconds)"
    )
    ap.add_argument("--no-cedar", action="store_true", help="time skilld's rules only")
    ap.add_argument(
        "--quick", action="store_true", help="a few iterations: that it runs (CI; no targets)"
    )
    args = ap.parse_args(argv)
    if args.quick:
        # Cedar is an optional comparison (cedarpy is not a dependency): skilld's rules only.
        args.iterations, args.rounds, args.no_cedar = 400, 1, True

    t0 = time.perf_counter()
    doc = load_yaml(rules_yaml(), "callers/bench.yaml")
    tables = compile_documents({}, callers={"bench.yaml": ("callers/bench.yaml", doc)}).tables
    compile_ms = (time.perf_counter() - t0) * 1000
    tools = [f"skill{s}/m{m}" for s in range(SKILLS) for m in range(TOOLS_PER_SKILL)]
    targets = [Target("tool", t, t.split("/")[0]) for t in tools]
    warm = callers(RULES_PER_KIND * 4)
    policy = CallerPolicy.from_tables(tables)
    for c in warm:  # every principal seen once: the grants are kept
        policy.may(c, "call", targets[0])
    # A hit: a tool of the skill that caller i's rule (n = kind * 250 + j) names, n % 100.
    hits = [
        (c, Target("tool", f"skill{s}/m{i % TOOLS_PER_SKILL}", f"skill{s}"))
        for i, c in enumerate(warm)
        for s in [((i % 4) * RULES_PER_KIND + i % RULES_PER_KIND) % SKILLS]
    ]
    misses = [(c, targets[(i * 7 + 250) % len(targets)]) for i, c in enumerate(warm)]
    cold = callers(args.iterations * args.rounds + RULES_PER_KIND * 4)[RULES_PER_KIND * 4 :]
    cold_policy = CallerPolicy.from_tables(tables)

    def ask(pairs: list[tuple[Caller, Target]]) -> Callable[[int], object]:
        return lambda i: policy.may(pairs[i % len(pairs)][0], "call", pairs[i % len(pairs)][1])

    offset = [0]

    def ask_cold(i: int) -> object:
        offset[0] += 1
        return cold_policy.may(cold[offset[0] % len(cold)], "call", targets[i % len(targets)])

    def list_tools(i: int) -> object:
        c = warm[i % len(warm)]
        return [t for t in targets if policy.may(c, "list", t).allowed]

    assert all(policy.may(c, "call", t).allowed for c, t in hits[:8]), "hits must be allowed"
    cases: dict[str, tuple[Callable[[int], object], int]] = {
        "skilld: call, known principal, allowed": (ask(hits), args.iterations),
        "skilld: call, known principal, denied": (ask(misses), args.iterations),
        "skilld: call, new principal": (ask_cold, args.iterations),
        "skilld: tools/list of 500 tools": (list_tools, max(20, args.iterations // 200)),
    }
    cedar_ms = 0.0
    if not args.no_cedar:
        try:
            import cedarpy
        except ImportError:
            sys.exit("cedarpy is not installed: pip install cedarpy, or pass --no-cedar")
        t0 = time.perf_counter()
        policies = cedarpy.PolicySet.from_str(cedar_policies())
        entities = cedarpy.Entities.from_json_str(json.dumps(cedar_entities()))
        cedar_ms = (time.perf_counter() - t0) * 1000

        def cedar(pairs: list[tuple[Caller, Target]]) -> Callable[[int], object]:
            reqs = [cedar_request(c, "call", t.name) for c, t in pairs]
            return lambda i: cedarpy.is_authorized(reqs[i % len(reqs)], policies, entities)

        def cedar_list(i: int) -> object:
            c = warm[i % len(warm)]
            reqs = [cedar_request(c, "list", t) for t in tools]
            return cedarpy.is_authorized_batch(reqs, policies, entities)

        for c, t in hits[:8]:
            answer = cedarpy.is_authorized(cedar_request(c, "call", t.name), policies, entities)
            assert answer.decision == cedarpy.Decision.Allow, (c, t, answer)
        cases["cedar: call, allowed"] = (cedar(hits), args.cedar_iterations)
        cases["cedar: call, denied"] = (cedar(misses), args.cedar_iterations)
        cases["cedar: tools/list of 500 tools (batch)"] = (cedar_list, 3)
    best: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, (fn, n) in cases.items():
            sample = timed(fn, n)
            if name not in best or statistics.median(sample) < statistics.median(best[name]):
                best[name] = sample
    print(
        f"# Python {platform.python_version()} {platform.machine()}; "
        f"{RULES_PER_KIND * 4 + 10} rules, {len(tools)} tools; compile {compile_ms:.0f} ms"
        + (f"; cedar parse {cedar_ms:.0f} ms" if cedar_ms else "")
        + f"; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print("| case | p50 µs | p99 µs |")
    print("|---|---|---|")
    for name, sample in best.items():
        sample.sort()
        p99 = sample[min(len(sample) - 1, int(len(sample) * 0.99))]
        print(f"| {name} | {statistics.median(sample):.2f} | {p99:.2f} |")


if __name__ == "__main__":
    main()
