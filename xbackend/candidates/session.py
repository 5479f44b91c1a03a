"""A whole comparison as a user asks for it: the model compared, then each --candidate against
it. This module sits above the one-model comparison (xbackend.comparison.run) and calls it for
the original and for each candidate; the quick table's candidates are started beside the
original, each in a thread of its own, and taken where the run asked for is the one started.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from xbackend.candidates.run import check_candidates, quick_options, run_candidates, started_ahead
from xbackend.comparison.request import Ran, Role, RunRequest
from xbackend.comparison.run import compare_model
from xbackend.errors import UsageError, XbackendError
from xbackend.execution.isolation import NEARLY_FULL, drop_spares, prestart
from xbackend.execution.progress import NullProgress, ProgressSink
from xbackend.files.runfolders import run_temp_folder
from xbackend.model.footprint import available_memory
from xbackend.model.load import ModelSpec, load_model
from xbackend.model.selection import with_selection
from xbackend.planning.plan import feeds_for, plan_backend
from xbackend.results import CompareOptions, Result
from xbackend.results.explanation import DECLINED, QUICK_DECLINED
from xbackend.runners.registry import runner_target

__all__ = ["CandidateRuns", "compare_with_options"]


def compare_with_options(
    model: str | os.PathLike[str],
    opts: CompareOptions,
    progress: ProgressSink | None = None,
    capture_to: str | os.PathLike[str] | None = None,
    judge_alone: bool = False,
) -> Result:
    """`model` compared as `opts` ask, each --candidate against it, in a run folder of its own
    (removed after). `capture_to`: the first backend's portable capture written to this folder
    (xbackend capture); `judge_alone`: a sweep's job, whose lone backend is judged against float64
    as a reference is (the fleet's comparison of captures keeps its judgment)."""
    check_candidates(opts)  # a missing candidate or a backend typo: exit 2 before anything runs
    bar = progress or NullProgress()
    quick = quick_options(opts)
    if quick is not None:
        opts = quick[0]
    with (
        run_temp_folder() as tmp,
        contextlib.ExitStack() as stack,
        ThreadPoolExecutor(1, thread_name_prefix="xbackend-candidate") as pool,
    ):
        stack.callback(drop_spares)  # the spare workers no batch took (the quick table's)
        work = Path(tmp)
        if _nearly_full(work):  # before any worker starts: one line, not a failure per backend
            raise UsageError(
                f"no space left on the disk that holds {work.parent} (set TMPDIR to a folder on a "
                "larger disk)"
            )
        role = Role.ORIGINAL if opts.candidates else Role.SWEEP_JOB if judge_alone else Role.ALONE
        asked = RunRequest(model, opts, work, bar, role, quick is not None, capture_to=capture_to)
        runs = CandidateRuns(quick is not None, bar)
        if quick is not None and capture_to is None and not judge_alone:
            asked = runs.start_ahead(asked, pool)
        original = compare_model(asked)
        del asked  # the original's proto goes once it is planned
        if not opts.candidates:
            return original.result
        result = replace(original.result, candidates=run_candidates(original, opts, work, runs))
        if quick is not None:  # what it left out, said as the quick table's, not as a flag's
            said = tuple(
                replace(candidate, explanation=replace(candidate.explanation, reason=QUICK_DECLINED))
                if candidate.explanation.reason == DECLINED
                else candidate
                for candidate in result.candidates
            )
            result = replace(result, notes=(*result.notes, quick[1]), quick_table=quick[1], candidates=said)
        return result


@dataclass(frozen=True)
class _Ahead:
    """A candidate's comparison started beside the original's: the request it was started with."""

    request: RunRequest
    ran: Future[Ran]


class CandidateRuns:
    """The candidates' comparisons: each one asked for runs here, or is the one started ahead
    (the quick table's) when that was started with the same request."""

    def __init__(self, quick: bool, progress: ProgressSink) -> None:
        self.quick = quick
        self.progress = progress
        self._ahead: dict[Path, _Ahead] = {}

    def run(self, request: RunRequest) -> Ran:
        """`request` compared (a candidate's, or the original's at a candidate's step); its
        progress and quick mode are the session's."""
        request = replace(request, progress=self.progress, quick=self.quick)
        early = self._ahead.pop(request.work, None)
        if early is not None:
            if _same_run(early.request, request):
                return early.ran.result()
            early.ran.exception()  # another run than the one asked for: finished, then set aside
        request.work.mkdir(parents=True, exist_ok=True)
        return compare_model(request)

    def start_ahead(self, original: RunRequest, pool: ThreadPoolExecutor) -> RunRequest:
        """The quick table's candidates started beside the original (each its own worker), fed
        the original's feeds, made here once; the original's request with those feeds and its
        model as read. Where the models do not fit in memory side by side, or anything about them
        is amiss (said by the run that follows), nothing is started."""
        opts, work = original.options, original.work
        _prestart(opts, work)
        read: tuple[ModelSpec, onnx.ModelProto]
        try:
            read = load_model(original.model)
            feeds, expected = feeds_for(with_selection(read[0], opts.tensors), opts, ())
            ahead = started_ahead(opts, work, feeds)
            sizes = read[0].weight_bytes + sum(r.read[0].weight_bytes for r in ahead if r.read)
        except Exception:
            return original
        room = available_memory()
        if expected is not None or room is None or 8 * sizes > room:
            return original
        for request in ahead:
            request.work.mkdir(parents=True, exist_ok=True)
            _prestart(request.options, request.work)
            quiet = replace(request, progress=NullProgress(), quick=True)
            self._ahead[request.work] = _Ahead(quiet, pool.submit(compare_model, quiet))
        return replace(original, feeds=feeds, read=read)


def _same_run(started: RunRequest, asked: RunRequest) -> bool:
    """The run started ahead is the one asked for: the same model, options and feeds."""
    if asked.against is not None or asked.feeds is None or started.feeds is None:
        return False
    same = (str(started.model), started.options) == (str(asked.model), asked.options)
    return same and started.feeds.sha256 == asked.feeds.sha256


def _prestart(opts: CompareOptions, work: Path) -> None:
    """A worker for each engine of `opts` started now, for the first batch under `work`: its
    interpreter and engine load while this process reads the models and plans."""
    for name in opts.backends:
        try:
            planned = plan_backend(name, opts, work, None)
        except XbackendError:  # said by the run that follows
            continue
        if planned.cls is not None and planned.interpreter is None:
            env = planned.cls.process_env(planned.cls.resolve_options(dict(planned.variant())))
            prestart(env, runner_target(name), work)


def _nearly_full(folder: Path) -> bool:
    """The filesystem itself, asked directly (what planning reads through shutil may be a
    smaller budget than the disk)."""
    try:
        stat = os.statvfs(folder)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize < NEARLY_FULL
