"""The house's layers, as docs/architecture.md draws them, checked against the code.

Every import counts: module level, function-local and under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from roots import ROOT

pytestmark = pytest.mark.unit  # the unit tier: make check

PACKAGE = ROOT / "xbackend"
MAP = ROOT / "docs" / "architecture.md"
MAX_LINES = 600
LAST_LAYER = 13  # the layers docs/architecture.md draws

# Function-local imports are for heavy or optional engines only (each says which in a comment).
HEAVY_OR_OPTIONAL = {
    "torch",
    "ray",
    "tensorrt",
    "openvino",
    "onnxruntime",
    "onnx",  # in the worker's modules: a foreign interpreter may lack it
    "groqflow",
    "llama_cpp",  # llama-cpp-python: the llama.cpp backend's engine (the llama extra)
    "executorch",  # ExecuTorch's runtime and exporter (the executorch extra)
    "matplotlib",
    "ml_dtypes",  # likewise optional in a foreign interpreter
    "psutil",  # likewise
    "model_signing",  # certify --key's model-files signature, where OpenSSF model-signing is installed
    "transformers",  # in llama.cpp's converter's own process (xbackend/export/gguf_launch.py)
    "pip",  # its default index, where export gguf fetches llama.cpp's converter (an environment may lack pip)
}
# Where a module must defer one of its own or a standard import, and why.
LOCAL_EXCEPTIONS = {
    ("xbackend/runners/llama_cpp.py", "xbackend.model.load"): "it imports onnx (foreign workers)",
    ("xbackend/runners/executorch_rt.py", "xbackend.model.load"): "it imports onnx (foreign workers)",
    ("xbackend/runners/contrib.py", "xbackend.bounds.rules"): "it imports onnx (foreign workers)",
    (
        "xbackend/runners/contrib_transformer.py",
        "xbackend.bounds.element",
    ): "it imports onnx (foreign workers)",
    (
        "xbackend/numerics/streamdiff.py",
        "xbackend.numerics.jitdiff",
    ): "numba compiles the kernels: only when tensors differ",
    (
        "xbackend/runners/ort_cpu.py",
        "xbackend.model.load",
    ): "it imports onnx (foreign workers)",
    (
        "xbackend/judge/judge_nodes.py",
        "xbackend.numerics.jitjudge",
    ): "numba compiles the kernel: only when nodes are judged",
    (
        "xbackend/judge/judge_nodes.py",
        "xbackend.numerics.jitjudge.warm",
    ): "numba loads the kernel in the background",
    (
        "xbackend/runners/ort_trt.py",
        "xbackend.model.load",
    ): "it imports onnx (foreign workers)",
    (
        "xbackend/runners/tensorrt.py",
        "xbackend.model.load",
    ): "it imports onnx (foreign workers)",
    (
        "xbackend/execution/foreign_probe.py",
        "numpy",
    ): "the interpreter may lack numpy: reported",
    (
        "xbackend/cli/entry.py",
        "xbackend.cli.main",
    ): "the CLI imports under the early signal handlers",
    (
        "xbackend/execution/foreign_probe.py",
        "importlib",
    ): "Python < 3.8 lacks importlib.metadata",
}


@dataclass(frozen=True)
class Edge:
    src: str  # module name
    dst: str
    file: str
    line: int
    local: bool  # inside a function (or a class body), not at module level
    names: tuple[str, ...]
    commented: bool


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _resolve(name: str) -> str:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _module_level(tree: ast.Module) -> set[int]:
    """Ids of import nodes at module level, including under `if TYPE_CHECKING:` and `try:`."""
    out = set()
    for node in tree.body:
        if isinstance(node, ast.If | ast.Try):
            out |= {id(n) for n in ast.walk(node)}
        out.add(id(node))
    return out


def _edges() -> Iterator[Edge]:
    for mod, path in MODULES.items():
        text = path.read_text("utf-8")
        lines = text.splitlines()
        tree = ast.parse(text)
        top = _module_level(tree)
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            end = node.end_lineno or node.lineno
            commented = "#" in lines[end - 1] or lines[node.lineno - 2].strip().startswith("#")
            rel = str(path.relative_to(ROOT))
            if isinstance(node, ast.Import):
                targets = [(a.name, ()) for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                targets = []
                for a in node.names:
                    full = f"{base}.{a.name}"
                    targets.append((full, ()) if full in MODULES else (base, (a.name,)))
            for target, names in targets:
                yield Edge(mod, target, rel, node.lineno, id(node) not in top, names, commented)


EDGES = list(_edges())
INTERNAL = [e for e in EDGES if e.dst.startswith("xbackend") and _resolve(e.dst) != e.src]


# What may sit at the package root: the API facade, the entry point, and what every layer reads.
ROOT_MODULES = {"__init__", "__main__", "version", "errors", "facade"}
MAX_ROOT_MODULES = 8


def _read_map() -> tuple[dict[str, int], dict[str, int]]:
    """Module -> layer number and folder -> layer number, from the map's '## N. Title' headings,
    '- `path`:' bullets and each layer's 'Folders:' line."""
    layer = 0
    layers: dict[str, int] = {}
    folders: dict[str, int] = {}
    for line in MAP.read_text("utf-8").splitlines():
        head = re.match(r"## (\d+)\. ", line)
        if head:
            layer = int(head.group(1))
        if line.startswith("Folders: "):
            for folder in re.findall(r"`(xbackend/\w+)/`", line):
                assert folder not in folders, f"{folder}/ is named by two layers in {MAP.name}"
                folders[folder] = layer
        item = re.match(r"- `(xbackend/[\w/]+\.py)`: \S", line)
        if item:
            path = item.group(1)
            assert path not in layers, f"{path} is listed twice in {MAP.name}"
            layers[path] = layer
    return layers, folders


LAYERS, FOLDERS = _read_map()


def _path(mod: str) -> str:
    return str(MODULES[mod].relative_to(ROOT))


def test_every_module_is_on_the_map() -> None:
    on_disk = {_path(m) for m in MODULES}
    assert sorted(on_disk - set(LAYERS)) == [], f"add these to {MAP.relative_to(ROOT)}"
    assert sorted(set(LAYERS) - on_disk) == [], f"these in {MAP.relative_to(ROOT)} no longer exist"
    assert sorted(set(LAYERS.values())) == list(range(1, LAST_LAYER + 1))


def _misplaced(layers: dict[str, int], folders: dict[str, int], packages: set[str]) -> list[str]:
    """Modules listed in a layer their folder does not belong to, and folders no layer names."""
    wrong = []
    for path, layer in layers.items():
        folder = path.rpartition("/")[0]
        if folder == "xbackend":
            continue
        if folder not in folders:
            wrong.append(f"{path}: its folder {folder}/ is named by no layer's 'Folders:' line")
        elif folders[folder] != layer:
            wrong.append(
                f"{path} is listed in layer {layer}, but {folder}/ belongs to layer {folders[folder]}"
            )
    wrong += [f"{f}/ is named by no layer" for f in sorted(packages - set(folders))]
    wrong += [f"{f}/ is not a package on disk" for f in sorted(set(folders) - packages)]
    return wrong


def test_each_module_sits_in_a_folder_of_its_layer() -> None:
    """The tree shows the layers: a module's folder is one its layer names, and every package on
    disk belongs to exactly one layer."""
    packages = {str(p.relative_to(ROOT)) for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert _misplaced(LAYERS, FOLDERS, packages) == []


def test_the_folder_check_catches_a_module_in_another_layers_folder() -> None:
    """Planted: metrics listed under compare's layer, and a package no layer names."""
    layers = {**LAYERS, "xbackend/numerics/metrics.py": FOLDERS["xbackend/comparison"]}
    packages = {*FOLDERS, "xbackend/stray"}
    assert _misplaced(layers, FOLDERS, packages) == [
        f"xbackend/numerics/metrics.py is listed in layer {FOLDERS['xbackend/comparison']}, "
        f"but xbackend/numerics/ belongs to layer {FOLDERS['xbackend/numerics']}",
        "xbackend/stray/ is named by no layer",
    ]


def test_only_the_api_entry_point_version_and_errors_sit_at_the_root() -> None:
    root = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES
    assert sorted(set(root) - ROOT_MODULES) == [], "move these into the folder of their layer"


def test_imports_point_only_to_earlier_layers() -> None:
    wrong = []
    for e in INTERNAL:
        src, dst = LAYERS[_path(e.src)], LAYERS[_path(_resolve(e.dst))]
        if dst > src:
            wrong.append(f"{e.file}:{e.line}: layer {src} imports {_resolve(e.dst)} (layer {dst})")
    assert wrong == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = {}
    for e in INTERNAL:
        graph.setdefault(e.src, set()).add(_resolve(e.dst))
    assert _cycles(graph) == []


def _folder(mod: str) -> str:
    """The folder a module sits in; a module at the package root is a folder of its own."""
    rel = MODULES[_resolve(mod)].relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else f"xbackend/{rel.name}"


def _folder_graph(edges: list[Edge]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for e in edges:
        src, dst = _folder(e.src), _folder(e.dst)
        if src != dst:
            graph.setdefault(src, set()).add(dst)
    return graph


def test_no_import_cycles_between_folders() -> None:
    """Folders as well as files: two folders that import each other are one layer in fact."""
    assert _cycles(_folder_graph(INTERNAL)) == []


def test_the_folder_check_catches_two_folders_that_import_each_other() -> None:
    """Planted: the judge importing the comparison's run, which imports the judge."""
    judge = next(m for m in MODULES if m.startswith("xbackend.judge."))
    back = Edge(judge, "xbackend.comparison.run", "planted", 1, False, (), False)
    assert ["comparison", "judge"] in _cycles(_folder_graph([*INTERNAL, back]))


def test_cycle_finder_finds_a_cycle() -> None:
    """The check above can fail: a planted cycle is found, with its members."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_local_imports_only_for_heavy_or_optional_engines() -> None:
    wrong = []
    for e in EDGES:
        if not e.local:
            continue
        target = _resolve(e.dst) if e.dst.startswith("xbackend") else e.dst
        if e.dst == "xbackend" and e.names:
            target = f"xbackend.{e.names[0]}"
        root = target.split(".")[0]
        allowed = root in HEAVY_OR_OPTIONAL or any(
            f == e.file and (target == m or target.startswith(m + ".")) for f, m in LOCAL_EXCEPTIONS
        )
        if not allowed:
            wrong.append(f"{e.file}:{e.line}: function-local import of {target}")
        elif not e.commented:
            wrong.append(f"{e.file}:{e.line}: say which engine this local import defers, in a comment")
    assert wrong == []


def test_no_module_imports_private_names() -> None:
    wrong = [
        f"{e.file}:{e.line}: {name} from {e.dst}"
        for e in INTERNAL
        for name in e.names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert wrong == []


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_module_size(mod: str) -> None:
    lines = len(MODULES[mod].read_text("utf-8").splitlines())
    assert lines <= MAX_LINES, f"{_path(mod)} has {lines} lines; split it along its seams"


def test_readme_is_short_and_links_every_page() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    assert len(readme.splitlines()) <= 250
    pages = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)(?:#[\w-]*)?\)", readme))
    assert [p for p in pages if p not in linked] == []
    first_block = readme.split("```")[1].splitlines()[1:]
    assert first_block == ["make demo", "make test"], "the two commands open the README; the test one second"


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text("utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_every_module_imports_on_its_own() -> None:
    """The package's and results' names load on first use (a worker imports neither the comparator
    nor the judgment), so no module may rely on another having been imported first: each one is
    imported first, in a fresh set of xbackend modules."""
    import subprocess
    import sys

    names = sorted(m for m in MODULES if m != "xbackend.__main__")
    code = (
        "import importlib, sys\n"
        "bad = []\n"
        f"for m in {names!r}:\n"
        "    for k in [k for k in sys.modules if k == 'xbackend' or k.startswith('xbackend.')]:\n"
        "        del sys.modules[k]\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except Exception as e:\n"
        "        bad.append(f'{m}: {type(e).__name__}: {e}')\n"
        "print('\\n'.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


def test_the_packages_documented_names_and_submodules_load_on_first_use() -> None:
    """docs/python-api.md reads xbackend.report.* after a bare `import xbackend`; the lazy
    facade loads a submodule read as an attribute, and `xbackend.compare` stays the function."""
    import subprocess
    import sys

    code = (
        "import xbackend\n"
        "print(xbackend.report.to_json.__name__, xbackend.report.from_json.__name__,\n"
        "      xbackend.results.Result.__name__, xbackend.compare.__name__, xbackend.Result.__name__)\n"
        "try:\n"
        "    xbackend.no_such_name\n"
        "except AttributeError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.splitlines() == [
        "to_json from_json Result compare Result",
        "module 'xbackend' has no attribute 'no_such_name'",
    ]
