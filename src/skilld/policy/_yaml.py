"""YAML loading that remembers where every key and list item came from.

PyYAML's ``SafeLoader`` drops node marks once it has built Python objects; the
compiler needs them for ``file:line`` errors. Mappings are built as
:class:`LMap` (a ``dict`` with the line of each key) and sequences as
:class:`LList` (a ``list`` with the line of each item). Duplicate keys are an
error, since silently keeping the last one hides typos.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from skilld.errors import PolicyError

if TYPE_CHECKING:
    import yaml


class LMap(dict[str, Any]):
    """A mapping from YAML with the 1-based line of itself and of each key."""

    line: int = 0
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int:
        """Line of ``key`` (the mapping's own line when absent)."""
        return self.key_lines.get(key, self.line)


class LList(list[Any]):
    """A sequence from YAML with the 1-based line of itself and of each item."""

    line: int = 0
    item_lines: list[int]

    def line_of(self, index: int) -> int:
        """Line of item ``index``."""
        return self.item_lines[index] if index < len(self.item_lines) else self.line


@cache
def _loader_class() -> type[Any]:
    """The SafeLoader subclass building :class:`LMap`/:class:`LList` (built on first use:
    serving reads compiled tables, never YAML, and need not import the parser)."""
    import yaml

    class _Loader(yaml.SafeLoader):
        source = "<yaml>"

    _Loader.add_constructor("tag:yaml.org,2002:map", _map)
    _Loader.add_constructor("tag:yaml.org,2002:seq", _seq)
    return _Loader


def _map(loader: Any, node: yaml.MappingNode) -> LMap:
    loader.flatten_mapping(node)
    out = LMap()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, str):
            raise PolicyError(
                f"keys must be strings, got {key!r}", location=f"{loader.source}:{line}"
            )
        if key in out:
            raise PolicyError(f"duplicate key {key!r}", location=f"{loader.source}:{line}")
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = line
    return out


def _seq(loader: Any, node: yaml.SequenceNode) -> LList:
    out = LList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


def load_yaml(text: str, source: str) -> Any:
    """Parse one YAML document, keeping lines; ``source`` names it in errors.

    Raises:
        PolicyError: the text is not YAML, or has duplicate or non-string keys.
    """
    import yaml

    try:
        # The reader checks the characters when it is made: a control character is
        # a YAML error there, before parsing starts.
        loader = _loader_class()(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"not valid YAML: {exc}", location=f"{source}:1") from exc
    loader.source = source
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise PolicyError(
            f"not valid YAML: {exc.problem or exc.context}", location=f"{source}:{line}"
        ) from exc
    except yaml.YAMLError as exc:
        raise PolicyError(f"not valid YAML: {exc}", location=f"{source}:1") from exc
    finally:
        loader.dispose()
