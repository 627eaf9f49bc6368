"""The SDK turns type hints and docstrings into JSON Schema, and refuses what it cannot say."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, TypedDict, Union

import jsonschema
import pytest

from skilld_sdk import SchemaError, Skill, SkillError
from skilld_sdk.schema import coerce, params_schema, result_schema, type_schema, u8, u32


class Movie(TypedDict):
    title: str
    year: int


class Filters(TypedDict, total=False):
    genre: str


@dataclass
class Point:
    x: float
    y: float = 0.0
    tags: list[str] = field(default_factory=list)


def props(fn: Any) -> dict[str, Any]:
    """The properties of a function's parameter schema."""
    return params_schema(fn, fn.__name__)["properties"]  # type: ignore[no-any-return]


def test_scalars() -> None:
    """str, int, float and bool map to their JSON types."""

    def f(a: str, b: int, c: float, d: bool) -> None: ...

    p = props(f)
    assert [p[k]["type"] for k in "abcd"] == ["string", "integer", "number", "boolean"]


def test_required_and_defaults() -> None:
    """Parameters without defaults are required; JSON-able defaults are recorded."""

    def f(a: str, b: int = 3, c: str | None = None) -> None: ...

    s = params_schema(f, "f")
    assert s["required"] == ["a"]
    assert s["properties"]["b"]["default"] == 3
    assert s["additionalProperties"] is False


def test_lists_and_dicts() -> None:
    """list[T] is an array of T; dict[str, T] an object of T."""

    def f(a: list[int], b: dict[str, float], c: list[list[str]]) -> None: ...

    p = props(f)
    assert p["a"] == {"type": "array", "items": {"type": "integer"}}
    assert p["b"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert p["c"]["items"]["items"] == {"type": "string"}


def test_optional_and_union() -> None:
    """Optional[T] and T | None allow null; unions become anyOf."""

    def f(a: int | None, b: str | None, c: int | str) -> None: ...

    p = props(f)
    assert p["a"] == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert p["b"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert p["c"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}


def test_literal() -> None:
    """Literal values become an enum."""

    def f(mode: Literal["r", "w"]) -> None: ...

    assert props(f)["mode"] == {"enum": ["r", "w"]}


def test_typeddict() -> None:
    """A TypedDict is a closed object with its required keys."""

    def f(m: Movie) -> None: ...

    s = props(f)["m"]
    assert s["properties"] == {"title": {"type": "string"}, "year": {"type": "integer"}}
    assert s["required"] == ["title", "year"]


def test_dataclass() -> None:
    """A dataclass is an object; fields with defaults are optional."""

    def f(p: Point) -> None: ...

    s = props(f)["p"]
    assert s["required"] == ["x"]
    assert s["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}
    assert s["properties"]["y"]["default"] == 0.0


def test_any() -> None:
    """Any is the empty schema."""

    def f(a: Any) -> None: ...

    assert props(f)["a"] == {}


def test_docstring_descriptions() -> None:
    """Google-style Args: lines become parameter descriptions."""

    def f(a: str, b: int) -> None:
        """Do it.

        Args:
            a: the first one,
                continued here.
            b (int): the second.
        """

    p = props(f)
    assert p["a"]["description"] == "the first one, continued here."
    assert p["b"]["description"] == "the second."


def test_result_schema_objects_only() -> None:
    """Object results declare an output schema; scalars do not."""

    def f() -> Movie: ...
    def g() -> int: ...

    assert result_schema(f, "f")["type"] == "object"  # type: ignore[index]
    assert result_schema(g, "g") is None


@pytest.mark.parametrize(
    ("annotation", "needle"),
    [
        (set[int] | bytes, "bytes"),
        (bytes, "bytes"),
        (tuple[int, str], "tuple"),
        (dict[int, str], "keys"),
        (complex, "complex"),
        (object, "object"),
    ],
)
def test_unsupported_types_name_the_parameter(annotation: Any, needle: str) -> None:
    """An unsupported type is refused with a message naming the method and parameter."""

    def f(payload: int) -> None: ...

    f.__annotations__["payload"] = annotation
    with pytest.raises(SchemaError, match="parameter 'payload'") as info:
        params_schema(f, "upload")
    assert "upload" in str(info.value) and needle in str(info.value)


def test_missing_annotation_names_parameter() -> None:
    """A parameter without a type hint is refused by name."""

    def f(a, b: int) -> None: ...  # type: ignore[no-untyped-def]

    with pytest.raises(SchemaError, match="parameter 'a': missing type annotation"):
        params_schema(f, "f")


def test_decorator_registration_fails_early() -> None:
    """@skill.method refuses an unsupported signature when the module is imported (build time)."""
    skill = Skill()
    with pytest.raises(SchemaError, match="'blob'"):

        @skill.method
        def send(blob: bytes) -> None: ...


def test_call_coerces_and_checks() -> None:
    """Skill.call builds dataclasses from JSON and refuses wrong shapes with invalid-argument."""
    skill = Skill()

    @skill.method
    def norm(p: Point, scale: float = 1.0) -> float:
        return (p.x**2 + p.y**2) ** 0.5 * scale

    assert skill.call("norm", json.dumps({"p": {"x": 3, "y": 4}})) == 5.0
    with pytest.raises(SkillError, match=r"p\.x") as info:
        skill.call("norm", json.dumps({"p": {"x": "3"}}))
    assert info.value.code == "invalid-argument"
    with pytest.raises(SkillError, match="missing argument 'p'"):
        skill.call("norm", "{}")
    with pytest.raises(SkillError, match="unknown argument"):
        skill.call("norm", json.dumps({"p": {"x": 1}, "zz": 1}))


_INT = {"type": "integer"}

# (annotation, its schema, JSON values both accept, JSON values both refuse)
_AGREEMENT: list[tuple[Any, dict[str, Any], list[Any], list[Any]]] = [
    (Optional[int], {"anyOf": [_INT, {"type": "null"}]}, [3, None], ["3", True, 1.5]),  # noqa: UP045 (typing.Optional is what is under test)
    (Union[int, str], {"anyOf": [_INT, {"type": "string"}]}, [3, "x"], [True, None, 1.5, []]),  # noqa: UP007 (typing.Union is what is under test)
    (int | None, {"anyOf": [_INT, {"type": "null"}]}, [0, None], [False, "0"]),
    (tuple[int, ...], {"type": "array", "items": _INT}, [[], [1, 2]], [[1, "2"], [True], "12", {}]),
    (set[str], {"type": "array", "items": {"type": "string"}}, [["a", "a"], []], [["a", 1], "a"]),
    (None, {"type": "null"}, [None], [0, False, "", {}]),
    (Literal[1, 2], {"enum": [1, 2]}, [1, 2], [True, False, "1", 3]),
    (Literal[True], {"enum": [True]}, [True], [1, False, "true"]),
    (Literal[0, "a"], {"enum": [0, "a"]}, [0, "a"], [False, "0", None]),
    (
        Movie,
        {
            "type": "object",
            "title": "Movie",
            "properties": {"title": {"type": "string"}, "year": _INT},
            "required": ["title", "year"],
            "additionalProperties": False,
        },
        [{"title": "a", "year": 1}],
        [{"title": "a"}, {}, {"title": "a", "year": 1, "cast": []}, {"title": "a", "year": True}],
    ),
    (
        Filters,
        {
            "type": "object",
            "title": "Filters",
            "properties": {"genre": {"type": "string"}},
            "required": [],
            "additionalProperties": False,
        },
        [{}, {"genre": "noir"}],
        [{"genre": 1}, {"year": 1}],
    ),
]


@pytest.mark.parametrize(
    ("annotation", "schema", "accepted", "refused"),
    _AGREEMENT,
    ids=[
        a[0].__name__ if isinstance(a[0], type) else str(a[0]).replace("typing.", "")
        for a in _AGREEMENT
    ],
)
def test_schema_and_argument_checks_agree(
    annotation: Any, schema: dict[str, Any], accepted: list[Any], refused: list[Any]
) -> None:
    """Each annotation has the expected schema, and the SDK's argument check accepts exactly
    the values a JSON Schema validator accepts against it."""
    assert type_schema(annotation, "p") == schema
    validator = jsonschema.Draft202012Validator(schema)
    for value in accepted:
        assert validator.is_valid(value), value
        coerce(value, annotation, "p")
    for value in refused:
        assert not validator.is_valid(value), value
        with pytest.raises(TypeError, match=r"^p"):
            coerce(value, annotation, "p")


def test_containers_arrive_as_their_annotated_type() -> None:
    """tuple[T, ...] and set[T] arguments reach the method as a tuple and a set."""
    assert coerce([1, 2], tuple[int, ...], "p") == (1, 2)
    assert coerce(["a", "a", "b"], set[str], "p") == {"a", "b"}


def test_call_refuses_missing_typeddict_keys_and_bool_for_int_literal() -> None:
    """Skill.call refuses a TypedDict without a required key and true for Literal[1, 2]."""
    skill = Skill()

    @skill.method
    def rate(movie: Movie, stars: Literal[1, 2]) -> int:
        return stars

    assert skill.call("rate", json.dumps({"movie": {"title": "a", "year": 1}, "stars": 2})) == 2
    with pytest.raises(SkillError, match=r"missing field\(s\) \['year'\]") as info:
        skill.call("rate", json.dumps({"movie": {"title": "a"}, "stars": 1}))
    assert info.value.code == "invalid-argument"
    with pytest.raises(SkillError, match="stars: must be one of") as info:
        skill.call("rate", json.dumps({"movie": {"title": "a", "year": 1}, "stars": True}))
    assert info.value.code == "invalid-argument"


def test_unsigned_types_have_a_minimum_and_a_maximum() -> None:
    """u8 and u32 give minimum 0 and the type's maximum; coerce refuses what the schema does."""
    assert type_schema(u32, "x") == {"type": "integer", "minimum": 0, "maximum": 2**32 - 1}
    assert type_schema(u8, "x")["maximum"] == 255
    assert coerce(7, u32, "limit") == 7
    for bad in (-1, 2**32):
        with pytest.raises(TypeError, match="limit: must be between 0 and 4294967295"):
            coerce(bad, u32, "limit")
    with pytest.raises(TypeError, match="expected an integer"):
        coerce(True, u8, "x")


def test_a_negative_limit_is_refused_by_the_generated_schema() -> None:
    """A method taking a u32 publishes a schema that jsonschema refuses -1 against."""

    def list_notes(limit: u32 = 100) -> list[str]:
        return []

    schema = params_schema(list_notes, "list")
    with pytest.raises(jsonschema.ValidationError, match="less than the minimum of 0"):
        jsonschema.validate({"limit": -1}, schema)
    jsonschema.validate({"limit": 0}, schema)
