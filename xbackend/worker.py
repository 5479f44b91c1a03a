"""Worker process: one backend configuration, one build, N runs.

Started by xbackend.isolation as ``python -m xbackend.worker JOB.json``. It keeps
only the first run's capture in memory and compares each later run to it as it
arrives, so memory does not grow with the number of runs. Progress goes to
stdout as tagged lines; the outcome goes to the result JSON named in the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from xbackend.capture import capture_sha256, save_capture
from xbackend.errors import BackendUnavailableError, XbackendError
from xbackend.metrics import TensorDiff, keep_worse
from xbackend.model import ModelRef
from xbackend.protocol import PROGRESS_TAG
from xbackend.runners.base import Runner


class RunTracker:
    """Keeps run 0's capture; folds each later run into worst-per-tensor diffs and hashes."""

    def __init__(self, outputs: Sequence[str], op_types: Mapping[str, str]) -> None:
        self.outputs = list(outputs)
        self.op_types = dict(op_types)
        self.first: dict[str, np.ndarray] | None = None
        self.names: list[str] = []
        self.worst: dict[str, TensorDiff] = {}
        self.output_hashes: list[str] = []
        self.capture_hashes: list[str] = []

    def add(self, capture: dict[str, np.ndarray]) -> None:
        outs = [n for n in self.outputs if n in capture]
        self.output_hashes.append(capture_sha256(outs, capture))
        if self.first is None:
            self.first = capture
            self.names = list(capture)
            self.capture_hashes.append(capture_sha256(self.names, capture))
            return
        self.capture_hashes.append(capture_sha256(self.names, capture))
        for n in self.names:
            if n not in capture:
                d = TensorDiff.mismatch(n, self.op_types.get(n, ""), "missing", "absent in a later run")
            else:
                d = TensorDiff.from_arrays(n, capture[n], self.first[n], self.op_types.get(n, ""))
            keep_worse(self.worst, d)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    if isinstance(e, XbackendError):
        return text
    return f"{type(e).__name__}: {text}"[:500]


def _write_json(path: str, data: Mapping[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _load_feeds(path: str) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _runs(runner: Runner, job: Mapping[str, Any], result: dict[str, Any]) -> None:
    """The main feed set, `runs` times; each extra feed set once; captures saved to disk."""
    feeds = _load_feeds(job["feeds"])
    tracker = RunTracker(job["outputs"], job["op_types"])
    run_s = []
    for i in range(int(job["runs"])):
        t0 = time.perf_counter()
        capture = runner.run(feeds)
        run_s.append(time.perf_counter() - t0)
        tracker.add(capture)
        if i == 0:
            save_capture(job["capture"], tracker.names, capture)
            result["fingerprint"] = asdict(runner.fingerprint())
        del capture
        print(f"{PROGRESS_TAG} run", flush=True)
    extra_names = []
    for feeds_path, capture_path in job.get("extra_feeds", ()):
        capture = runner.run(_load_feeds(feeds_path))
        extra_names.append(list(capture))
        save_capture(capture_path, list(capture), capture)
        del capture
        print(f"{PROGRESS_TAG} run", flush=True)
    result.update(
        run_s=run_s,
        capture_names=tracker.names,
        extra_capture_names=extra_names,
        output_hashes=tracker.output_hashes,
        capture_hashes=tracker.capture_hashes,
        run_diffs=[asdict(d) for d in tracker.worst.values()],
    )


def execute(job: Mapping[str, Any]) -> dict[str, Any]:
    """Run the job; never raises: failures come back as status 'failed' with a reason."""
    from xbackend.runners.registry import get_runner

    result: dict[str, Any] = {"status": "failed", "stage": "load", "reason": ""}
    runner = None
    try:
        runner = get_runner(job["backend"])(job["options"])
        runner.detailed_fingerprint = bool(job.get("fingerprint", False))
        model = ModelRef.from_dict(job["model"])
        if job.get("kind") == "opt-levels":
            result["stage"] = "opt-levels"
            result["opt_levels"] = runner.optimization_levels(model, _load_feeds(job["feeds"]))
            print(f"{PROGRESS_TAG} run", flush=True)
        else:
            result["stage"] = "prepare"
            t0 = time.perf_counter()
            runner.prepare(model, job["tensors"])
            result["prepare_s"] = time.perf_counter() - t0
            result["stage"] = "run"
            _runs(runner, job, result)
        result.update(status="ok", stage="done", not_exposed=runner.not_exposed(), info=runner.info())
    except BaseException as e:  # the worker reports every failure, even KeyboardInterrupt
        if isinstance(e, BackendUnavailableError):
            result["status"] = "unavailable"
        result["reason"] = _one_line(e)
        result["error_type"] = type(e).__name__
        if runner is not None:
            with contextlib.suppress(Exception):
                result["info"] = runner.info()
    finally:
        if runner is not None:
            with contextlib.suppress(Exception):
                runner.close()
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    with open(args[0]) as f:
        job = json.load(f)
    result = execute(job)
    _write_json(job["result"], result)
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
