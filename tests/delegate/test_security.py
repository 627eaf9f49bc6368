"""delegate's security suite: hostile programs refused by the validator or stopped by the sandbox.

Four groups, over the demo kits (``notes``: add/get/titles/echo; ``text``: echo only):

- REFUSED: the bypass classes of the issue and the RestrictedPython advisories written as
  programs; the validator refuses each with its rule, line and column, and no guest runs;
- STOPPED: programs the language allows that would run away (time, memory, tool calls,
  output); the sandbox or the runner stops each, and the host serves the next call;
- UNVALIDATED: programs sent straight to a kit's runner entry, skipping the validator, as
  if it had a hole: the runner's namespace, the kit gate and the policy still hold;
- INJECTION: intent text and template captures that try to become code stay data.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skilld.delegate import DelegateService, validate
from skilld.policy import RUNNER_METHOD
from skilld.registry import Call, Registry
from support.delegate import AuditFile

NOTES = ("add", "get", "titles", "echo")

# (id, program, rule of the first problem)
REFUSED: list[tuple[str, str, str]] = [
    # attribute walks to the interpreter
    ("self-import", "x = print.__self__.__import__('os')", "delegate.underscore"),
    ("class-walk", "x = ().__class__.__base__.__subclasses__()", "delegate.underscore"),
    ("globals-of-tool", "x = echo.__globals__", "delegate.underscore"),
    ("builtins-name", "x = __builtins__", "delegate.underscore"),
    ("dunder-import-name", "__import__('os')", "delegate.underscore"),
    ("private-attr", "x = titles()._private", "delegate.underscore"),
    ("dict-attr", "x = echo.__dict__", "delegate.underscore"),
    ("code-attr", "x = echo.__code__", "delegate.underscore"),
    ("closure-attr", "x = echo.__closure__", "delegate.underscore"),
    ("mro", "x = str.__mro__", "delegate.underscore"),
    ("underscore-name", "_ = 1", "delegate.underscore"),
    # generator and frame attributes (CVE-2023-37271: a generator's frame walked up the stack)
    ("cve-2023-37271", "g = (x for x in titles())\nf = g.gi_frame.f_back.f_back", "delegate.frame"),
    ("gi-code", "g = (x for x in titles())\nc = g.gi_code", "delegate.frame"),
    ("cr-frame", "c = echo('x').cr_frame", "delegate.frame"),
    ("f-globals", "x = titles().f_globals", "delegate.frame"),
    ("tb-frame", "x = titles().tb_frame", "delegate.frame"),
    ("ag-frame", "x = titles().ag_frame", "delegate.frame"),
    # str.format field paths (CVE-2023-41039)
    ("cve-2023-41039", "result = '{0.__class__.__base__}'.format(1)", "delegate.format"),
    ("format-map", "result = '{a}'.format_map({'a': 1})", "delegate.format"),
    ("format-index", "result = '{0[0]}'.format(titles())", "delegate.format"),
    # AttributeError.obj and the string module (CVE-2024-47532)
    (
        "cve-2024-47532",
        "try:\n    titles().nope\nexcept AttributeError as e:\n    x = e.obj",
        "delegate.try",
    ),
    ("string-module", "import string\nf = string.Formatter()", "delegate.import"),
    ("from-string", "from string import Formatter", "delegate.import"),
    # try/except* type confusion (CVE-2025-22153)
    (
        "cve-2025-22153",
        "try:\n    x = 1\nexcept* ValueError:\n    x = 2",
        "delegate.try",
    ),
    # strings holding dunders (getattr-by-name, format paths)
    ("dunder-string", "x = '__class__'", "delegate.dunder"),
    ("dunder-fstring", "x = f'{1}__class__'", "delegate.dunder"),
    ("dunder-bytes", "x = b'__globals__'", "delegate.dunder"),
    # statements outside the language
    ("import", "import os", "delegate.import"),
    ("import-from", "from os import system", "delegate.import"),
    ("def", "def f():\n    return 1", "delegate.definition"),
    ("async-def", "async def f():\n    return 1", "delegate.definition"),
    ("class", "class A:\n    pass", "delegate.definition"),
    ("while", "while True:\n    pass", "delegate.while"),
    ("try", "try:\n    x = 1\nexcept Exception:\n    pass", "delegate.try"),
    ("with", "with titles() as t:\n    pass", "delegate.with"),
    ("raise", "raise ValueError('x')", "delegate.raise"),
    ("global", "global x", "delegate.scope"),
    ("del", "x = 1\ndel x", "delegate.del"),
    ("walrus", "result = (y := 1)", "delegate.walrus"),
    ("assert", "assert titles()", "delegate.assert"),
    ("lambda-value", "f = lambda: 1", "delegate.lambda"),
    ("lambda-arg", "result = list(map(lambda t: t, titles()))", "delegate.lambda"),
    ("lambda-default", "result = sorted(titles(), key=lambda t, u=1: t)", "delegate.lambda"),
    ("yield", "x = (yield)", "delegate.generator"),
    ("match", "match 1:\n    case 1:\n        pass", "delegate.syntax"),
    ("for-over-literal", "for x in [1, 2]:\n    pass", "delegate.for"),
    ("for-else", "for x in titles():\n    pass\nelse:\n    pass", "delegate.for"),
    ("ellipsis", "x = ...", "delegate.syntax"),
    # calls outside the kit and the builtins
    ("tool-outside-kit", "delete('todo')", "delegate.call"),
    ("eval", "eval('1')", "delegate.call"),
    ("exec", "exec('x = 1')", "delegate.call"),
    ("open", "open('/etc/passwd')", "delegate.call"),
    ("getattr", "getattr(titles, 'x')", "delegate.call"),
    ("type-call", "t = type(1)", "delegate.call"),
    ("vars-call", "v = vars()", "delegate.call"),
    ("call-a-local", "f = echo\nf('x')", "delegate.call"),
    ("call-a-call", "titles()()", "delegate.call"),
    ("getattr-value", "f = getattr", "delegate.builtin"),
    ("bad-method", "x = echo('a').encode()", "delegate.method"),
    ("attribute-read", "x = titles().real", "delegate.attribute"),
    ("attribute-store", "x = {}\nx.y = 1", "delegate.assign"),
    ("shadow-tool", "echo = 1", "delegate.name"),
    ("shadow-builtin", "len = 1", "delegate.name"),
    # size and depth
    ("deep-nesting", "result = " + "[" * 60 + "1" + "]" * 60, "delegate.depth"),
    ("deep-unary", "result = " + "-" * 3000 + "1", "delegate.depth"),
    ("long-chain", "result = " + " + ".join(["1"] * 3000), "delegate.depth"),
    ("huge-program", "x = 1\n" * 5000, "delegate.size"),
    ("nul", "x = 1\x00", "delegate.syntax"),
    ("syntax-error", "result = (", "delegate.syntax"),
]


@pytest.mark.parametrize(("program", "rule"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_refused_with_rule_and_place(
    service: DelegateService,
    kits_registry: tuple[Registry, AuditFile],
    program: str,
    rule: str,
) -> None:
    """The validator refuses the program with its rule, line and column; no guest runs."""
    sink = kits_registry[1]
    before = len(sink.records)
    result = service.run_program(program, "notes")
    assert result["success"] is False
    error = result["error"]
    assert error["code"] == "invalid-program"
    rules = [p["rule"] for p in error["problems"]]
    assert rule in rules, error
    first = error["problems"][0]
    assert first["line"] >= 1 and first["column"] >= 0
    assert f"program:{first['line']}:{first['column']}" in error["message"]
    assert result["trace"] == [] and result["execution_time_ms"] == 0.0
    assert len(sink.records) == before  # nothing ran, nothing to audit


# (id, program, kit, error code): the language allows these; the sandbox stops them.
STOPPED: list[tuple[str, str, str, str]] = [
    ("deadline-loop", "for i in range(10 ** 12):\n    x = i", "text", "deadline"),
    (
        "deadline-nested",
        "for i in range(10 ** 6):\n    for j in range(10 ** 6):\n        x = j",
        "text",
        "deadline",
    ),
    ("memory-list", "x = [0] * (10 ** 9)", "text", "limit-exceeded"),
    ("memory-string", "x = 'a' * (2 ** 30)", "text", "limit-exceeded"),
    ("bignum-pow", "x = 10 ** (10 ** 9)", "text", "deadline"),
    ("memory-grow", "x = ['a' * 10 ** 6 for i in range(10 ** 4)]", "text", "limit-exceeded"),
    ("call-cap", "for i in range(100):\n    echo('x')", "text", "limit-exceeded"),
    (
        "call-cap-comprehension",
        "result = [echo(str(i)) for i in range(100)]",
        "text",
        "limit-exceeded",
    ),
    ("huge-result", "result = 'a' * (10 ** 6)", "text", "limit-exceeded"),
    ("huge-print", "for i in range(10 ** 5):\n    print('aaaaaaaaaa')", "text", "limit-exceeded"),
    ("not-json", "result = {1, 2}", "text", "invalid-argument"),
    ("tool-args-not-json", "echo({1})", "text", "invalid-argument"),
    ("tool-refuses", "result = get('no such note')", "notes", "not-found"),
    ("program-bug", "result = 1 / 0", "text", "program-error"),
]


@pytest.mark.parametrize(
    ("program", "kit", "code"), [s[1:] for s in STOPPED], ids=[s[0] for s in STOPPED]
)
def test_stopped_by_the_sandbox(
    service: DelegateService, program: str, kit: str, code: str
) -> None:
    """A valid but runaway program is stopped with a clear code; the next call works."""
    assert validate(program, service.kit(kit).tools) == []
    result = service.run_program(program, kit)
    assert result["success"] is False
    assert result["error"]["code"] == code, result["error"]
    assert len(result["trace"]) <= service.kit(kit).max_calls
    after = service.run_program("result = echo('still here')", "text")
    assert after["success"] and after["output"] == "still here"


def _unvalidated(registry: Registry, service: DelegateService, kit: str, program: str) -> Any:
    """Run ``program`` in ``kit``'s runner entry as the service would, skipping the validator."""
    found = service.kit(kit)
    out = registry.call_method(
        Call(
            found.runner,
            RUNNER_METHOD,
            {
                "program": program,
                "tools": {
                    t.name: {"skill": t.skill, "method": t.method, "params": list(t.params)}
                    for t in found.tools.values()
                },
                "params": {},
                "max_calls": found.max_calls,
                "max_output": found.max_output,
            },
            depth=1,
            chain=("delegate",),
        )
    )
    return out.value


# (id, program, kit, substring of the error): past the validator, the second wall.
UNVALIDATED: list[tuple[str, str, str, str]] = [
    ("import", "import os\nresult = os.listdir('/')", "text", "ImportError"),
    ("dunder-import", "result = __import__('os').listdir('/')", "text", "NameError"),
    ("open", "result = open('/etc/passwd').read()", "text", "NameError"),
    ("eval", "result = eval('1')", "text", "NameError"),
    (
        "file-io-by-subclass",
        "fio = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'FileIO'][0]\n"
        "result = fio('/etc/passwd').read().decode()",
        "text",
        "",
    ),
    (
        "invoke-off-kit",
        "result = echo.__globals__['invoke'].call('notes', 'delete', {'title': 'todo'})",
        "text",
        "not a tool of kit 'text'",
    ),
    (
        "invoke-hidden-method",
        "result = get.__globals__['invoke'].call('notes', 'delete', {'title': 'todo'})",
        "notes",
        "not a tool of kit 'notes'",
    ),
    (
        "invoke-past-the-cap",
        "inv = echo.__globals__['invoke']\n"
        "for i in range(50):\n    inv.call('echo', 'echo', {'text': 'x'})",
        "text",
        "more than 8 tool calls",
    ),
    (
        "raw-binding-bad-json",
        "b = echo.__globals__['invoke'].call.__globals__['_binding']('invoke')\n"
        "result = b.call('echo', 'echo', '{not json')",
        "text",
        "args are not JSON",
    ),
    (
        "frame-walk",
        "g = (x for x in [1])\nresult = str(sorted(g.gi_frame.f_globals))",
        "text",
        "",
    ),
]


@pytest.mark.parametrize(
    ("program", "kit", "needle"), [u[1:] for u in UNVALIDATED], ids=[u[0] for u in UNVALIDATED]
)
def test_unvalidated_programs_stay_contained(
    service: DelegateService,
    kits_registry: tuple[Registry, AuditFile],
    program: str,
    kit: str,
    needle: str,
) -> None:
    """With the validator skipped, the runner's namespace, the kit gate and the policy hold."""
    registry, sink = kits_registry
    value = _unvalidated(registry, service, kit, program)
    text = json.dumps(value)
    assert "root:" not in text  # /etc/passwd never read
    if needle:
        assert value["success"] is False
        assert needle in value["error"]["message"]
    # whatever it reached, no notes were deleted and no call left the kit's skills
    callees = {r["skill"] for r in sink.records if r["caller"].startswith(f"skill:kit.{kit}<")}
    assert callees <= {t.skill for t in service.kit(kit).tools.values()}
    denied = [
        d
        for r in sink.records
        for d in r["decisions"]
        if r["skill"] == f"kit.{kit}" and not d["allowed"]
    ]
    if "invoke" in program and "range(50)" not in program:
        assert any(d["rule"] == f"kit.{kit}.tools" for d in denied)


INJECTIONS = [
    "hello'); import os; x = ('",
    'hello"""\nimport os\n"""',
    "__import__('os').system('id')",
    "{0.__class__}",
    "\n\nresult = open('/etc/passwd').read()",
    "echo.__globals__['invoke']",
    "'; del result; '",
    "\\'\\x00\\n",
    "${HOME} $(id) `id`",
    "{{7*7}} {% import os %}",
]


@pytest.mark.parametrize("text", INJECTIONS)
def test_template_captures_stay_data(service: DelegateService, text: str) -> None:
    """Text captured by a template is a parameter's value: the program is the kit's, unchanged."""
    result = service.delegate(f"shout {text}", "text")
    assert result["generation_tier"] == "templates"
    assert result["program"] == "result = echo(text).upper()\n"
    assert result["params"] == {"text": " ".join(text.split())}
    assert result["success"] and result["output"] == " ".join(text.split()).upper()


@pytest.mark.parametrize("text", INJECTIONS[:4])
def test_rule_captures_stay_data(service: DelegateService, text: str) -> None:
    """Text captured by a keyword rule is a parameter's value too."""
    result = service.delegate(f"please echo {text}", "text")
    assert result["generation_tier"] == "rules"
    assert result["program"] == 'result = echo(text or "")\n'
    assert result["output"] == " ".join(text.split())


def test_suite_has_at_least_80_programs() -> None:
    """The issue asks for at least 80 hostile programs."""
    total = len(REFUSED) + len(STOPPED) + len(UNVALIDATED) + len(INJECTIONS) + 4
    assert total >= 80, total


# Programs built from pieces of the language and pieces outside it.
_ATOMS = st.sampled_from(
    [
        "1", "'a'", "titles()", "echo('x')", "x", "[1, 2]", "{'k': 1}", "len(x)", "range(3)",
        "print", "__import__", "().__class__", "g.gi_frame", "'{0}'.format(1)", "'__'",
        "lambda: 1", "(y := 2)", "x.y", "eval('1')", "open('f')", "delete('t')",
    ]
)  # fmt: skip
_STMTS = st.one_of(
    st.builds(lambda a: f"x = {a}", _ATOMS),
    st.builds(lambda a, b: f"x = {a} + {b}", _ATOMS, _ATOMS),
    st.builds(lambda a: f"for i in {a}:\n    y = i", _ATOMS),
    st.builds(lambda a: f"if {a}:\n    result = {a}", _ATOMS),
    st.builds(lambda a: f"result = [v for v in {a}]", _ATOMS),
    st.sampled_from(
        [
            "import os",
            "while x:\n    pass",
            "def f():\n    pass",
            "try:\n    x = 1\nexcept:\n    pass",
        ]
    ),
)
_PROGRAMS = st.lists(_STMTS, min_size=1, max_size=6).map("\n".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_PROGRAMS)
def test_generated_programs_are_refused_or_clean(program: str) -> None:
    """Every generated program is refused, or holds nothing outside the language."""
    problems = validate(program, NOTES)
    forbidden = ("__", "gi_frame", ".format", "lambda", ":=", "import", "while", "def ",
                 "try:", "eval(", "open(", "delete(", "x.y")  # fmt: skip
    if not problems:
        assert not any(f in program for f in forbidden), program
    for p in problems:
        assert p.line >= 1 and p.rule.startswith("delegate.")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_arbitrary_text_never_crashes_the_validator(text: str) -> None:
    """Any text gets a list of located problems, never an exception."""
    for p in validate(text, NOTES):
        assert p.line >= 1 and p.column >= 0


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_PROGRAMS)
def test_generated_valid_programs_run_contained(service: DelegateService, program: str) -> None:
    """A generated program the validator accepts runs to a result or a clean error."""
    if validate(program, service.kit("notes").tools):
        return
    result = service.run_program(program, "notes")
    assert result["success"] or result["error"]["code"]
    assert len(result["trace"]) <= service.kit("notes").max_calls


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("__builtins__", "delegate.underscore"),
        ("_x", "delegate.underscore"),
        ("len", "delegate.name"),
        ("print", "delegate.name"),
        ("getattr", "delegate.builtin"),
        ("echo", "delegate.name"),
        ("not a name", "delegate.name"),
        ("for", "delegate.name"),
    ],
)
def test_parameters_follow_the_name_rules(name: str, rule: str) -> None:
    """A parameter may not bind __builtins__, a builtin, a kit tool or a non-name."""
    problems = validate("result = 1", NOTES, {name: 5})
    assert [p.rule for p in problems] == [rule], problems


def test_a_builtin_parameter_is_refused_before_the_program_runs(service: DelegateService) -> None:
    """run_program with {"len": 5} is refused by the validator, never run with len shadowed."""
    result = service.run_program("result = len('abc')", "text", {"len": 5})
    assert not result["success"] and result["error"]["code"] == "invalid-program"
    assert "builtin" in result["error"]["message"] and result["trace"] == []
