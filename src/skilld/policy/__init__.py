"""The policy language and its compiler: ``policies/*.yaml`` → permission tables.

Operators write one YAML document per skill (``policies/<skill-id>.yaml``) plus
optional ``policies/defaults.yaml``; the language is documented in
``docs/policy.md``. :func:`compile_policies` parses them (errors carry
``file:line``), intersects each skill's grants with its declared needs and
returns frozen :class:`Tables` (identity: :attr:`Tables.digest`), which
:func:`load_tables` reads back. The checks that consult the tables live in
``skilld.permissions``.
"""

from __future__ import annotations

from skilld.policy._compile import (
    CompileResult,
    Finding,
    compile_documents,
    compile_policies,
    source_as_given,
)
from skilld.policy._kits import (
    D_LEVELS,
    RUNNER,
    RUNNER_METHOD,
    W_LEVELS,
    check_kit_methods,
    grade_of,
    kit_runner_id,
)
from skilld.policy._schema import (
    CAPABILITY_SECTIONS,
    HTTP_METHODS,
    Exposure,
    instances_text,
    parse_grants,
)
from skilld.policy._tables import FORMAT, Tables, load_tables
from skilld.policy._yaml import LMap, load_yaml

__all__ = [
    "CAPABILITY_SECTIONS",
    "D_LEVELS",
    "FORMAT",
    "HTTP_METHODS",
    "RUNNER",
    "RUNNER_METHOD",
    "W_LEVELS",
    "CompileResult",
    "Exposure",
    "Finding",
    "LMap",
    "Tables",
    "check_kit_methods",
    "compile_documents",
    "compile_policies",
    "grade_of",
    "instances_text",
    "kit_runner_id",
    "load_tables",
    "load_yaml",
    "parse_grants",
    "source_as_given",
]
