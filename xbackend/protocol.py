"""What a worker process prints for the parent: one tagged line per finished run."""

from __future__ import annotations

__all__ = ["PROGRESS_TAG"]

PROGRESS_TAG = "xbackend-progress"
