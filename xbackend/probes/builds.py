"""Build variance: did fresh builds of one backend decide the same thing, layer by layer?

Needs no jobs of its own: it reads the fingerprints of the main builds (`--builds K`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xbackend.probes.base import BackendRuns, Probe
from xbackend.results.findings import Finding, Label
from xbackend.results.probe import ProbeResult
from xbackend.results.sections import Block, Cell, Paragraph, Section, Table, TensorName, yes_no
from xbackend.runners.base import BuildFingerprint

__all__ = ["BuildVariance", "BuildsProbe", "BuildsResult"]


@dataclass(frozen=True)
class BuildVariance:
    """Whether fresh builds of one backend decided the same thing, layer by layer."""

    backend: str
    builds: int
    distinct_fingerprints: int
    varying_layers: tuple[tuple[str, tuple[str, ...]], ...]  # layer, its implementation in each build
    outputs_differ: bool

    @property
    def builds_vary(self) -> bool:
        """Whether the builds' fingerprints differ (the engine decided otherwise)."""
        return self.distinct_fingerprints > 1

    @classmethod
    def from_fingerprints(
        cls, backend: str, fingerprints: Sequence[BuildFingerprint], outputs_differ: bool
    ) -> BuildVariance:
        """The variance of `backend`'s builds: their distinct fingerprints and each layer that differs
        between them."""
        digests = {fp.digest for fp in fingerprints}
        layers = [dict(fp.layers) for fp in fingerprints]
        keys = sorted(set().union(*layers)) if layers else []
        varying = tuple(
            (key, tuple(lay.get(key, "(absent)") for lay in layers))
            for key in keys
            if len({lay.get(key, "(absent)") for lay in layers}) > 1
        )
        return cls(backend, len(fingerprints), len(digests), varying, outputs_differ)


@dataclass(frozen=True)
class BuildsResult(ProbeResult):
    name = "builds"
    backends: tuple[BuildVariance, ...] = ()

    def build_variance(self) -> list[str]:
        return [finding.sentence for finding in self.findings()]

    def findings(self, modules: Mapping[str, str] | None = None) -> list[Finding]:
        return [
            self.finding(
                Label.WARN,
                f"{backend.backend} builds vary: {backend.distinct_fingerprints} distinct engines in "
                f"{backend.builds} builds ({len(backend.varying_layers)} layers differ); outputs "
                f"{'differ' if backend.outputs_differ else 'identical'}",
                backend.backend,
            )
            for backend in self.backends
            if backend.builds_vary
        ]

    def section(self, modules: Mapping[str, str] | None = None) -> Section | None:
        if not self.backends:
            return None
        rows: list[list[Cell]] = [
            [
                backend.backend,
                backend.builds,
                backend.distinct_fingerprints,
                yes_no(not backend.builds_vary),
                yes_no(not backend.outputs_differ),
            ]
            for backend in self.backends
        ]
        blocks: list[Block] = [
            Paragraph.of(
                "Each build is a fresh process; its fingerprint is what the engine decided (graph, kernels)."
            ),
            Table.of(["backend", "builds", "distinct engines", "same engine", "same outputs"], rows),
        ]
        for backend in self.backends:
            if backend.varying_layers:
                blocks += [
                    Paragraph.of(f"Layers whose implementation differs between builds of {backend.backend}:"),
                    Table.of(
                        ["layer", *[f"build {i}" for i in range(backend.builds)]],
                        [[TensorName(layer), *choices] for layer, choices in backend.varying_layers[:200]],
                    ),
                ]
        return Section("Build variance", tuple(blocks))

    def to_json(self) -> Any:
        return [
            {
                "backend": backend.backend,
                "builds": backend.builds,
                "distinct_fingerprints": backend.distinct_fingerprints,
                "builds_vary": backend.builds_vary,
                "outputs_differ": backend.outputs_differ,
                "varying_layers": [
                    {"layer": k, "implementations": list(v)} for k, v in backend.varying_layers
                ],
            }
            for backend in self.backends
        ]


class BuildsProbe(Probe):
    name = "builds"
    always = True
    help = "with --builds K >= 2: fingerprints every build and names the layers whose implementation differs"

    def analyze(self, runs: Sequence[BackendRuns]) -> BuildsResult:
        out = []
        for run in runs:
            if not run.result.ok or len(run.builds) < 2:
                continue
            fps = [build.outputs.fingerprint for build in run.builds]
            out.append(
                BuildVariance.from_fingerprints(run.planned.name, fps, run.result.distinct_build_outputs > 1)
            )
        return BuildsResult(tuple(out))
