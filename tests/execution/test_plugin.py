"""A third-party runner installed as a package, registered through the xbackend.runners group."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from roots import TESTS

from tests.cli_helpers import run
from tests.foreign_env import OLD_ORT, venv
from xbackend import compare

PLUGIN = TESTS / "plugin_example"

pytestmark = pytest.mark.slow


def _wheel(folder: Path) -> Path:
    """Build the example plugin's wheel (from a copy: setuptools leaves build files beside it)."""
    src = folder / "src"
    shutil.copytree(PLUGIN, src)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-w",
            str(folder),
            str(src),
        ],
        check=True,
    )
    return next(folder.glob("xbackend_plugin_example-*.whl"))


def _install(python: str, wheel: Path, *target: str) -> None:
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--force-reinstall",
            "--disable-pip-version-check",
            *target,
            str(wheel),
        ],
        check=True,
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _wheel(tmp_path_factory.mktemp("plugin-wheel"))


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    site = tmp_path_factory.mktemp("plugin-site")
    _install(sys.executable, wheel, "--target", str(site))
    return site


@pytest.fixture
def installed(plugin_site: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The plugin on this interpreter's path and the workers'."""
    monkeypatch.syspath_prepend(str(plugin_site))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(p for p in (str(plugin_site), os.environ.get("PYTHONPATH", "")) if p)
    )
    return plugin_site


def test_plugin_is_listed_and_runs_here(
    installed: Path, models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = run(capsys, "backends")
    assert "example-ort  available (1.31.1)" in out
    assert "onnxruntime on one thread (an example plugin)" in out
    r = compare(
        models["mlp_layernorm"],
        backends=["example-ort", "ort-cpu"],
        runner_options={"ort-cpu": {"threads": "1"}},
        reference="ort-cpu",
        runs=3,
        probes=["none"],
    )
    by = {b.name: b for b in r.backends}
    assert by["example-ort"].ok, by["example-ort"].reason
    assert by["example-ort"].promises == ("run-to-run",)
    assert [c.status for c in r.promise_checks()] == ["held"]
    # xbackend staged the model, so the plugin exposed every layer without onnx of its own
    assert len(by["example-ort"].layer_digests) == len(by["ort-cpu"].layer_digests) == 49
    # the same onnxruntime on one thread: the same bits, layer by layer
    x = r.cross("example-ort")
    assert x.bitwise_equal and all(d.bitwise_equal for d in x.tensors)


def test_plugin_runs_in_a_foreign_environment(installed: Path, wheel: Path, models: dict[str, Path]) -> None:
    python = venv("plugin-foreign", f"onnxruntime=={OLD_ORT}")
    _install(str(python), wheel)
    r = compare(
        models["mlp_layernorm"],
        backends=["example-ort@old", "example-ort"],
        runner_options={"example-ort@old": {"python": str(python)}},
        reference="example-ort",
        runs=2,
        probes=["none"],
    )
    by = {b.name: b for b in r.backends}
    assert by["example-ort@old"].ok, by["example-ort@old"].reason
    info = dict(by["example-ort@old"].info)
    assert info["onnxruntime"] == OLD_ORT
    assert info["interpreter.package.xbackend-plugin-example"] == "0.1.0"
    assert dict(by["example-ort"].info)["onnxruntime"] == "1.31.1"
    assert r.cross("example-ort@old").status == "ok"
