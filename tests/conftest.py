from __future__ import annotations

import locale
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest

from xbackend.model.samples import SAMPLES, build

TESTS = Path(__file__).resolve().parent
# the bert fixture's model: its batch and sequence, and the inputs that index small tables
BERT_SHAPES = {"batch": (2,), "sequence": (16,)}
BERT_RANGES = {"attention_mask": (0, 2), "token_type_ids": (0, 2)}
ROOT = TESTS.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The scale tests (a model past 2 GiB, minutes each) run only when asked for by a marker
    expression that names them (`-m scale`, `make test-scale`): any other `-m`, `-m "not slow"`
    included, leaves them out as the default does."""
    if "scale" in (config.getoption("markexpr") or ""):
        return
    kept = [item for item in items if item.get_closest_marker("scale") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


@pytest.fixture(autouse=True)
def _locale_kept() -> Iterator[None]:
    """Each test leaves the process's locale as it found it: onnx's reference StringNormalizer
    calls setlocale(LC_ALL, the model's locale), and under "C" every later open() without an
    encoding reads ASCII (torch's Inductor then fails to read its own kernel templates) in
    whatever test the same worker runs next."""
    kept = locale.setlocale(locale.LC_ALL)
    yield
    if locale.setlocale(locale.LC_ALL) != kept:
        locale.setlocale(locale.LC_ALL, kept)


PLUGINS = {
    "test-nudge": "plugin_runners:NudgeRunner",
    "test-flaky-build": "plugin_runners:FlakyBuildRunner",
    "test-outputs-only": "plugin_runners:OutputsOnlyRunner",
    "test-crash": "plugin_runners:CrashRunner",
    "test-hang": "plugin_runners:HangRunner",
    "test-missing": "plugin_runners:MissingRunner",
    "test-threads-crash": "plugin_runners:ThreadsCrashRunner",
    "test-shared": "plugin_runners:SharedProcessRunner",
    "test-drift": "plugin_runners:ThreadDriftRunner",
    "test-promising": "plugin_runners:PromisingRunner",
    "test-kill-job": "plugin_runners:KillJobRunner",
    "test-fast-gelu": "plugin_runners:FastGeluRunner",
    "test-plant": "plugin_runners:PlantRunner",
    "test-ort-nudge": "plugin_runners:OrtNudgeRunner",
    "test-batch-nudge": "plugin_runners:BatchNudgeRunner",
    "test-racy": "plugin_runners:RacyRunner",
    "test-moded": "plugin_runners:ModedRunner",
    "test-old-inductor": "plugin_runners:OldInductorRunner",
    "test-logit-flip": "plugin_runners:LogitFlipRunner",
    "test-class-flip": "plugin_runners:ClassFlipRunner",
    "test-dtype": "plugin_runners:ReturnedDtypeRunner",
    "test-fuse": "plugin_runners:FuseUnexposedRunner",
    "test-fuse-trt": "plugin_runners:FuseTrtNamesRunner",
    "test-onnx-load": "plugin_runners:OnnxLoadRunner",
    "test-flush": "plugin_runners:FlushRunner",
    "test-half-probs": "plugin_runners:HalfProbsRunner",
}


def write_plugin_dist(root: Path) -> Path:
    """A dist-info in `root` that registers the test runners under the real entry-point group;
    `root`, the folder to put on sys.path and PYTHONPATH."""
    info = root / "xbackend_testrunners-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: xbackend-testrunners\nVersion: 0.0\n")
    lines = ["[xbackend.runners]", *[f"{k} = {v}" for k, v in PLUGINS.items()]]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="session")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dist-info that registers the test runners under the real entry-point group."""
    return write_plugin_dist(tmp_path_factory.mktemp("plugins"))


@pytest.fixture
def plugins(plugin_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make the test runners visible here and in worker processes."""
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.syspath_prepend(str(plugin_path))
    old = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(plugin_path), str(TESTS), old) if p))
    yield


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every sample model written once per session."""
    out = tmp_path_factory.mktemp("models")
    paths = {}
    for name in SAMPLES:
        paths[name] = out / f"{name}.onnx"
        onnx.save(build(name), str(paths[name]))
    return paths


@pytest.fixture(scope="session")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random-init BERT (2 layers, width 64, eager attention), dynamic batch and sequence."""
    from xbackend.export.example_inputs import InputDecl
    from xbackend.export.torch_onnx import export_torch

    out = tmp_path_factory.mktemp("bert") / "bert.onnx"
    # its source file ships beside it: --trust-model-code runs only that
    shutil.copy(TESTS / "hf_models.py", out.parent / "hf_models.py")
    names = ("input_ids", "attention_mask", "token_type_ids")
    export_torch(
        f"{out.parent / 'hf_models.py'}:bert",
        [InputDecl(n, (2, 16), "int64") for n in names],
        out,
        dynamic={n: {0: "batch", 1: "sequence"} for n in names},
        ranges={"input_ids": (0, 512), **BERT_RANGES},
    )
    return out
