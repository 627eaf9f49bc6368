"""Sheller: one shell.run, its exit code and output (the container tests' guest)."""

from __future__ import annotations

from skilld_sdk import Skill, shell

skill = Skill()


@skill.method
def run(argv: list[str]) -> dict[str, str]:
    """Run ``argv`` (a program the policy grants) and report how it ended.

    Args:
        argv: the program and its arguments.
    """
    out = shell.run(argv, timeout_ms=5000)
    return {"exit": str(out.exit_code), "stdout": out.stdout.decode(errors="replace")}
