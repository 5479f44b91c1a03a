"""What a probe found: the interface every probe's result implements, and a probe that failed.

Each probe module defines its result as a frozen dataclass subclassing ProbeResult; defining
it registers it with the codec, so a JSON report can name it (and only it) to be rebuilt.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from xbackend.files.codec import register_subclass
from xbackend.results.findings import Finding, Kind, Label
from xbackend.results.sections import Paragraph, Said, Section

__all__ = ["FailedProbe", "ProbeResult", "PromiseEvidence", "PromiseStatus"]

PromiseStatus = Literal["held", "broken", "unchecked"]
# A promise as a probe observed it: (its status, evidence, first layer)
PromiseEvidence = tuple[PromiseStatus, str, str]


class ProbeResult(abc.ABC):
    """What a probe found; frozen dataclasses in each probe module implement it."""

    name: ClassVar[str]
    # Determinism properties (xbackend.results.promises.PROPERTIES) this probe's measurements check.
    measures: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register_subclass(ProbeResult, cls)

    @abc.abstractmethod
    def findings(self, modules: Mapping[str, str] | None = None) -> list[Finding]:
        """What the probe found: warnings (and every probe job that failed), then notes, each a
        Finding whose `probe` is this probe's name. `modules` maps tensors to their source
        module, to name them as `tensor (module)`."""

    def finding(
        self, label: Label, sentence: str, backend: str = "", kind: Kind = Kind.PROBE, **rest: Any
    ) -> Finding:
        """One of this probe's findings."""
        return Finding(label, kind, sentence, backend=backend, probe=self.name, **rest)

    @abc.abstractmethod
    def section(self, modules: Mapping[str, str] | None = None) -> Section | None:
        """The probe's section of the report as data (None when there is nothing to show); the
        report renders it. `modules`: each tensor's source module, for cells naming tensors."""

    @abc.abstractmethod
    def to_json(self) -> Any:
        """The probe's part of the JSON report."""

    def build_times(self) -> list[tuple[str, tuple[float, ...]]]:
        """(what was built, each build's wall seconds) for the report's build times (--timings);
        none for probes whose builds are not the point."""
        return []

    def build_variance(self) -> list[str]:
        """Findings that fresh builds differ (the build-variance gate reads them); none by default."""
        return []

    def promise(self, prop: str, backend: str) -> PromiseEvidence:
        """Property `prop` (one of `measures`) of `backend`, as this probe measured it."""
        return "unchecked", f"the {self.name} probe does not measure {prop}", ""


@dataclass(frozen=True)
class FailedProbe(ProbeResult):
    """A probe that raised while planning or analyzing: a warning, never a silent pass."""

    codec_tag: ClassVar[str] = "_FailedProbe"  # the name JSON reports have always carried
    probe: str
    reason: str

    @property
    def name(self) -> str:  # type: ignore[override]
        """The probe that failed."""
        return self.probe

    def findings(self, modules: Mapping[str, str] | None = None) -> list[Finding]:
        return [self.finding(Label.WARN, f"probe {self.probe} failed: {self.reason}", kind=Kind.PROBE_FAILED)]

    def section(self, modules: Mapping[str, str] | None = None) -> Section | None:
        return Section(f"Probe {self.probe}", (Paragraph.of("Failed: ", Said(self.reason), "."),))

    def to_json(self) -> Any:
        return {"status": "failed", "reason": self.reason}
