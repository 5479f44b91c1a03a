"""Backends, found by name in one registry (built-ins plus the `xbackend.runners` entry points)."""

from __future__ import annotations

from xbackend.runners.base import Availability, BuildFingerprint, OptionSpec, Runner
from xbackend.runners.registry import RunnerEntry, get_runner, list_runners, runner_names

__all__ = [
    "Availability",
    "BuildFingerprint",
    "OptionSpec",
    "Runner",
    "RunnerEntry",
    "get_runner",
    "list_runners",
    "runner_names",
]
