"""``skilld serve`` says which confinement native commands get: log line and /readyz."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from skilld import confine
from support.serve_process import ServeProcess


def test_ready_line_and_readyz_name_the_confinement_profile(
    ops_bundle: Path, tmp_path: Path
) -> None:
    """The ``ready`` log line and /readyz's body carry the active profile, the same line
    ``confine.profile().describe()`` gives in this environment."""
    server = ServeProcess(ops_bundle, tmp_path)
    try:
        ready = next(json.loads(line) for line in server.lines if '"ready"' in line)
        expected = confine.profile().describe()
        assert ready["confinement"] == expected
        with urllib.request.urlopen(f"{server.base}/readyz", timeout=10) as response:
            body = json.loads(response.read())
        assert body == {"status": "ready", "confinement": expected}
    finally:
        server.stop()
