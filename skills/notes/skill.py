"""Notes: add, get, list and delete short notes kept in key-value state."""

from __future__ import annotations

from typing import TypedDict

from skilld_sdk import Skill, SkillError, kv, u32

skill = Skill()

_PREFIX = "note:"


class Note(TypedDict):
    title: str
    body: str


@skill.method
def add(title: str, body: str) -> Note:
    """Add a note, or replace the note with the same title.

    Args:
        title: the note's title (its key).
        body: the note's text.
    """
    if not title:
        raise SkillError("invalid-argument", "title must not be empty")
    kv.set_json(_PREFIX + title, {"title": title, "body": body})
    return {"title": title, "body": body}


@skill.method
def get(title: str) -> Note:
    """Return one note.

    Args:
        title: the note's title.
    """
    note = kv.get_json(_PREFIX + title)
    if note is None:
        raise SkillError("not-found", f"no note titled {title!r}")
    return note  # type: ignore[no-any-return]


@skill.method(name="list")
def list_notes(prefix: str = "", limit: u32 = 100) -> list[str]:
    """List note titles, in order.

    Args:
        prefix: only titles starting with this.
        limit: at most this many titles.
    """
    return [key[len(_PREFIX) :] for key in kv.keys(_PREFIX + prefix, limit)]


@skill.method
def delete(title: str) -> bool:
    """Delete a note; true when it existed.

    Args:
        title: the note's title.
    """
    return kv.delete(_PREFIX + title)
