"""What a kernel repository holds that a suite can run, read from its files (nothing is imported or run)."""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

SKIP_DIRS = {".git", ".venv", "venv", "env", "node_modules", "build", "dist", "site", "harness-out", "__pycache__",
             ".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
BUILTIN_MARKS = {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings", "timeout"}


@dataclass(frozen=True)
class BenchFunction:
    target: str  # module:function
    params: tuple[tuple[str, int | None], ...]  # (name, int default or None) of the grid parameters
    takes_dtype: bool
    decorated: bool


@dataclass(frozen=True)
class KernelFound:
    name: str
    module: str
    variants: tuple[str, ...]
    shape_keys: tuple[str, ...]


@dataclass(frozen=True)
class RepoScan:
    name: str
    test_dirs: tuple[str, ...] = ()
    markers: tuple[str, ...] = ()
    functions: tuple[BenchFunction, ...] = ()
    kernels: tuple[KernelFound, ...] = ()
    installable: bool = False
    warnings: tuple[str, ...] = field(default_factory=tuple)



def _python_files(root: Path) -> list[Path]:
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if any(part in SKIP_DIRS or part.startswith(".") for part in parts[:-1]):
            continue
        found.append(path)
    return found


def _module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root)
    if rel.parts[0] == "src" and len(rel.parts) > 1:  # the src layout: the tree's src/ is on PYTHONPATH too
        rel = rel.relative_to("src")
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_test_file(path: Path) -> bool:
    return path.name.startswith("test_") or path.name.endswith("_test.py") or path.name == "conftest.py"


def _decorator_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Attribute):
        return target.attr
    return target.id if isinstance(target, ast.Name) else ""


def _bench_function(module: str, fn: ast.FunctionDef, decorated: bool) -> BenchFunction:
    args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    defaults: dict[str, int | None] = {}
    positional = fn.args.posonlyargs + fn.args.args
    for arg, default in zip(positional[len(positional) - len(fn.args.defaults):], fn.args.defaults, strict=True):
        defaults[arg.arg] = default.value if isinstance(default, ast.Constant) and type(default.value) is int else None
    for arg, default in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True):
        if default is not None:
            defaults[arg.arg] = default.value if isinstance(default, ast.Constant) and type(default.value) is int \
                else None
    params = tuple((a.arg, defaults.get(a.arg)) for a in args if a.arg != "dtype")
    return BenchFunction(f"{module}:{fn.name}", params, any(a.arg == "dtype" for a in args), decorated)


def _imports_benchmark(tree: ast.Module) -> bool:
    """The module imports the harness's decorator (``from harness.bench import benchmark`` or ``harness.bench``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("harness.bench", "harness"):
            return True
        if isinstance(node, ast.Import) and any(alias.name == "harness.bench" for alias in node.names):
            return True
    return False


def _functions_in(module: str, tree: ast.Module) -> list[BenchFunction]:
    """Top-level functions decorated with the harness's ``benchmark`` or carrying ``__harness_benchmark__``."""
    with_meta = {node.targets[0].value.id for node in tree.body
                 if isinstance(node, ast.Assign) and len(node.targets) == 1
                 and isinstance(node.targets[0], ast.Attribute) and node.targets[0].attr == "__harness_benchmark__"
                 and isinstance(node.targets[0].value, ast.Name)}
    uses_decorator = _imports_benchmark(tree)
    found = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        decorated = uses_decorator and any(_decorator_name(d) == "benchmark" for d in node.decorator_list)
        if decorated or node.name in with_meta:
            found.append(_bench_function(module, node, decorated))
    return found


def _kernels_in(module: str, tree: ast.Module, source: str) -> list[KernelFound]:
    """``register(Kernel(name="...", variants={...}))`` calls: the kernels a plugin module registers."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _decorator_name(node) == "Kernel"):
            continue
        kwargs = {kw.arg: kw.value for kw in node.keywords if kw.arg}
        name = kwargs.get("name")
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            continue
        variants: list[str] = []
        if isinstance(kwargs.get("variants"), ast.Dict):
            variants = [k.value for k in kwargs["variants"].keys if isinstance(k, ast.Constant)]
        default = kwargs.get("default_variant")
        if isinstance(default, ast.Constant) and default.value not in variants:
            variants.insert(0, default.value)
        keys = sorted(set(re.findall(r"""shape\s*\[\s*["']([A-Za-z_][A-Za-z0-9_]*)["']\s*\]""", source)))
        found.append(KernelFound(name.value, module, tuple(variants), tuple(keys)))
    return found


def _pytest_markers(root: Path) -> list[str]:
    """Markers the repository declares (pyproject.toml, pytest.ini, setup.cfg, tox.ini)."""
    names: list[str] = []
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            options = tomllib.loads(pyproject.read_text()).get("tool", {}).get("pytest", {}).get("ini_options", {})
        except tomllib.TOMLDecodeError:
            options = {}
        names += [str(m).split(":", 1)[0].split("(", 1)[0].strip() for m in options.get("markers", [])]
    for ini in ("pytest.ini", "setup.cfg", "tox.ini"):
        path = root / ini
        if path.is_file():
            block = re.search(r"^markers\s*=\s*\n((?:[ \t]+.+\n?)+)", path.read_text(), re.M)
            if block:
                names += [line.split(":", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]
    return names


def scan(root: Path) -> RepoScan:
    """What ``root`` holds that a suite can run: test folders, pytest markers, benchmark functions, kernels."""
    root = root.resolve()
    test_dirs, used_marks, functions, kernels, warnings = set(), set(), [], [], []
    for path in _python_files(root):
        rel = path.relative_to(root)
        if _is_test_file(path):
            test_dirs.add(rel.parts[0] if len(rel.parts) > 1 else rel.name)
            used_marks.update(re.findall(r"pytest\.mark\.([A-Za-z_][A-Za-z0-9_]*)", path.read_text(errors="replace")))
            continue
        source = path.read_text(errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            warnings.append(f"{rel}: not parsed ({exc.msg}, line {exc.lineno})")
            continue
        module = _module_name(root, path)
        functions += _functions_in(module, tree)
        if "Kernel" in source and "register" in source:
            kernels += _kernels_in(module, tree, source)
    declared = _pytest_markers(root)
    markers = [m for m in dict.fromkeys(declared + sorted(used_marks)) if m and m not in BUILTIN_MARKS]
    if any(k.module.split(".")[0] in ("kernels", "harness") for k in kernels) or \
            any(f.target.split(".")[0].split(":")[0] in ("kernels", "harness") for f in functions):
        warnings.append("a top-level package named 'kernels' or 'harness' shadows the harness's own "
                        "(calibration kernels, job code): rename it (docs/external-repos.md, Limits)")
    installable = any((root / f).is_file() for f in ("pyproject.toml", "setup.py", "setup.cfg"))
    return RepoScan(name=_suite_name(root.name), test_dirs=tuple(sorted(test_dirs)), markers=tuple(markers),
                    functions=tuple(functions), kernels=tuple(kernels), installable=installable,
                    warnings=tuple(warnings))


def _suite_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "kernels"
