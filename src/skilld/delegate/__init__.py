"""delegate: an agent states an intent, skilld writes a tiny program over a kit, checks it, runs it.

- kits are compiled with the policy (``skilld.policy._kits``) and read back here
  (:mod:`._kits`), each with a Grade(w, d) from its tools' compiled grants;
- :mod:`._infer` turns an intent into a program: templates, keyword rules, Ollama,
  Anthropic, in that order, with validate-and-retry;
- :mod:`._validate` refuses anything outside the language, with line and column;
- :mod:`._service` runs a program as a registry call of the kit's runner entry (the
  CPython runner component, ``sandbox/pyrunner``), gating and tracing each tool
  call, and serves it all to the CLI and, through the registry, to MCP.

docs/delegate.md is the user's guide.
"""

from skilld.delegate._infer import InferenceConfig, parse_params
from skilld.delegate._kits import Grade, Kit, KitTool, load_kits
from skilld.delegate._service import (
    SKILL_ID,
    DelegateBackend,
    DelegateService,
    KitRunner,
    TraceEntry,
    register,
)
from skilld.delegate._validate import BUILTINS, METHODS, Problem, check_program, validate

__all__ = [
    "BUILTINS",
    "METHODS",
    "SKILL_ID",
    "DelegateBackend",
    "DelegateService",
    "Grade",
    "InferenceConfig",
    "Kit",
    "KitRunner",
    "KitTool",
    "Problem",
    "TraceEntry",
    "check_program",
    "load_kits",
    "parse_params",
    "register",
    "validate",
]
