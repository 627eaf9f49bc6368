"""Arguments are checked against a tool's input schema before any guest runs.

Uses ``jsonschema`` (a dependency of the ``mcp`` SDK) with the 2020-12 dialect, the one
MCP tool schemas default to; ``$defs``/``$ref`` inside one schema resolve, remote
references do not (a sealed appliance fetches nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skilld.errors import UsageError


class ArgumentValidator:
    """A compiled input schema.

    Raises:
        UsageError: from the constructor when the schema itself is invalid.
    """

    def __init__(self, schema: Mapping[str, Any], *, where: str):
        # Imported on the first validation, not at start-up: it costs ~33 ms and no
        # argument needs checking before the first call.
        import jsonschema

        self._where = where
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise UsageError(f"the input schema is invalid: {exc.message}", location=where) from exc
        self._validator = cls(dict(schema))

    def check(self, arguments: Mapping[str, Any]) -> None:
        """Accept ``arguments`` or say precisely what is wrong with them.

        Raises:
            UsageError: the arguments do not satisfy the schema; the message names
                the offending path and the failed keyword.
        """
        import jsonschema

        errors = list(self._validator.iter_errors(dict(arguments)))
        explained = [e for e in map(_picked_branch, errors) if e is not None]
        error = jsonschema.exceptions.best_match(explained or errors)
        if error is None:
            return
        path = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise UsageError(
            f"invalid arguments at {path}: {_shortened(error.message)}",
            location=self._where,
            hint=f"schema keyword '{error.validator}'",
        )


# jsonschema's messages quote the offending value: a run_script call with too many files
# would be answered with all of them (megabytes, past what a client accepts in one event).
_MESSAGE_EDGE = 160


def _shortened(message: str) -> str:
    """``message`` with the middle of a long quoted value left out (its end says what
    is wrong: "... is too long")."""
    if len(message) <= 3 * _MESSAGE_EDGE:
        return message
    left = len(message) - 2 * _MESSAGE_EDGE
    return f"{message[:_MESSAGE_EDGE]} ...({left} characters)... {message[-_MESSAGE_EDGE:]}"


def _picked_branch(error: Any) -> Any:
    """The failure inside the branch of a discriminated union that the arguments picked.

    For a failed ``oneOf``/``anyOf`` whose branches are told apart by a ``const`` on a
    property (a per-skill tool's ``method``); None when the arguments picked no
    branch, so that another error (``method`` not in its ``enum``) explains it.
    ``best_match`` alone would report "not valid under any of the given schemas" and
    leave the user to guess which parameter of the chosen method is wrong.
    """
    import jsonschema

    while error.validator in ("oneOf", "anyOf") and error.context:
        # A const on a property of the object itself is the discriminator; a const
        # deeper down is part of some branch's parameters.
        refused = {
            e.relative_schema_path[0]
            for e in error.context
            if e.validator == "const" and len(e.relative_path) == 1
        }
        if not refused:
            break
        picked = [e for e in error.context if e.relative_schema_path[0] not in refused]
        if not picked:
            return None
        error = jsonschema.exceptions.best_match(picked)
    return error
