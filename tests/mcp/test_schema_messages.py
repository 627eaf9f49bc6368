"""A refusal by a tool's input schema says where and why, without echoing the value back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skilld.errors import UsageError
from skilld.mcp._schema import ArgumentValidator

SCHEMA = {
    "type": "object",
    "properties": {
        "files": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
        "script": {"type": "string", "enum": ["a.py", "b.py"]},
        "stdin": {"type": "string", "maxLength": 8},
    },
    "additionalProperties": False,
}
VALIDATOR = ArgumentValidator(SCHEMA, where="tool t")
# The message's bound: 160 characters each side of what is left out, and the wrapping.
BOUND = 640


@settings(max_examples=60, deadline=None)
@given(
    key=st.sampled_from(["files", "script", "stdin"]),
    blob=st.text(min_size=0, max_size=20_000),
    count=st.integers(min_value=3, max_value=400),
)
def test_a_refusal_stays_short_whatever_the_value(key: str, blob: str, count: int) -> None:
    """A list too long, a string not in the enum or too long, of any size: the refusal
    names the argument and the failed keyword, and is never longer than BOUND."""
    value: object = [blob] * count if key == "files" else blob + "x" * 9
    with pytest.raises(UsageError) as refused:
        VALIDATOR.check({key: value})
    message = str(refused.value)
    assert f"invalid arguments at {key}" in message
    assert len(message) <= BOUND, len(message)


def test_a_short_refusal_is_left_whole() -> None:
    """A message short enough is not cut: the value is quoted as jsonschema says it."""
    with pytest.raises(UsageError) as refused:
        VALIDATOR.check({"script": "c.py"})
    assert "'c.py' is not one of ['a.py', 'b.py']" in str(refused.value)
