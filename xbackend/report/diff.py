"""`xbackend diff OLD.json NEW.json`: what changed between two comparisons.

Environments and options key by key, the model and inputs, and per backend: status,
determinism, whether the outputs kept their bits (per-tensor digests), the first
tensor that moved (with its module), and the scaled ULP against the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from xbackend.files.textfmt import inert, num, with_module
from xbackend.report.markup import only_our_html, strong, table
from xbackend.results import BackendResult, Result

__all__ = ["ReportDiff", "diff_results"]


@dataclass(frozen=True)
class BackendChange:
    backend: str
    old: str  # "ok, deterministic" ... or "absent"
    new: str
    outputs_identical: bool | None  # None: not comparable (a side did not run, no digests, other inputs)
    first_moved: str | None
    moved: int
    ulp_old: float | None
    ulp_new: float | None

    @property
    def changed(self) -> bool:
        """Whether anything of the backend changed (its verdict, its bits, a tensor's ULP)."""
        return (
            self.old != self.new
            or self.outputs_identical is False
            or self.moved > 0
            or self.ulp_old != self.ulp_new
        )


@dataclass(frozen=True)
class ReportDiff:
    environment: tuple[tuple[str, str, str], ...]  # key, old, new ('–' when absent)
    options: tuple[tuple[str, str, str], ...]
    model: tuple[tuple[str, str, str], ...]
    backends: tuple[BackendChange, ...]
    modules: dict[str, str]
    same_inputs: bool

    @property
    def changed(self) -> bool:
        """Whether anything changed between the two reports."""
        return bool(self.environment or self.options or self.model) or any(
            backend.changed for backend in self.backends
        )

    def markdown(self, old: str, new: str) -> str:
        """The diff as Markdown, `old` and `new` naming the two reports."""
        out = [f"# xbackend diff: {inert(old)} -> {inert(new)}", ""]
        moved = [backend for backend in self.backends if backend.first_moved]
        if not self.changed:
            out += ["Nothing changed: same environment, options, verdicts and bits.", ""]
        for backend_result in moved:
            what = "outputs moved" if backend_result.outputs_identical is False else "outputs kept their bits"
            first = with_module(backend_result.first_moved or "", self.modules)
            out.append(
                f"- {backend_result.backend}: {what}; first tensor that moved: {first} "
                f"({backend_result.moved} moved)"
            )
        if moved:
            out.append("")
        if not self.same_inputs:
            out += ["The two comparisons were fed different inputs: their bits cannot be compared.", ""]
        for title, changes in (
            ("Model and inputs", self.model),
            ("Environment", self.environment),
            ("Options", self.options),
        ):
            if changes:
                out += [
                    f"## {title}",
                    "",
                    *table(["key", "old", "new"], [list(change) for change in changes]),
                ]
        rows = [
            [
                backend.backend,
                backend.old,
                backend.new,
                {True: "yes", False: strong("no"), None: "–"}[backend.outputs_identical],
                with_module(backend.first_moved, self.modules) if backend.first_moved else "–",
                num(backend.ulp_old),
                num(backend.ulp_new),
            ]
            for backend in self.backends
        ]
        out += [
            "## Backends",
            "",
            *table(
                [
                    "backend",
                    "old",
                    "new",
                    "outputs bit-identical",
                    "first moved",
                    "scaled ULP old",
                    "scaled ULP new",
                ],
                rows,
            ),
        ]
        return only_our_html("\n".join(out))


def _changes(old: dict[str, str], new: dict[str, str]) -> tuple[tuple[str, str, str], ...]:
    return tuple(
        (k, old.get(k, "–"), new.get(k, "–")) for k in sorted({*old, *new}) if old.get(k) != new.get(k)
    )


def _state(backend: BackendResult | None) -> str:
    if backend is None:
        return "absent"
    if not backend.ok:
        return backend.status
    return "deterministic" if backend.deterministic else backend.variance_words()


def _backend(result: Result, b: Result, name: str, order: dict[str, int]) -> BackendChange:
    ob = next((backend for backend in result.backends if backend.name == name), None)
    nb = next((backend for backend in b.backends if backend.name == name), None)
    identical: bool | None = None
    first: str | None = None
    moved = 0
    if ob is not None and nb is not None and ob.ok and nb.ok and result.feeds.sha256 == b.feeds.sha256:
        od, nd = dict(ob.output_digests), dict(nb.output_digests)
        if od and nd:
            identical = all(od.get(key) == value for key, value in nd.items()) and od.keys() == nd.keys()
        names = nb.moved_since(ob, order)
        moved = len(names)
        first = names[0] if names else None
    ulp = [
        next((c.scaled_ulp for c in r.cross_backend if c.backend == name and c.status == "ok"), None)
        for r in (result, b)
    ]
    return BackendChange(name, _state(ob), _state(nb), identical, first, moved, ulp[0], ulp[1])


def _options(result: Result) -> dict[str, str]:
    options = result.options
    out = {
        field.name: "auto"
        if field.name == "max_ulp" and options.max_ulp is None
        else _text(getattr(options, field.name))
        for field in fields(options)
        if field.name not in ("loads", "save_captures", "baseline")
    }
    for backend in result.backends:
        out.update({f"{backend.name}.option.{k}": v for k, v in backend.options})
        out.update({f"{backend.name}.info.{k}": v for k, v in backend.info if (k, v) not in backend.options})
    return out


def _text(v: object) -> str:
    """An option's value as a person writes it: no Python reprs (None, (), True, tuples)."""
    if isinstance(v, tuple | list):
        return ", ".join("=".join(map(_text, x)) if isinstance(x, tuple) else _text(x) for x in v) or "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return "–" if v is None else str(v)


def diff_results(result: Result, b: Result) -> ReportDiff:
    """What changed from report `result` to report `b`: environment, options, model, and each backend."""
    order = {n: index for index, n in enumerate(b.model.tensor_order())}
    names = list(
        dict.fromkeys(
            [*(backend.name for backend in result.backends), *(backend.name for backend in b.backends)]
        )
    )
    model = _changes(
        {
            "model.sha256": result.model.sha256,
            "inputs.sha256": result.feeds.sha256,
            "inputs.source": result.feeds.source,
        },
        {"model.sha256": b.model.sha256, "inputs.sha256": b.feeds.sha256, "inputs.source": b.feeds.source},
    )
    return ReportDiff(
        _changes(dict(result.environment), dict(b.environment)),
        _changes(_options(result), _options(b)),
        model,
        tuple(_backend(result, b, name, order) for name in names),
        b.model.modules(),
        result.feeds.sha256 == b.feeds.sha256,
    )
