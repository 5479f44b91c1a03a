"""Figures beside the Markdown report: PNGs drawn with matplotlib's Agg canvas (no display, no
pyplot state), from the Result alone, so `xbackend report` redraws the same bytes.

Each PNG records the series it draws (name and colour) in its "Description" text chunk.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xbackend.files.runfolders import run_temp_folder
from xbackend.files.textfmt import visible
from xbackend.numerics.metrics import TensorDiff
from xbackend.numerics.values import value_name
from xbackend.results import CrossBackendResult, ModeRow, Result

__all__ = ["COLORS", "FIXED_SLUGS", "Figure", "planned_figures", "render"]

# every figure's file name part but the cost figures' (cost-RUNNER)
FIXED_SLUGS = (
    "decode-margins",
    "error-depth",
    "ulp-distribution",
    "batch-invariance",
    "build-variance",
    "candidate-sqnr",
)

COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
BINS = (
    (0.0, 0.0, "0"),
    (0.0, 1.0, "(0,1]"),
    (1.0, 4.0, "(1,4]"),
    (4.0, 16.0, "(4,16]"),
    (16.0, 64.0, "(16,64]"),
    (64.0, 256.0, "(64,256]"),
    (256.0, math.inf, ">256"),
)


@dataclass(frozen=True)
class Series:
    name: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    spread: tuple[tuple[float, float], ...] = ()  # bars: (low, high) per bar, drawn as error bars


@dataclass(frozen=True)
class Figure:
    slug: str  # file name part: STEM.SLUG.png
    title: str
    caption: str
    xlabel: str
    ylabel: str
    series: tuple[Series, ...]
    kind: str = "line"  # "line" | "log" (a log y axis) | "bars" (x holds bin indexes)
    xticks: tuple[str, ...] = ()
    band: Series | None = None  # drawn as a shaded band from 0 (the noise floor)
    # line figures: (x position, name) ticks, thinned to fit, in place of bare indexes
    names: tuple[tuple[float, str], ...] = ()
    # a second panel under the first, sharing its x axis: each node's own error over its allowance
    lower: tuple[Series, ...] = ()
    lower_label: str = ""


def _points(
    tensors: Sequence[TensorDiff], rank: Mapping[str, int]
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(position in the model's order, scaled ULP): backends that expose different tensors (torch
    maps only module outputs) still line up by layer."""
    pts = sorted(
        (float(rank.get(value_name(tensor.name), len(rank))), float(tensor.scaled_ulp))
        for tensor in tensors
        if tensor.scaled_ulp is not None and math.isfinite(tensor.scaled_ulp)
    )
    return tuple(x for x, _ in pts), tuple(y for _, y in pts)


def _rank(result: Result) -> dict[str, int]:
    return {n: index for index, n in enumerate(result.model.tensor_order())}


def _depth_series(crosses: Sequence[CrossBackendResult], rank: Mapping[str, int]) -> tuple[Series, ...]:
    out = []
    for cross in crosses:
        if cross.status != "ok" or not cross.tensors:
            continue
        x, y = _points(cross.tensors, rank)
        if x:
            out.append(Series(cross.backend, x, y))
    return tuple(out[: len(COLORS)])


def _names(result: Result, xs: Sequence[float]) -> tuple[tuple[float, str], ...]:
    """Each plotted position's module (or tensor) name, at most TICKS of them evenly spread, a
    name repeated by its neighbour shown once, and the path's common head dropped."""
    order = result.model.tensor_order()
    modules = result.model.modules()
    pos = sorted({int(x) for x in xs if 0 <= x < len(order)})
    if len(pos) > TICKS:
        step = (len(pos) - 1) / (TICKS - 1)
        pos = sorted({pos[round(i * step)] for i in range(TICKS)})
    # a model's names, as every report prints them: control and bidirectional characters written out
    full = [(p, visible(modules.get(order[p]) or order[p])) for p in pos]
    parts = [name.split(".") for _, name in full]
    head = 0
    while parts and all(len(part) > head + 1 and part[head] == parts[0][head] for part in parts):
        head += 1
    out: list[tuple[float, str]] = []
    for (p, _), q in zip(full, parts, strict=True):
        tail = q[head:]
        while len(tail) > 1 and len(".".join(tail)) > 28:
            tail = tail[1:]
        name = ".".join(tail)
        name = name if len(name) <= 28 else "…" + name[-27:]
        if not out or out[-1][1] != name:
            out.append((float(p), name))
    return tuple(out)


TICKS = 12


def _ratios(result: Result, rank: Mapping[str, int], backends: Sequence[str]) -> tuple[Series, ...]:
    """Each backend's local error over its allowance, node by node (1: all that rounding allows)."""
    out = []
    for name in backends:
        le = result.explanation.local_for(name) if result.explanation.ok else None
        if le is None or le.status != "ok":
            continue
        pts = sorted(
            (float(rank[value_name(node.tensor)]), min(float(node.ratio), 10.0))
            for node in le.nodes
            if value_name(node.tensor) in rank and not node.not_judged and math.isfinite(node.ratio)
        )
        if pts:
            out.append(Series(name, tuple(x for x, _ in pts), tuple(y for _, y in pts)))
    return tuple(out)


def _error_depth(result: Result) -> Figure | None:
    rank = _rank(result)
    oracle = _depth_series(result.oracle_error, rank)
    series, against = (
        (oracle, "the float64 oracle")
        if oracle
        else (_depth_series(result.cross_backend, rank), result.reference_used)
    )
    if not series:
        return None
    ex = result.explanation
    band = None
    if ex.ok and ex.floors:
        pts = sorted((float(rank.get(t, len(rank))), f) for t, f in ex.floors)
        name = f"noise floor ({ex.samples} orders on {ex.engine})"
        band = Series(name, tuple(x for x, _ in pts), tuple(y for _, y in pts))
    shaded = (
        " The shaded band is the noise floor: how far legitimate orders of every sum move each tensor."
        if band
        else ""
    )
    lower = _ratios(result, rank, [s.name for s in series])
    below = (
        " Below: each node's own error, fed the reference's inputs, over what rounding allows it; under "
        "the line at 1 is within rounding."
        if lower
        else ""
    )
    return Figure(
        "error-depth",
        f"Error by depth, against {against}",
        f"Above: scaled ULP of every exposed tensor against {against}, in model order (symlog scale; "
        f"hollow markers at 0 are bit-equal; a gap is a tensor the backend did not expose): where error "
        f"enters and how it grows layer by layer.{shaded}{below}",
        "layer (model order)",
        "scaled ULP",
        series,
        band=band,
        names=_names(result, [x for curve in series for x in curve.x]),
        lower=lower,
        lower_label="own error / allowance",
    )


def _distribution(result: Result) -> Figure | None:
    series = []
    for cross in result.cross_backend:
        vals = [d.scaled_ulp for d in (cross.tensors or cross.output_tensors) if d.scaled_ulp is not None]
        if cross.status != "ok" or not vals:
            continue
        counts = [0] * len(BINS)
        for val in vals:
            counts[_bin(val)] += 1
        series.append(
            Series(
                cross.backend,
                tuple(float(i) for i in range(len(BINS))),
                tuple(float(count) for count in counts),
            )
        )
    if not series:
        return None
    return Figure(
        "ulp-distribution",
        f"Scaled-ULP distribution against {result.reference_used}",
        f"How many tensors fall in each scaled-ULP range against {result.reference_used}, per backend.",
        "scaled ULP",
        "tensors",
        tuple(series[: len(COLORS)]),
        "bars",
        tuple(b[2] for b in BINS),
    )


def _bin(v: float) -> int:
    if v == 0:
        return 0
    return next(i for i, (lo, hi, _) in enumerate(BINS) if i and lo < v <= hi)


def _batch(result: Result) -> Figure | None:
    rows = []
    for probe in result.probes:
        if probe.name == "batch":
            rows = list(getattr(probe, "rows", ()))
    series = []
    for row in rows:
        pts = [(float(depth), float(s)) for _, depth, _, s in row.by_depth if s is not None]
        if row.status == "ok" and pts:
            pts.sort()
            series.append(
                Series(
                    f"{row.backend} (batch {row.batch})", tuple(x for x, _ in pts), tuple(y for _, y in pts)
                )
            )
    if not series:
        return None
    return Figure(
        "batch-invariance",
        "Batch invariance: a sample alone vs inside a batch",
        "Scaled ULP between a sample run alone and the same sample inside a batch, by layer depth.",
        "layer depth",
        "scaled ULP",
        tuple(series[: len(COLORS)]),
    )


def _builds_series(result: Result) -> list[Series]:
    series = []
    rank = _rank(result)
    for backend in result.backends:
        if not backend.ok or backend.builds < 2 or not backend.build_diffs:
            continue
        x, y = _points(backend.build_diffs, rank)
        if x:
            series.append(Series(backend.name, x, y))
    return series


def _builds(result: Result) -> Figure | None:
    """Drawn only where some build differs: identical builds are one sentence (builds_unchanged)."""
    series = _builds_series(result)
    if not any(y for curve in series for y in curve.y):
        return None
    rank = _rank(result)
    return Figure(
        "build-variance",
        "Build variance per layer",
        "Largest scaled ULP between fresh builds of the same backend, per tensor in model order; "
        "0 means every build computed the same bits there.",
        "layer (model order)",
        "scaled ULP",
        tuple(series[: len(COLORS)]),
        names=_names(result, [x for curve in series for x in curve.x]) if rank else (),
    )


def builds_unchanged(result: Result) -> str:
    """The sentence that stands for the build-variance figure where no build differs ('' where
    builds were not compared, or differ)."""
    series = _builds_series(result)
    if not series or any(y for curve in series for y in curve.y):
        return ""
    names = ", ".join(s.name for s in series)
    return (
        f"*Build variance is not drawn: fresh builds of {names} computed the same bits at every "
        f"exposed tensor ({result.options.builds} builds each).*"
    )


_SLUG = re.compile(r"[^A-Za-z0-9_.+@-]")  # a runner's name as a file-name part (never a folder)


def _costs(result: Result) -> list[Figure]:
    """Per family of modes: each mode's median latency against the default's (times shown only)."""
    if not result.options.shows_times:
        return []
    out = []
    for fam in result.cost_of_determinism():
        rows = [row for row in fam.rows if row.ratio is not None]
        if len(rows) < 2:
            continue
        ticks = tuple(f"{row.backend.partition('@')[2] or 'default'}\n{_outputs_note(row)}" for row in rows)
        base = next(row for row in fam.rows if row.backend == fam.default).latency
        scale = base.median_ms if base is not None else 1.0
        series = Series(
            "median latency / default's (bars: min to max)",
            tuple(float(i) for i in range(len(rows))),
            tuple(float(row.ratio or 0.0) for row in rows),
            tuple((row.latency.min_ms / scale, row.latency.max_ms / scale) for row in rows if row.latency),
        )
        out.append(
            Figure(
                f"cost-{_SLUG.sub('_', fam.runner)}",  # one file name, whatever a report JSON names
                f"Cost of determinism: {fam.runner}",
                f"Median latency of each mode of {fam.runner} as a ratio of the default mode's "
                f"({fam.default}), with each mode's distinct outputs (runs / builds) under its name.",
                "mode",
                "latency / default",
                (series,),
                "bars",
                ticks,
            )
        )
    return out


def _outputs_note(mode_row: ModeRow) -> str:
    broken = "".join(f"\n{p} BROKEN" for p in mode_row.broken)
    return f"{mode_row.distinct_run_outputs} / {mode_row.distinct_build_outputs} outputs{broken}"


_FLOOR = 1e-9  # a logit difference of 0 on the log scale


def _decode(result: Result) -> Figure | None:
    """The reference's top-1/top-2 margin per step of one prompt beside each backend's logit
    difference from it: a token flips where a difference reaches the margin."""
    decode = result.decode
    if decode is None or not any(backend.ok for backend in decode.backends):
        return None
    prompt = decode.layers_step[1] if decode.layers_step else 0
    ref = next(
        (
            backend
            for backend in decode.backends
            if backend.backend == decode.reference and backend.ok and backend.prompts
        ),
        None,
    )
    if ref is None:
        return None
    margins = ref.prompts[prompt].margins
    series = [
        Series(f"{decode.reference}: top-1/top-2 margin", tuple(map(float, range(len(margins)))), margins)
    ]
    for backend_result in decode.backends:
        if backend_result.ok and backend_result.backend != decode.reference and backend_result.prompts:
            diffs = backend_result.prompts[prompt].logit_differences
            ys = tuple(max(diff, _FLOOR) for diff in diffs)
            series.append(
                Series(f"{backend_result.backend}: logit difference", tuple(map(float, range(len(ys)))), ys)
            )
    return Figure(
        "decode-margins",
        f"Greedy decoding, prompt {prompt}: margin against logit difference",
        f"Per step: {decode.reference}'s top-1 minus top-2 logit, and each backend's largest logit "
        "difference "
        f"from it while their tokens agree (0 drawn at {_FLOOR:g}); a token flips where a difference "
        "reaches the margin.",
        "step",
        "logit",
        tuple(series[: len(COLORS)]),
        kind="log",
    )


def _candidates(result: Result) -> Figure | None:
    """Each candidate's SQNR against the original, tensor by tensor in the original's order: where
    its precision costs signal, and where the loss compounds."""
    series = []
    for index, candidate in enumerate(result.candidates, 1):
        pts = sorted(
            (float(match.depth), float(match.sqnr_db))
            for match in candidate.matches
            if match.status == "ok"
            and match.how != "dequantized"
            and match.sqnr_db is not None
            and math.isfinite(match.sqnr_db)
        )
        if pts:
            series.append(
                Series(
                    f"candidate {index} ({candidate.precision})",
                    tuple(x for x, _ in pts),
                    tuple(y for _, y in pts),
                )
            )
    if not series:
        return None
    return Figure(
        "candidate-sqnr",
        "Release candidates: SQNR against the original by depth",
        "Per matched tensor, in the original's node order: "
        "10·log10(Σ original² / Σ (candidate - original)²). "
        "Higher is closer; a float16 conversion sits near 60-70 dB, int8 near 30-45 dB; a drop marks where "
        "signal is lost.",
        "node index (the original's order)",
        "SQNR (dB)",
        tuple(series[: len(COLORS)]),
    )


def _line(ax: Any, series: Series, color: str, hollow_zero: bool) -> None:
    """Points joined only where they are neighbours in model order (a gap: a tensor not exposed);
    zeros (bit-equal) as hollow markers, so a drop to 0 reads as equality, not a glitch."""
    xs: list[float] = []
    ys: list[float] = []
    for i, (x, y) in enumerate(zip(series.x, series.y, strict=True)):
        if i and x - series.x[i - 1] > 1:
            xs.append(math.nan)
            ys.append(math.nan)
        xs.append(x)
        ys.append(y)
    ax.plot(xs, ys, color=color, label=series.name, linewidth=1.5, marker="o", markersize=3)
    if hollow_zero:
        zx = [x for x, y in zip(series.x, series.y, strict=True) if y == 0]
        if zx:
            ax.plot(zx, [0.0] * len(zx), linestyle="none", marker="o", markersize=6, markerfacecolor="white",
                    markeredgecolor=color)  # fmt: skip


def planned_figures(result: Result) -> list[Figure]:
    """The figures this result has data for, in report order."""
    figs = [
        _decode(result),
        _error_depth(result),
        _distribution(result),
        _batch(result),
        _builds(result),
        *_costs(result),
        _candidates(result),
    ]
    return [fig for fig in figs if fig is not None]


_MPL_HOME: list[Any] = []  # matplotlib's config and font cache for this process, removed at its exit


def _matplotlib_home() -> None:
    """matplotlib keeps its config and font cache in a run folder of this process, not in
    ~/.config and ~/.cache (MPLCONFIGDIR, where the user set it, is kept)."""
    if _MPL_HOME or os.environ.get("MPLCONFIGDIR"):
        return
    _MPL_HOME.append(run_temp_folder("xbackend-mpl-"))
    os.environ["MPLCONFIGDIR"] = _MPL_HOME[0].name


def render(fig: Figure) -> bytes:
    """The figure as PNG bytes: same figure, same matplotlib, same bytes."""
    _matplotlib_home()  # before matplotlib is imported: it reads the folder once
    # heavy: matplotlib, only when figures are drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure  # heavy: matplotlib, only when figures are drawn

    mpl_figure = MplFigure(figsize=(10, 6.2 if fig.lower else 4.8), dpi=100)
    FigureCanvasAgg(mpl_figure)
    if fig.lower:
        ax, low = mpl_figure.subplots(2, 1, sharex=True, height_ratios=(2.2, 1))
    else:
        ax, low = mpl_figure.add_subplot(), None
    n = len(fig.series)
    if fig.band is not None:
        b = fig.band
        ax.fill_between(b.x, [0.0] * len(b.x), b.y, color="#bbbbbb", alpha=0.5, step="mid", label=b.name)
    for i, s in enumerate(fig.series):
        color = COLORS[i]
        if fig.kind == "bars":
            width = 0.8 / max(1, n)
            xs = [x - 0.4 + width * (i + 0.5) for x in s.x]
            ax.bar(xs, s.y, width, color=color, label=s.name)
            if s.spread:
                below = [y - lo for y, (lo, _) in zip(s.y, s.spread, strict=True)]
                above = [hi - y for y, (_, hi) in zip(s.y, s.spread, strict=True)]
                ax.errorbar(xs, s.y, yerr=[below, above], fmt="none", ecolor="#333333", capsize=4)
        else:
            _line(ax, s, color, hollow_zero=fig.kind == "line")
    if fig.kind == "bars":
        ax.set_xticks(range(len(fig.xticks)), fig.xticks)
    elif fig.kind == "log":
        ax.set_yscale("log")
    else:
        ax.set_yscale("symlog", linthresh=1.0)
        top = max(
            (v for series in (*fig.series, *(b for b in [fig.band] if b)) for v in series.y), default=1.0
        )
        ticks = [0.0, 1.0]
        while ticks[-1] < top:
            ticks.append(ticks[-1] * 4)
        ax.set_yticks(ticks, ["0 (equal)", *(f"{tick:g}" for tick in ticks[1:])])
        ax.set_ylim(bottom=0, top=ticks[-1])
    ax.set_title(fig.title)
    ax.set_ylabel(fig.ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", borderaxespad=0)
    bottom = ax
    if low is not None:
        low.axhspan(0, 1, color="#d9ead3", alpha=0.7, label="within rounding")
        low.axhline(1, color="#38761d", linewidth=1)
        for i, s in enumerate(fig.lower):
            low.plot(s.x, s.y, linestyle="none", marker="o", markersize=3, color=COLORS[i], label=s.name)
        low.set_ylim(0, max(1.2, *(max(series.y) * 1.1 for series in fig.lower)))
        low.set_ylabel(fig.lower_label)
        low.grid(True, alpha=0.3)
        low.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", borderaxespad=0)
        bottom = low
    if fig.names:
        bottom.set_xticks([x for x, _ in fig.names], [name for _, name in fig.names])
        bottom.tick_params(axis="x", labelrotation=35, labelsize="small")
        for label in bottom.get_xticklabels():
            label.set_horizontalalignment("right")
    bottom.set_xlabel(fig.xlabel)
    mpl_figure.tight_layout()
    desc = json.dumps(
        {"series": [{"name": s.name, "color": COLORS[index]} for index, s in enumerate(fig.series)]}
    )
    buf = io.BytesIO()
    mpl_figure.savefig(
        buf, format="png", metadata={"Software": "xbackend", "Title": fig.title, "Description": desc}
    )
    return buf.getvalue()
