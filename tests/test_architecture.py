"""The package structure carries the design: no import cycles, lazy imports only for heavy dependencies, and the
layer contract (import-linter, ``[tool.importlinter]`` in pyproject.toml) holds.

The import graph here is read from the source (every ``import`` statement, at module level or inside a function),
so a cycle hidden by a function-level import is still a cycle.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.paths import ROOT

PROJECT = ("harness", "kernels", "reports")
# Packages too slow to load at CLI start-up or in a job process that does not need them; ``kernels`` imports
# its modules (and so MLX) through importlib, which the source scan cannot follow.
HEAVY_ROOTS = ("ray", "scipy", "mlx", "kernels", "numba", "alembic")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PROJECT:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts or "examples" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The deepest project module that ``name`` denotes (``harness.record.store.open_store`` -> the module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(node: ast.AST, module: str) -> Iterator[tuple[ast.stmt, list[str]]]:
    """Every import statement under ``node`` with the absolute names it brings in."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Import):
            yield sub, [alias.name for alias in sub.names]
        elif isinstance(sub, ast.ImportFrom):
            assert not sub.level, f"{module}:{sub.lineno}: relative import (the project imports absolutely)"
            base = sub.module or ""
            yield sub, [base, *(f"{base}.{alias.name}" for alias in sub.names)]


def _function_level(tree: ast.Module) -> set[int]:
    """Line numbers of import statements inside a function (not ``if TYPE_CHECKING`` blocks: those never run)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines |= {sub.lineno for sub in ast.walk(node) if isinstance(sub, ast.Import | ast.ImportFrom)}
    return lines


def _graph(*, module_level_only: bool = False) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        lazy = _function_level(tree)
        for stmt, names in _imports(tree, name):
            if module_level_only and stmt.lineno in lazy:
                continue
            graph[name] |= {target for n in names if (target := _resolve(n)) and target != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in graph:
        if node not in index:
            visit(node)
    return found


def _heavy(graph: dict[str, set[str]]) -> set[str]:
    """Project modules that load a heavy third-party package when imported (directly or through others)."""
    direct = set()
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        lazy = _function_level(tree)
        for stmt, names in _imports(tree, name):
            if stmt.lineno not in lazy and any(n.split(".")[0] in HEAVY_ROOTS for n in names):
                direct.add(name)
    heavy, changed = set(direct), True
    while changed:
        changed = False
        for name, targets in graph.items():
            if name not in heavy and targets & heavy:
                heavy.add(name)
                changed = True
    return heavy


def test_the_import_graph_has_no_cycle_even_through_function_level_imports():
    graph = _graph()
    assert len(graph) > 50, "the scan found too few modules to be meaningful"
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_function_level_imports_are_only_for_heavy_dependencies_and_say_why():
    """A function-level import is allowed for ray, scipy or MLX (or a project module that loads one), with a
    comment on its line saying why it waits; anything else belongs at the top of the module."""
    heavy = _heavy(_graph(module_level_only=True))
    offenders = []
    for name, path in MODULES.items():
        if not name.startswith("harness"):
            continue
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        lazy = _function_level(tree)
        for stmt, names in _imports(tree, name):
            if stmt.lineno not in lazy:
                continue
            targets = [n for n in names[1:] or names if n]
            is_heavy = any(n.split(".")[0] in HEAVY_ROOTS or _resolve(n) in heavy for n in targets)
            has_reason = any("#" in line for line in lines[stmt.lineno - 1:stmt.end_lineno])
            if not (is_heavy and has_reason):
                offenders.append(f"{path.relative_to(ROOT)}:{stmt.lineno}: {lines[stmt.lineno - 1].strip()}")
    assert offenders == []


STATS = "harness.stats"


def _private_uses(sources: dict[str, str], package: str) -> list[str]:
    """Uses, in one module, of another module's private name (``_x``, not a dunder) where that module is under
    ``package``: ``from harness.stats.m import _x`` and ``m._x`` with ``m`` bound to such a module by an import."""
    def under(name: str) -> bool:
        return (name == package or name.startswith(package + ".")) and name in sources

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    found = []
    for module, source in sources.items():
        tree = ast.parse(source)
        bound: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bound |= {alias.asname: alias.name for alias in node.names if alias.asname and under(alias.name)}
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if under(f"{node.module}.{alias.name}"):
                        bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    elif under(node.module) and node.module != module and private(alias.name):
                        found.append(f"{module}:{node.lineno}: from {node.module} import {alias.name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and private(node.attr)
                    and bound.get(node.value.id, module) != module):
                found.append(f"{module}:{node.lineno}: {bound[node.value.id]}.{node.attr}")
    return found


def test_no_module_uses_a_private_name_of_the_statistics_package():
    """harness/stats/ is the one place that decides a verdict; what its modules share is public (issue 39)."""
    sources = {name: path.read_text() for name, path in MODULES.items()}
    assert any(name.startswith(STATS + ".") for name in sources), "the scan found no statistics module"
    assert _private_uses(sources, STATS) == []


def test_the_private_name_scan_finds_both_forms():
    sources = {"harness.stats.a": "_x = 1\n", "harness.stats.b": "from harness.stats.a import _x\n",
               "harness.analysis.c": "from harness.stats import a\nfrom harness.stats import a as s\na._x\ns._x\n",
               "harness.stats.d": "from harness.stats import a\na.x\n"}
    assert _private_uses(sources, STATS) == [
        "harness.stats.b:1: from harness.stats.a import _x", "harness.analysis.c:3: harness.stats.a._x",
        "harness.analysis.c:4: harness.stats.a._x"]


def test_the_layer_contract_holds():
    """import-linter's contracts (pyproject.toml): lower stages never import higher ones, kernels/ imports
    nothing from harness/, reports/ only harness.core and harness.stats, harness.stats no database, rendering or
    higher stage."""
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.fail("lint-imports is not installed: the test extra provides it (import-linter)")
    done = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_cli_starts_without_loading_ray_scipy_or_mlx():
    """`harness --help` and `harness chips` stay fast: the heavy packages load only in the verbs that use them."""
    code = "import sys, harness.cli.main; print(','.join(m for m in ('ray', 'scipy', 'mlx') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_a_command_line_loads_its_own_verb_alone_and_help_lists_every_verb():
    """`harness report ...` imports the report verb's module, not the run verb's executors or Ray's driver; a command
    line without a known verb (`harness --help`, a typo) registers them all."""
    code = ("import sys; sys.argv = ['harness', *sys.argv[1:]]; import harness.cli.main; "
            "print(','.join(sorted(m for m in sys.modules if m.startswith(('harness.cli.', 'harness.cluster')))))")

    def loaded(*argv: str) -> set[str]:
        done = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return set(done.stdout.strip().split(","))

    assert loaded("--debug", "report", "--out", "x") == {"harness.cli.common", "harness.cli.main",
                                                         "harness.cli.report"}
    every = {f"harness.cli.{verb}" for verb in ("run", "report", "compare", "bisect", "cluster", "noise")}
    for argv in (("--help",), ("repot",)):
        assert every | {"harness.cluster.driver"} <= loaded(*argv)
    done = subprocess.run([sys.executable, "-m", "harness", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and all(verb in done.stdout for verb in ("run", "report", "compare", "bisect"))
