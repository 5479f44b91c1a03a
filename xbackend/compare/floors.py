"""The severed model's feeds: the reference's captured values under severed names, read one
at a time from its capture (the floor's arithmetic is xbackend.numerics.spread's, in the worker)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from xbackend.files.run_values import CaptureFile
from xbackend.files.storage import save_values
from xbackend.model.sever import SEVERED
from xbackend.numerics.values import Value

__all__ = ["SeveredFeeds", "save_severed_feeds"]


class SeveredFeeds(Mapping[str, Value]):
    """The feeds plus the reference's captured values under severed names, read one at a time
    (and `extra` values: a permuted model's index inputs)."""

    def __init__(
        self,
        feeds: Mapping[str, Value],
        cap: CaptureFile,
        severed: Sequence[str],
        extra: Mapping[str, Value] | None = None,
    ) -> None:
        self.feeds = feeds
        self.cap = cap
        self.severed = {SEVERED + n: n for n in severed}
        self.extra = dict(extra or {})

    def __getitem__(self, key: str) -> Value:
        if key in self.extra:
            return self.extra[key]
        return self.cap[self.severed[key]] if key in self.severed else self.feeds[key]

    def __iter__(self) -> Iterator[str]:
        yield from self.extra
        yield from self.feeds
        yield from self.severed

    def __len__(self) -> int:
        return len(self.extra) + len(self.feeds) + len(self.severed)


def save_severed_feeds(
    path: Path,
    feeds: Mapping[str, Value],
    ref_capture: str,
    severed: Sequence[str],
    extra: Mapping[str, Value] | None = None,
) -> None:
    """Write a severed model's feeds to `path`: the model's feeds, the reference's captured
    values of `severed` under severed names (streamed from its capture), and `extra`."""
    with CaptureFile(ref_capture) as cap:
        save_values(path, SeveredFeeds(feeds, cap, severed, extra))
