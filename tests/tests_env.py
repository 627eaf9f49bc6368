"""Environment for subprocesses the tests start: the same caches as this run."""

from __future__ import annotations

from conftest import cache_dir


def cache_env() -> dict[str, str]:
    """SKILLD_CACHE pointing at this run's build and native-code cache."""
    return {"SKILLD_CACHE": str(cache_dir())}
