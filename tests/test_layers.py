"""The layers point one way: every import in evalkit/ points down the order written in the README
("How it works", Layers), and no module imports itself back through others (no import circles).

Imports are read from the source with `ast`, everywhere in a module: top level, inside functions and
methods, and inside `if TYPE_CHECKING:` blocks. TYPE_CHECKING imports count like any other: a signature
that names a higher layer's type depends on that layer just as much, and would hide a circle that a later
runtime import closes. Two things are not imports here: a package's `__init__` running before its
submodule (Python's own order, not a dependency the code chose), and the registries' dotted strings that
`importlib` loads by name (`evalkit.engines.ENGINES`, `evalkit.suites.SUITES`): a registry is the one way
a lower layer reaches the modules that register in it, by name and at run time.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "evalkit"

# Bottom first. A module may import its own layer and the layers before it. The README's "How it works"
# lists the same order; change both together. Patterns: a module's dotted name, or "pkg.*" for every
# module under pkg (the most specific pattern wins).
LAYERS: list[tuple[str, list[str]]] = [
    ("foundation", [
        "evalkit.errors", "evalkit.fileio", "evalkit.resources", "evalkit.spreadsheet", "evalkit.peer", "evalkit.sandbox",
        "evalkit.sandbox_runner",  # the program the sandbox runs (standard library only)
        "evalkit.models", "evalkit.gpus", "evalkit.terminal",  # gpus: the GPU model table and the plan-time verdict types
        "evalkit.versions",  # installed packages' versions, from their metadata
        "evalkit.interrupts",  # Ctrl-C kept when it lands in a C library's Python callback or a destructor
        "evalkit.affinity",  # the CPUs this process may run on (hardware, the engines and the quantizer size by it)
        "evalkit.memo",  # answers kept on disk by the hash of the question (scipy's, figures)
        "evalkit.quant_formats",  # GPTQ/AWQ/INT8 format names and bytes per weight (engines' kernels: through the registry)
        "evalkit.quantize_child",  # the program the quantizer's interpreter runs (imports no evalkit module)
        "evalkit.metrics", "evalkit.metrics.*",  # declarations (margin keys too), stats (StatsSettings too), ...
        # The engine contract: the registry (names -> specs, loaded by name), EngineSpec and the Engine types.
        # config validates each engine's options against it; the engine modules themselves are above config.
        "evalkit.engines", "evalkit.engines.spec", "evalkit.engines.base",
        # The suite contract, likewise: the registry (names -> specs, loaded by name) and SuiteSpec. config, records,
        # the metric declarations, preflight, scoring, report and viewer read it; the suite modules are higher up.
        "evalkit.suites", "evalkit.suites.spec",
    ]),
    ("config", ["evalkit.config"]),
    ("engines", [
        "evalkit.engines.*",  # tokenizer, llamacpp, vllm, hf, and any engine or engine helper added beside them
        "evalkit.hardware", "evalkit.ledger", "evalkit.gpu_plan", "evalkit.variants", "evalkit.environment",
        "evalkit.weights",  # architecture and weight bytes from a model's files; where a model source is locally
        "evalkit.quantize",  # GPTQ/AWQ/W8A8 variants made by llm-compressor (variants calls it)
        "evalkit.gguf_ladder",  # the GGUF ladder by llama.cpp's quantizer, llama.cpp's tokenization, GGUF metadata
    ]),
    ("records/store", ["evalkit.records", "evalkit.store", "evalkit.cache", "evalkit.sidefiles"]),
    ("suites", [
        "evalkit.suites", "evalkit.suites.*", "evalkit.capabilities", "evalkit.parity",
        "evalkit.metrics.compare",  # turns the statistics into the store's ScoreRow / ComparisonRow for suites
    ]),
    ("executors/scoring/decision", [
        "evalkit.executors", "evalkit.executors.*", "evalkit.worker", "evalkit.progress", "evalkit.preflight",
        "evalkit.scoring", "evalkit.decision", "evalkit.rating", "evalkit.rating.*",
        "evalkit.judge", "evalkit.judge.*",  # the model judge: prompts, judging through the result cache, statistics
        "evalkit.diskplan",  # the disk a run needs, from the config and each suite's record layout
        "evalkit.margin_plan",  # whether the suites' sizes can show the margins, before anything runs
    ]),
    ("report/view/cli", [
        "evalkit", "evalkit.__main__", "evalkit.cli", "evalkit.pipeline", "evalkit.results",
        "evalkit.report", "evalkit.report.*", "evalkit.viewer", "evalkit.viewer.*",
        "evalkit.suites.report", "evalkit.suites.report.*",  # each suite's report section and verdict columns
        "evalkit.history", "evalkit.diff", "evalkit.diffcli",  # runs over time: comparability keys, `evalkit diff`
    ]),
]


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported evalkit module
    where: str  # file:line
    type_checking: bool


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted name -> file for every module of the package (a package is its __init__)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (specificity, layer index)
    for index, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if pattern.endswith(".*"):
                hit = module.startswith(pattern[:-1])
                specificity = len(pattern) - 2
            else:
                hit = module == pattern
                specificity = len(pattern) + 1_000  # an exact name beats any prefix
            if hit and (best is None or specificity > best[0]):
                best = (specificity, index)
    return None if best is None else best[1]


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The evalkit module an import of `name` loads (`evalkit.engines.ENGINES` -> `evalkit.engines`)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(module: str, path: Path, known: dict[str, Path], package: Path = PACKAGE) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    guarded: set[int] = set()  # ids of nodes under `if TYPE_CHECKING:`
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                guarded.update(id(n) for n in ast.walk(stmt))
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, one level up per extra dot
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join([*base, *([node.module] if node.module else [])])
            else:
                prefix = node.module or ""
            # `from pkg import sub` imports the submodule when there is one, else a name of pkg.
            names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix for a in node.names]
        for name in names:
            if name != "evalkit" and not name.startswith("evalkit."):
                continue
            target = _resolve(name, known)
            if target is not None and target != module:
                where = f"{path.relative_to(package.parent)}:{node.lineno}"
                out.append(Import(module, target, where, id(node) in guarded))
    return out


def all_imports(package: Path = PACKAGE) -> tuple[dict[str, Path], list[Import]]:
    known = modules(package)
    return known, [imp for name, path in known.items() for imp in imports_of(name, path, known, package)]


def upward(imports: list[Import]) -> list[str]:
    out = []
    for imp in imports:
        src, dst = layer_of(imp.source), layer_of(imp.target)
        if src is not None and dst is not None and dst > src:
            guard = " (under TYPE_CHECKING)" if imp.type_checking else ""
            out.append(f"{imp.where}: {imp.source} (layer {LAYERS[src][0]}) imports {imp.target} "
                       f"(layer {LAYERS[dst][0]}){guard}, which points up the layer order")
    return out


def cycles(imports: list[Import]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each as a sorted list."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.source, set()).add(imp.target)
        graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer() -> None:
    unplaced = [name for name in modules() if layer_of(name) is None]
    assert not unplaced, (f"modules with no layer: {', '.join(unplaced)}; place each in LAYERS in "
                          "tests/test_layers.py and in the README's layer order (How it works)")


def test_no_import_points_up_the_layers() -> None:
    _, imports = all_imports()
    assert len(imports) > 300  # the reader finds the package's imports (about 400 of them)
    bad = upward(imports)
    assert not bad, "\n".join(bad)


def test_no_import_circles() -> None:
    _, imports = all_imports()
    found = cycles(imports)
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_config_sections_are_the_registrys_suites() -> None:
    """config validates `suites.<name>` through the registry (it reaches the registry below it, as it reaches
    the engines'); a config's `suites:` section lists every registered suite that runs, in registry order (a
    suite scored from the run directory's files, SuiteSpec.runs False, has no section)."""
    from evalkit.config import Suites
    from evalkit.suites import SUITES, suite_spec

    assert list(Suites().model_dump()) == [n for n in SUITES if suite_spec(n).runs]
    assert {n for n in SUITES if not suite_spec(n).runs} == {"ratings", "judge"}


# -- the checker itself, on a small package written here ------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "evalkit" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "evalkit"


def test_checker_sees_imports_in_functions_type_checking_and_relative_forms(tmp_path: Path) -> None:
    pkg = _write(tmp_path, {
        "__init__.py": "",
        "errors.py": "def f():\n    from evalkit.config import Config\n",  # inside a function: foundation -> config
        "config.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from evalkit.store import RunDir\n",
        "store.py": "from . import errors\nfrom .config import X\n",  # relative, downward: fine
        "suites/__init__.py": "",
        "suites/base.py": "from ..scoring import s\n",  # relative two dots: suites -> scoring, upward
        "scoring.py": "import evalkit.suites.base as b\n",
    })
    _, imports = all_imports(pkg)
    bad = upward(imports)
    assert len(bad) == 3, bad
    assert any("errors.py:2: evalkit.errors (layer foundation) imports evalkit.config (layer config)" in b for b in bad)
    assert any("config.py:3" in b and "(under TYPE_CHECKING)" in b for b in bad)
    assert any("suites/base.py:1: evalkit.suites.base (layer suites) imports evalkit.scoring" in b for b in bad)
    # errors -> config -> store -> errors, and suites.base <-> scoring
    assert sorted(cycles(imports)) == [["evalkit.config", "evalkit.errors", "evalkit.store"],
                                       ["evalkit.scoring", "evalkit.suites.base"]]


def test_unknown_module_has_no_layer() -> None:
    assert layer_of("evalkit.newthing") is None
    assert layer_of("evalkit.engines.openai") == layer_of("evalkit.engines.llamacpp")
    assert layer_of("evalkit.engines.spec") < layer_of("evalkit.config") < layer_of("evalkit.engines.vllm")
    assert layer_of("evalkit.viewer.server") == layer_of("evalkit.report.render")
