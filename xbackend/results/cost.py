"""The cost of determinism: each mode of one runner, what it promised, what held, what it costs.

A family is every instance of one runner in a comparison (`torch-compile-autotune`,
`torch-compile-autotune@det`, ...). Its default is the instance under the runner's own name
(else the first listed); each other instance's mode is the options it sets otherwise. Latency
ratios are medians over the same runs whose bits were compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xbackend.results.backend import BackendResult, BackendStatus, Latency
from xbackend.results.promises import PromiseCheck

__all__ = ["Family", "ModeRow", "families"]


@dataclass(frozen=True)
class ModeRow:
    """One instance of the family: its mode, its promises as observed, its latency."""

    backend: str
    mode: str  # "default", or the options it sets otherwise ("deterministic=True")
    status: BackendStatus
    distinct_run_outputs: int
    distinct_build_outputs: int
    runs: int
    builds: int
    held: tuple[str, ...]
    broken: tuple[str, ...]
    unchecked: tuple[str, ...]
    latency: Latency | None
    ratio: float | None  # median latency / the default's; None where either was not timed

    @property
    def promised(self) -> tuple[str, ...]:
        """Every promise the mode declares: held, broken, then unchecked."""
        return (*self.held, *self.broken, *self.unchecked)

    def promise_states(self) -> tuple[tuple[str, str], ...]:
        """Each promise the mode declares with what the runs made of it: held, BROKEN, unchecked."""
        return (
            *((name, "held") for name in self.held),
            *((name, "BROKEN") for name in self.broken),
            *((name, "unchecked") for name in self.unchecked),
        )

    def promise_words(self) -> str:
        """The promises in plain words ('none' where there are none)."""
        return ", ".join(f"{name} {state}" for name, state in self.promise_states()) or "none"

    def to_json(self, times: bool) -> dict[str, object]:
        """The row as the JSON report holds it (latency only with `times`)."""
        return {
            "backend": self.backend,
            "mode": self.mode,
            "status": self.status,
            "distinct_run_outputs": self.distinct_run_outputs,
            "distinct_build_outputs": self.distinct_build_outputs,
            "runs": self.runs,
            "builds": self.builds,
            "promises_held": list(self.held),
            "promises_broken": list(self.broken),
            "promises_unchecked": list(self.unchecked),
            "latency": self.latency.to_json() if times and self.latency else None,
            "latency_ratio": self.ratio if times else None,
        }


@dataclass(frozen=True)
class Family:
    runner: str
    default: str  # the backend every ratio is against
    rows: tuple[ModeRow, ...]

    def to_json(self, times: bool) -> dict[str, object]:
        """The runner's modes as the JSON report holds them (latency only with `times`)."""
        return {
            "runner": self.runner,
            "default": self.default,
            "modes": [row.to_json(times) for row in self.rows],
        }


def families(backends: Sequence[BackendResult], checks: Sequence[PromiseCheck]) -> list[Family]:
    """Each runner that ran under two or more instances here (captures loaded from elsewhere
    left out: their times are another host's), in the order first listed."""
    groups: dict[str, list[BackendResult]] = {}
    for backend in backends:
        if not backend.loaded_from:
            groups.setdefault(backend.name.partition("@")[0], []).append(backend)
    return [_family(runner, members, checks) for runner, members in groups.items() if len(members) >= 2]


def _family(runner: str, members: Sequence[BackendResult], checks: Sequence[PromiseCheck]) -> Family:
    default = next((member for member in members if member.name == runner), members[0])
    base = dict(default.options)
    rows = []
    for b in members:
        mine = [check for check in checks if check.backend == b.name]
        set_here = [f"{k}={v}" for k, v in b.options if base.get(k) != v]
        unset = [f"{k} unset" for k in base if k not in dict(b.options)]
        mode = "default" if b is default else ", ".join(set_here + unset) or "same options"
        ratio = None
        if b.latency is not None and default.latency is not None and default.latency.median_ms > 0:
            ratio = b.latency.median_ms / default.latency.median_ms
        rows.append(
            ModeRow(
                b.name,
                mode,
                b.status,
                b.distinct_run_outputs,
                b.distinct_build_outputs,
                b.runs,
                b.builds,
                tuple(check.name for check in mine if check.status == "held"),
                tuple(check.name for check in mine if check.status == "broken"),
                tuple(check.name for check in mine if check.status == "unchecked"),
                b.latency,
                ratio,
            )
        )
    return Family(runner, default.name, tuple(rows))
