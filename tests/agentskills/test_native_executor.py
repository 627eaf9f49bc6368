"""The native executor's ordinary work: interpreters the policy names, the environment."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

import pytest

from skilld import agentskills
from skilld.agentskills._executors import NativeExecutor
from skilld.errors import GuestError
from skilld.registry import Call, Registry, SkillEntry
from skilld.types import Limits

SKILL_MD = "---\nname: shelly\ndescription: Runs a shell script and a Python one.\n---\nRun them.\n"
# Builtins only: other programs run only when the skill's shell grants name them.
HELLO_SH = 'echo "hello $1"\ncompgen -e\n'
ENV_PY = "import os, sys\nprint(sorted(os.environ))\nprint(sys.flags.isolated)\n"


# Writes a cache, a temporary file and a profile the way libraries do, and one output.
CACHES_PY = """
import os, tempfile
for var in ("HOME", "TMPDIR", "XDG_CACHE_HOME"):
    print(var, os.path.relpath(os.environ[var]))
os.makedirs(os.path.join(os.environ["XDG_CACHE_HOME"], "fontconfig"))
open(os.path.join(os.environ["XDG_CACHE_HOME"], "fontconfig", "x.cache"), "w").write("c")
tempfile.NamedTemporaryFile(delete=False).write(b"t")
os.makedirs(os.path.expanduser("~/.config/app"))
open(os.path.expanduser("~/.config/app/profile"), "w").write("p")
open("result.txt", "w").write("r")
"""


def registry_for(tmp_path: Path, interpreters: tuple[str, ...]) -> Registry:
    """A registry holding the skill, its scripts run natively with ``interpreters``."""
    skill = tmp_path / "shelly"
    (skill / "scripts").mkdir(parents=True, exist_ok=True)
    (skill / "SKILL.md").write_text(SKILL_MD)
    (skill / "scripts" / "hello.sh").write_text(HELLO_SH)
    (skill / "scripts" / "env.py").write_text(ENV_PY)
    (skill / "scripts" / "other.sh").write_text("/usr/bin/env\necho status=$?\n")
    (skill / "scripts" / "caches.py").write_text(CACHES_PY)
    source = agentskills.read_source(skill)
    spec = agentskills.describe(source.md, "0.0.0", source.files)
    limits = Limits(timeout_ms=5000)
    backend = agentskills.open_backend(
        spec, skill, None, "native", {"interpreters": interpreters}, {}, limits
    )
    registry = Registry()
    registry.add(SkillEntry(spec=spec, component=backend, limits=limits))
    return registry


def run(registry: Registry, script: str, *args: str) -> dict[str, Any]:
    """The value of one run_script call."""
    value: dict[str, Any] = registry.call_method(
        Call("shelly", "run_script", {"script": script, "args": list(args)})
    ).value
    return value


def test_a_shell_script_runs_when_the_policy_names_bash(tmp_path: Path) -> None:
    """bash runs a .sh script when scripts.interpreters names it; it sees only the
    allowlisted environment."""
    value = run(registry_for(tmp_path, ("python", "bash")), "scripts/hello.sh", "world")
    assert value["exit_status"] == 0, value["stderr"]
    lines = value["stdout"].splitlines()
    assert lines[0] == "hello world"
    assert set(lines[1:]) <= {"HOME", "LANG", "LC_ALL", "PATH", "PWD", "SHLVL", "SKILL_DIR",
                              "TMPDIR", "XDG_CACHE_HOME", "_"}  # fmt: skip


def test_an_interpreter_the_policy_does_not_name_is_refused(tmp_path: Path) -> None:
    """Without bash in scripts.interpreters a .sh script is refused with the rule."""
    with pytest.raises(GuestError, match=r"no interpreter for 'scripts/hello\.sh'") as err:
        run(registry_for(tmp_path, ("python",)), "scripts/hello.sh")
    assert err.value.rule == "shelly.scripts"


def test_python_runs_isolated(tmp_path: Path) -> None:
    """Python scripts run isolated (-I) with the allowlisted environment only."""
    value = run(registry_for(tmp_path, ("python",)), "scripts/env.py")
    assert value["exit_status"] == 0, value["stderr"]
    names, isolated = value["stdout"].splitlines()
    assert set(ast.literal_eval(names)) <= {
        "HOME",
        "LANG",
        "LC_ALL",
        "PATH",
        "SKILL_DIR",
        "TMPDIR",
        "XDG_CACHE_HOME",
        "LC_CTYPE",
    }
    assert isolated == "1"


def test_other_programs_need_a_shell_grant(tmp_path: Path) -> None:
    """A script cannot start a program its skill's shell grants do not name (EACCES: 126)."""
    value = run(registry_for(tmp_path, ("python", "bash")), "scripts/other.sh")
    assert "status=126" in value["stdout"]
    assert "Permission denied" in value["stderr"]


def test_caches_temporary_files_and_profiles_do_not_come_back_as_outputs(
    tmp_path: Path,
) -> None:
    """HOME, TMPDIR and XDG_CACHE_HOME are a private directory of the call beside its
    workspace, not in it: what libraries leave there (fontconfig's cache, a temporary
    file, a profile) is not returned, what the script writes in its workspace is."""
    value = run(registry_for(tmp_path, ("python",)), "scripts/caches.py")
    assert value["exit_status"] == 0, value["stderr"]
    where = dict(line.split() for line in value["stdout"].splitlines())
    assert where == {"HOME": "../home", "TMPDIR": "../home", "XDG_CACHE_HOME": "../home/.cache"}
    assert value["files"] == ["workspace://shelly/result.txt"]


def test_only_the_operator_can_give_a_program_its_socket_directory(tmp_path: Path) -> None:
    """``soffice`` named by the policy brings LibreOffice's socket directory (/tmp); named
    only in the skill's own metadata it brings its tools, files and variables, but no
    wider walls: a skill cannot open /tmp to itself by naming a program."""
    (tmp_path / "skill").mkdir()
    args = ("s", tmp_path / "skill", None, ("python",), {}, Limits(), tmp_path)
    by_skill = NativeExecutor(*args, ("soffice",))
    by_operator = NativeExecutor(*args, ("soffice",), operator_programs=("soffice",))
    assert by_skill.needs.socket_dirs == ()
    assert by_operator.needs.socket_dirs == (os.path.realpath("/tmp"),)
    assert by_skill.needs.env == by_operator.needs.env == {"SYSUSERCONFIG": "file://{home}/.config"}


def test_a_script_over_its_process_count_is_told_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the launcher counts a tree's tasks (RLIMIT_NPROC binds nothing for a
    shared identity that is uid 0), a script that starts more processes than its limit
    is ended whole and the call says so: limit-exceeded, the count and the limit."""
    from skilld.confine import _runner

    made = _runner._spec

    def unbound(*args: Any, **kwargs: Any) -> dict[str, Any]:
        spec = made(*args, **kwargs)
        spec["tasks"] = 4  # as the launcher is asked where the kernel does not bound
        return spec

    monkeypatch.setattr(_runner, "_spec", unbound)
    (tmp_path / "shelly" / "scripts").mkdir(parents=True)
    (tmp_path / "shelly" / "scripts" / "many.sh").write_text(
        "for i in 1 2 3 4 5 6 7 8; do read -t 20 < /dev/zero & done\nwait\n"
    )
    registry = registry_for(tmp_path, ("bash",))
    with pytest.raises(GuestError, match=r"processes and threads together, over the skill's "
                       r"limit of \d+; its whole process tree was killed") as err:  # fmt: skip
        run(registry, "scripts/many.sh")
    assert err.value.code == "limit-exceeded"
