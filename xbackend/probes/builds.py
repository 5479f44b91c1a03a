"""Build variance: did fresh builds of one backend decide the same thing, layer by layer?

Needs no jobs of its own: it reads the fingerprints of the main builds (`--builds K`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xbackend.files.textfmt import table, with_module, yes
from xbackend.probes.base import BackendRuns, Probe
from xbackend.results.findings import Finding, Label
from xbackend.results.probe import ProbeResult
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
        return self.distinct_fingerprints > 1

    @classmethod
    def from_fingerprints(
        cls, backend: str, fingerprints: Sequence[BuildFingerprint], outputs_differ: bool
    ) -> BuildVariance:
        digests = {fp.digest for fp in fingerprints}
        layers = [dict(fp.layers) for fp in fingerprints]
        keys = sorted(set().union(*layers)) if layers else []
        varying = tuple(
            (k, tuple(lay.get(k, "(absent)") for lay in layers))
            for k in keys
            if len({lay.get(k, "(absent)") for lay in layers}) > 1
        )
        return cls(backend, len(fingerprints), len(digests), varying, outputs_differ)


@dataclass(frozen=True)
class BuildsResult(ProbeResult):
    name = "builds"
    backends: tuple[BuildVariance, ...] = ()

    def build_variance(self) -> list[str]:
        return [f.sentence for f in self.findings()]

    def findings(self, modules: Mapping[str, str] | None = None) -> list[Finding]:
        return [
            self.finding(
                Label.WARN,
                f"{b.backend} builds vary: {b.distinct_fingerprints} distinct engines in "
                f"{b.builds} builds ({len(b.varying_layers)} layers differ); outputs "
                f"{'differ' if b.outputs_differ else 'identical'}",
                b.backend,
            )
            for b in self.backends
            if b.builds_vary
        ]

    def markdown(self, modules: Mapping[str, str] | None = None) -> list[str]:
        if not self.backends:
            return []
        rows = [
            [b.backend, b.builds, b.distinct_fingerprints, yes(not b.builds_vary), yes(not b.outputs_differ)]
            for b in self.backends
        ]
        out = [
            "### Build variance",
            "",
            "Each build is a fresh process; its fingerprint is what the engine decided (graph, kernels).",
            "",
            *table(["backend", "builds", "distinct engines", "same engine", "same outputs"], rows),
        ]
        for b in self.backends:
            if b.varying_layers:
                out += [
                    f"Layers whose implementation differs between builds of {b.backend}:",
                    "",
                    *table(
                        ["layer", *[f"build {i}" for i in range(b.builds)]],
                        [[with_module(k, modules or {}), *v] for k, v in b.varying_layers[:200]],
                    ),
                ]
        return out

    def to_json(self) -> Any:
        return [
            {
                "backend": b.backend,
                "builds": b.builds,
                "distinct_fingerprints": b.distinct_fingerprints,
                "builds_vary": b.builds_vary,
                "outputs_differ": b.outputs_differ,
                "varying_layers": [{"layer": k, "implementations": list(v)} for k, v in b.varying_layers],
            }
            for b in self.backends
        ]


class BuildsProbe(Probe):
    name = "builds"
    always = True
    help = "with --builds K >= 2: fingerprints every build and names the layers whose implementation differs"

    def analyze(self, runs: Sequence[BackendRuns]) -> BuildsResult:
        out = []
        for r in runs:
            if not r.result.ok or len(r.builds) < 2:
                continue
            fps = [o.outputs.fingerprint for o in r.builds]
            out.append(
                BuildVariance.from_fingerprints(r.planned.name, fps, r.result.distinct_build_outputs > 1)
            )
        return BuildsResult(tuple(out))
