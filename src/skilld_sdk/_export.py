"""Glue between a :class:`Skill` and the WIT ``guest`` export (runs inside the guest).

The build generates an entry module that calls :func:`export`; componentize-py
then finds its ``Guest`` class.
"""

from __future__ import annotations

import json
import traceback
from types import ModuleType
from typing import Any

from componentize_py_types import Err  # type: ignore[import-not-found]
from wit_world.imports import types as wit  # type: ignore[import-not-found]

from skilld_sdk._skill import Audio, Embedded, Image, Rich, Skill, SkillError, Text, jsonable


def _find_skill(module: ModuleType) -> Skill:
    found = [v for v in vars(module).values() if isinstance(v, Skill)]
    if len(found) != 1:
        raise RuntimeError(
            f"{module.__name__} must define exactly one Skill object, found {len(found)}"
        )
    return found[0]


def _err(code: str, message: str, rule: str | None = None) -> Err:
    return Err(wit.Error(getattr(wit.ErrorCode, code.upper().replace("-", "_")), message, rule))


def _content(block: Any) -> Any:
    if isinstance(block, Text):
        return wit.Content_Text(block.text)
    if isinstance(block, Image):
        return wit.Content_Image(wit.Blob(block.mime_type, block.data))
    if isinstance(block, Audio):
        return wit.Content_Audio(wit.Blob(block.mime_type, block.data))
    if isinstance(block, Embedded):
        return wit.Content_Embedded(
            wit.EmbeddedResource(block.uri, block.mime_type, block.text, block.blob)
        )
    raise TypeError(f"not a content block: {type(block).__name__}")


def _output(result: Any) -> Any:
    if isinstance(result, Rich):
        return wit.Output(json.dumps(jsonable(result.value)), [_content(b) for b in result.content])
    return wit.Output(json.dumps(jsonable(result)), [])


def _guarded(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except SkillError as exc:
        raise _err(exc.code, exc.message, exc.rule) from None
    except Err:
        raise
    except MemoryError:
        raise _err("limit-exceeded", "the skill ran out of memory") from None
    except RecursionError:
        raise _err("limit-exceeded", "the skill exceeded its recursion limit") from None
    except Exception as exc:  # noqa: BLE001  (any guest bug becomes a typed internal error)
        tb = traceback.format_exc(limit=8)
        raise _err("internal", f"{type(exc).__name__}: {exc}\n{tb}") from None


def export(module: ModuleType, *, id: str, version: str, description: str) -> type:  # noqa: A002
    """Build the ``Guest`` class componentize-py exports for ``module``'s skill."""
    skill = _find_skill(module)
    info = wit.SkillInfo(
        id,
        version,
        skill.description or description,
        [
            wit.MethodInfo(
                m.name,
                m.description,
                json.dumps(m.params),
                json.dumps(m.result) if m.result is not None else None,
            )
            for m in skill.methods.values()
        ],
        [
            wit.ResourceInfo(r.uri, r.name, r.description, r.mime_type, r.template)
            for r in skill.resources
        ],
        [
            wit.PromptInfo(p.name, p.description, json.dumps(p.arguments))
            for p in skill.prompts.values()
        ],
    )

    def read(uri: str) -> list[Any]:
        for res in skill.resources:
            params = res.match(uri)
            if params is not None:
                data = res.fn(**params)
                if isinstance(data, (bytes, bytearray)):
                    block = Embedded(uri, blob=bytes(data), mime_type=res.mime_type)
                else:
                    block = Embedded(uri, text=str(data), mime_type=res.mime_type)
                return [wit.Output("null", [_content(block)])]
        raise SkillError("not-found", f"no resource {uri}")

    def prompt(name: str, args: str) -> str:
        found = skill.prompts.get(name)
        if found is None:
            raise SkillError("not-found", f"no prompt '{name}'")
        from skilld_sdk._skill import Method

        result = Method.of(name, found.fn, "", found.arguments, None).invoke(args)
        if isinstance(result, str):
            result = [{"role": "user", "content": {"type": "text", "text": result}}]
        return json.dumps(jsonable(result))

    # Warm the paths every call takes (JSON both ways, the output records): whatever
    # they initialise lazily lands in the build-time snapshot instead of every call.
    json.loads(json.dumps({"warm": [1, 2.5, None, True, "x"]}))
    _output(Rich(None, [Text("warm")]))

    class Guest:
        def describe(self) -> Any:
            return info

        def call(self, method: str, args: str) -> Any:
            return _guarded(lambda: _output(skill.call(method, args)))

        def read_resource(self, uri: str) -> Any:
            return _guarded(read, uri)

        def get_prompt(self, name: str, args: str) -> Any:
            return _guarded(prompt, name, args)

    return Guest
