"""The typed Python API: compare()'s keywords are checked by mypy, the package ships py.typed,
and a Result's lookups raise xbackend's own error naming what it holds."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import typing
import zipfile
from pathlib import Path

import pytest
from roots import ROOT

import xbackend
from xbackend.api.keywords import CompareKeywords
from xbackend.errors import NotInResultError, XbackendError
from xbackend.report import from_json
from xbackend.results import CompareOptions
from xbackend.results.options import INPUT_FLAGS

pytestmark = pytest.mark.unit  # the unit tier: make check

SAMPLE_JSON = ROOT / "reports" / "torch_mlp.json"


def test_the_keywords_are_the_options_fields_and_input_flags() -> None:
    """One list a user completes in an IDE, the other what CompareOptions.create accepts."""
    fields = {f.name for f in dataclasses.fields(CompareOptions)}
    assert set(CompareKeywords.__annotations__) == fields | set(INPUT_FLAGS)
    assert set(typing.get_type_hints(CompareKeywords)) == fields | set(INPUT_FLAGS)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An environment with xbackend installed from its wheel, as a user's is (an editable
    install's import hook is one mypy cannot follow): the wheel holds py.typed."""
    folder = tmp_path_factory.mktemp("wheel")
    source = folder / "source"  # a copy: the build writes its own folders beside the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "xbackend", source / "xbackend", ignore=shutil.ignore_patterns("__pycache__"))
    build = ["wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(folder), str(source)]
    subprocess.run([sys.executable, "-m", "pip", *build], check=True, capture_output=True)
    (wheel,) = folder.glob("xbackend-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert "xbackend/py.typed" in archive.namelist()
        env = folder / "env"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
        (site,) = env.glob("lib/python*/site-packages")
        archive.extractall(site)
    return env / "bin" / "python"


def _mypy(installed: Path, folder: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = folder / "user_script.py"
    script.write_text("import xbackend\n\n" + body + "\n")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--python-executable",
            str(installed),
            script.name,
        ],
        capture_output=True,
        text=True,
        cwd=folder,
    )


def test_mypy_rejects_a_misspelt_option_and_accepts_the_documented_ones(
    installed: Path, tmp_path: Path
) -> None:
    """A user's script checked by mypy against the installed package: `run=5` for `runs=5` is an
    error naming the keyword, a string for a count another; the documented call passes."""
    bad = _mypy(installed, tmp_path, 'result = xbackend.compare("m.onnx", backends=["ort-cpu"], run=5)')
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert 'Unexpected keyword argument "run" for "compare"; did you mean "runs"?' in bad.stdout, bad.stdout
    wrong_type = _mypy(installed, tmp_path, 'result = xbackend.compare("m.onnx", runs="five")')
    assert wrong_type.returncode == 1 and '"runs"' in wrong_type.stdout, wrong_type.stdout
    good = _mypy(
        installed,
        tmp_path,
        "result = xbackend.compare(\n"
        '    "m.onnx", backends=["ort-cpu", "reference"], runs=5, shapes={"x": (1, 3)},\n'
        '    max_ulp="auto", fail_on="ulp>8", max_memory="3GiB",\n'
        ")\n"
        "code: int = result.exit_code\n",
    )
    assert good.returncode == 0, good.stdout + good.stderr


def test_a_misspelt_option_at_run_time_names_the_valid_ones() -> None:
    with pytest.raises(XbackendError, match=r"unknown compare option\(s\) run; valid: .*\bruns\b"):
        xbackend.compare(ROOT / "models" / "torch_mlp.onnx", run=5)  # type: ignore[call-arg]


def test_a_lookup_of_a_name_the_result_lacks_says_what_it_holds() -> None:
    result = from_json(SAMPLE_JSON.read_text("utf-8"))
    held = ", ".join(b.name for b in result.backends)
    with pytest.raises(NotInResultError) as caught:
        result.backend("nope")
    assert str(caught.value) == f"no backend 'nope' in this result; it holds: {held}"
    assert isinstance(caught.value, KeyError)  # code that caught KeyError still does
    with pytest.raises(NotInResultError, match=r"^no comparison against the reference for 'nope'"):
        result.cross("nope")
    with pytest.raises(NotInResultError, match=r"^no probe 'nope' in this result; it holds: "):
        result.probe("nope")
    assert result.backend(result.backends[0].name) is result.backends[0]
