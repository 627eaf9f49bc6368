"""Counters and a latency histogram per skill, exposed in the Prometheus text format.

Written by hand (the format is small and stable) so that the appliance carries no
metrics library. Updated from the event loop and read by ``/metrics``; a lock keeps
a scrape consistent when a call finishes at the same moment.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

# Upper bounds in seconds: a guest call takes from well under a millisecond to its deadline.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class _Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    total: float = 0.0
    n: int = 0

    def observe(self, seconds: float) -> None:
        index = bisect.bisect_left(BUCKETS, seconds)
        if index < len(BUCKETS):
            self.counts[index] += 1
        self.total += seconds
        self.n += 1


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: str) -> str:
    inner = ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items())
    return "{" + inner + "}"


class Metrics:
    """What ``/metrics`` reports: calls, errors, denials, busy refusals and latency."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[tuple[str, str, str], int] = defaultdict(int)
        self._denials: dict[tuple[str, str], int] = defaultdict(int)
        self._latency: dict[str, _Histogram] = defaultdict(_Histogram)
        self._in_flight = 0
        self._http_rejections: dict[int, int] = defaultdict(int)
        self._write_timeouts = 0
        self._responses_dropped = 0

    def started(self) -> None:
        """A call entered a skill."""
        with self._lock:
            self._in_flight += 1

    def finished(self, skill: str, tool: str, outcome: str, seconds: float) -> None:
        """A call left a skill with ``outcome`` (``ok`` or an error code)."""
        with self._lock:
            self._in_flight -= 1
            self._calls[(skill, tool, outcome)] += 1
            self._latency[skill].observe(seconds)

    def refused(self, skill: str, tool: str, outcome: str) -> None:
        """A call was refused before it reached the skill (bad arguments, busy, draining)."""
        with self._lock:
            self._calls[(skill, tool, outcome)] += 1

    def denied(self, skill: str, rule: str) -> None:
        """A permission check refused an action of ``skill`` under ``rule``."""
        with self._lock:
            self._denials[(skill, rule)] += 1

    def http_rejected(self, status: int) -> None:
        """The HTTP front door refused a request with ``status``."""
        with self._lock:
            self._http_rejections[status] += 1

    def write_timed_out(self) -> None:
        """A connection was dropped because its client did not read its response."""
        with self._lock:
            self._write_timeouts += 1

    def response_dropped(self) -> None:
        """A response was dropped: its caller had too many bytes waiting to be written."""
        with self._lock:
            self._responses_dropped += 1

    def render(self) -> str:
        """The Prometheus text exposition (format 0.0.4)."""
        out: list[str] = []
        with self._lock:
            out += [
                "# HELP skilld_tool_calls_total Tool calls by skill, tool and outcome.",
                "# TYPE skilld_tool_calls_total counter",
            ]
            for (skill, tool, outcome), n in sorted(self._calls.items()):
                out.append(
                    f"skilld_tool_calls_total{_labels(skill=skill, tool=tool, outcome=outcome)} {n}"
                )
            out += [
                "# HELP skilld_tool_errors_total Tool calls that did not succeed, by skill.",
                "# TYPE skilld_tool_errors_total counter",
            ]
            errors: dict[str, int] = defaultdict(int)
            for (skill, _tool, outcome), n in self._calls.items():
                if outcome != "ok":
                    errors[skill] += n
            for skill, n in sorted(errors.items()):
                out.append(f"skilld_tool_errors_total{_labels(skill=skill)} {n}")
            out += [
                "# HELP skilld_permission_denials_total Permission denials by skill and rule.",
                "# TYPE skilld_permission_denials_total counter",
            ]
            for (skill, rule), n in sorted(self._denials.items()):
                out.append(f"skilld_permission_denials_total{_labels(skill=skill, rule=rule)} {n}")
            out += [
                "# HELP skilld_tool_call_seconds Wall time of tool calls inside skills.",
                "# TYPE skilld_tool_call_seconds histogram",
            ]
            for skill, hist in sorted(self._latency.items()):
                cumulative = 0
                for bound, count in zip(BUCKETS, hist.counts, strict=True):
                    cumulative += count
                    le = _labels(skill=skill, le=repr(bound))
                    out.append(f"skilld_tool_call_seconds_bucket{le} {cumulative}")
                out.append(
                    f"skilld_tool_call_seconds_bucket{_labels(skill=skill, le='+Inf')} {hist.n}"
                )
                out.append(f"skilld_tool_call_seconds_sum{_labels(skill=skill)} {hist.total!r}")
                out.append(f"skilld_tool_call_seconds_count{_labels(skill=skill)} {hist.n}")
            out += [
                "# HELP skilld_tool_calls_in_flight Tool calls running now.",
                "# TYPE skilld_tool_calls_in_flight gauge",
                f"skilld_tool_calls_in_flight {self._in_flight}",
                "# HELP skilld_http_rejections_total HTTP requests refused at the front door.",
                "# TYPE skilld_http_rejections_total counter",
            ]
            for status, n in sorted(self._http_rejections.items()):
                out.append(f"skilld_http_rejections_total{_labels(status=str(status))} {n}")
            out += [
                "# HELP skilld_http_write_timeouts_total Connections dropped: the client did "
                "not read a response within the write timeout.",
                "# TYPE skilld_http_write_timeouts_total counter",
                f"skilld_http_write_timeouts_total {self._write_timeouts}",
                "# HELP skilld_http_responses_dropped_total Responses dropped unwritten: their "
                "caller had max_response_bytes_per_caller waiting to be written.",
                "# TYPE skilld_http_responses_dropped_total counter",
                f"skilld_http_responses_dropped_total {self._responses_dropped}",
            ]
        return "\n".join(out) + "\n"


@runtime_checkable
class Gauges(Protocol):
    """A dispatcher that reports gauges of its own (``Registry.gauges``)."""

    def gauges(self) -> dict[str, tuple[str, float]]:
        """Each gauge's name: (help text, value)."""
        ...


def render_gauges(dispatcher: object) -> str:
    """The gauges a dispatcher reports besides the server's own (``Registry.gauges``:
    a cluster's nodes, connection and routed calls), in the text format."""
    if not isinstance(dispatcher, Gauges):
        return ""
    out: list[str] = []
    for name, (help_text, value) in sorted(dispatcher.gauges().items()):
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value!r}"]
    return "\n".join(out) + "\n" if out else ""
