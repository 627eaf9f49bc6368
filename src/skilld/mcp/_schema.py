"""Arguments are checked against a tool's input schema before any guest runs.

Uses ``jsonschema`` (a dependency of the ``mcp`` SDK) with the 2020-12 dialect, the one
MCP tool schemas default to; ``$defs``/``$ref`` inside one schema resolve, remote
references do not (a sealed appliance fetches nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

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

        error = jsonschema.exceptions.best_match(self._validator.iter_errors(dict(arguments)))
        if error is None:
            return
        path = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise UsageError(
            f"invalid arguments at {path}: {error.message}",
            location=self._where,
            hint=f"schema keyword '{error.validator}'",
        )
