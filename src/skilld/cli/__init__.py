"""The ``skilld`` command: the one place where every subsystem is wired together.

Each group of subcommands lives in its own private module with a ``register``
function that adds its parsers; :func:`main` collects them. A command handler
returns an exit code; a :class:`~skilld.errors.SkilldError` it raises is printed
as one clear line on stderr (exit 1, or 2 for usage errors).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from skilld import __version__
from skilld.errors import SkilldError, UsageError

Handler = Callable[[argparse.Namespace], int]

# Modules that contribute subcommands, in the order `--help` lists them.
_COMMAND_MODULES = (
    "skilld.cli._serve",
    "skilld.cli._build",
    "skilld.cli._call",
    "skilld.cli._delegate",
    "skilld.cli._skill",
    "skilld.cli._skills",
    "skilld.cli._package",
    "skilld.cli._oci",
    "skilld.cli._policy",
    "skilld.cli._cluster",
    "skilld.cli._doctor",
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="skilld",
        description="Serve signed WebAssembly skills to AI agents as MCP tools.",
        epilog="Run 'skilld COMMAND --help' for the options of one command.",
    )
    parser.add_argument("--version", action="version", version=f"skilld {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue  # a command group not built yet
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``skilld`` command line; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return handler(args)
    except UsageError as exc:
        print(f"skilld: error: {exc}", file=sys.stderr)
        return 2
    except SkilldError as exc:
        print(f"skilld: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
