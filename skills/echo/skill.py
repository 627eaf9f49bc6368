"""Echo: the smallest useful skill, and the ABI's smoke test."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from skilld_sdk import Skill, SkillError

skill = Skill()


@skill.method
def echo(text: str) -> str:
    """Return the text unchanged.

    Args:
        text: what to echo.
    """
    return text


@skill.method
def fail(
    code: Literal["not-found", "invalid-argument", "internal"] = "internal",
    message: str = "failed on request",
) -> None:
    """Fail with a typed error.

    Args:
        code: the error code to return.
        message: the error message to return.
    """
    raise SkillError(code, message)


@dataclass
class Point:
    x: float
    y: float


@dataclass
class Shape:
    name: str
    points: list[Point]
    closed: bool = False


@skill.method
def structured(name: str, points: list[Point], closed: bool = False) -> Shape:
    """Return structured data built from the arguments.

    Args:
        name: the shape's name.
        points: its corners.
        closed: whether the last point joins the first.
    """
    return Shape(name=name, points=points, closed=closed)
