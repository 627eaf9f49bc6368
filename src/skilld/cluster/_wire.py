"""What travels between nodes: subjects, headers, and call results and errors as bytes.

A routed call is one request on the subject of the skill's package on the node the
entry picked (``skilld.call.NODE.SKILL.DIGEST``, SKILL by :func:`skill_token`) whose
reply subject is a stream back to the entry node: any number of ``progress`` and
``log`` events and ``sample``/``elicit`` requests (answered by the entry node), then
the outcome, split into ``part`` messages when it is larger than the server's payload
limit. Cancellation goes to ``skilld.cancel.CALL_ID``. Every one of these messages is
sealed (``_envelope``): its routing facts travel in the ``Skilld-Meta`` header,
authenticated with the rest.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from typing import Any

from skilld.errors import (
    CallCancelled,
    DeadlineExceeded,
    GuestError,
    GuestFault,
    GuestTrap,
    HostCallError,
    MemoryExhausted,
    RegistryError,
    SkilldError,
    StackExhausted,
    UsageError,
)
from skilld.types import CallOutput, ContentBlock

ANNOUNCE = "skilld.announce"
LEAVE = "skilld.leave"
CALL_PREFIX = "skilld.call"
CANCEL_PREFIX = "skilld.cancel"

# announcement headers
H_KEY = "Skilld-Key"
H_SIG = "Skilld-Sig"
H_STAMP = "Skilld-Stamp"  # BOOT.SEQ of the sender, signed or sealed: each accepted once

# Room left in a message for headers when a result is split into parts.
PART_HEADROOM = 4096


_PLAIN = re.compile(r"[A-Za-z0-9-]")
_ESCAPED = re.compile(r"_([0-9a-f]{2})")


def skill_token(skill_id: str) -> str:
    """``skill_id`` as one NATS subject token and ``nats.micro`` endpoint name.

    Letters, digits and ``-`` stay; every other byte (``.`` of ``kit.notes``, ``_``
    itself) becomes ``_`` and two hex digits, so the mapping is reversible
    (:func:`skill_from_token`) and its output matches ``^[A-Za-z0-9_-]+$``.
    """
    return "".join(
        c if _PLAIN.fullmatch(c) else "".join(f"_{b:02x}" for b in c.encode()) for c in skill_id
    )


def skill_from_token(token: str) -> str:
    """The inverse of :func:`skill_token`.

    Raises:
        ValueError: not a token :func:`skill_token` makes.
    """
    out, i = bytearray(), 0
    while i < len(token):
        if token[i] == "_" and _ESCAPED.match(token, i):
            out.append(int(token[i + 1 : i + 3], 16))
            i += 3
        elif _PLAIN.fullmatch(token[i]):
            out += token[i].encode()
            i += 1
        else:
            raise ValueError(f"not a skill token: {token!r}")
    try:
        skill_id = out.decode()
    except UnicodeDecodeError:
        raise ValueError(f"not a skill token: {token!r}") from None
    if not token or skill_token(skill_id) != token:
        raise ValueError(f"not a skill token: {token!r}")
    return skill_id


def call_subject(node: str, skill_id: str, digest: str) -> str:
    """The subject (and queue group) of one skill package on one node.

    The entry node picks the replica (so that it knows whose seal the answer
    must carry); replicas still share the load, by the entry's round robin.
    """
    return f"{CALL_PREFIX}.{node}.{skill_token(skill_id)}.{digest[:16]}"


def cancel_subject(call_id: str) -> str:
    """Where the entry node says that a call was cancelled."""
    return f"{CANCEL_PREFIX}.{call_id}"


def dumps(value: Any) -> bytes:
    """Compact JSON bytes."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def output_to_json(out: CallOutput) -> dict[str, Any]:
    """A call's output as JSON (content bytes in base64)."""
    return {
        "value": out.value,
        "content": [
            {
                "kind": b.kind,
                "text": b.text,
                "mime_type": b.mime_type,
                "data": None if b.data is None else base64.b64encode(b.data).decode(),
                "uri": b.uri,
            }
            for b in out.content
        ],
    }


def output_from_json(doc: Mapping[str, Any]) -> CallOutput:
    """The inverse of :func:`output_to_json`.

    Raises:
        KeyError, TypeError, ValueError: a malformed document.
    """
    return CallOutput(
        value=doc["value"],
        content=tuple(
            ContentBlock(
                kind=str(b["kind"]),
                text=b.get("text"),
                mime_type=b.get("mime_type"),
                data=None if b.get("data") is None else base64.b64decode(b["data"]),
                uri=b.get("uri"),
            )
            for b in doc.get("content") or ()
        ),
    )


# Errors that cross the wire keep their class; anything else arrives as GuestError internal.
_FAULTS: dict[str, type[GuestFault]] = {
    c.__name__: c
    for c in (GuestTrap, DeadlineExceeded, CallCancelled, MemoryExhausted, StackExhausted)
}


def error_to_json(exc: SkilldError, node: str) -> dict[str, Any]:
    """A failure of a routed call, as JSON."""
    doc: dict[str, Any] = {
        "type": type(exc).__name__,
        "message": exc.message,
        "location": exc.location,
        "hint": exc.hint,
        "node": node,
    }
    if isinstance(exc, GuestError | HostCallError):
        doc["code"], doc["rule"] = exc.code, exc.rule
    return doc


def error_from_json(doc: Mapping[str, Any]) -> SkilldError:
    """The error a routed call raised on its node, rebuilt on the entry node."""
    kind = str(doc.get("type", ""))
    message = str(doc.get("message", "the remote call failed"))
    location = doc.get("location")
    if kind in ("GuestError", "HostCallError"):
        return GuestError(
            str(doc.get("code") or "internal"), message, rule=doc.get("rule"), location=location
        )
    if kind in _FAULTS:
        return _FAULTS[kind](message, location=location)
    if kind == "RegistryError":
        return RegistryError(message, location=location)
    if kind == "UsageError":
        return UsageError(message, location=location, hint=doc.get("hint"))
    return GuestError("internal", f"on node {doc.get('node')}: {message}", location=location)


def split(payload: bytes, max_payload: int) -> list[bytes]:
    """``payload`` in parts that each fit in one message."""
    size = max(1024, max_payload - PART_HEADROOM)
    return [payload[i : i + size] for i in range(0, len(payload), size)] or [b""]
