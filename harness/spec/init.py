"""`harness init`: what a kernel repository holds (tests, benchmark functions, registered kernels) and the files that
adopt the harness there -- a commented ``harness.toml`` and the CI workflows of one topology.

``scan`` reads the repository (files only: nothing is imported or run); everything else is pure and returns file
texts, so the generated files are tested as texts (the TOML through the suite loader, the workflows against
GitHub's schema and by running their shell steps locally: tests/spec/test_init*.py).

Topologies (docs/topology.md):

- ``shared-db``: each benchmark machine is a self-hosted runner and writes to one shared database (``$HARNESS_DB``,
  PostgreSQL); one job renders the report from it.
- ``bundles``: each benchmark machine measures into a local SQLite file and uploads a bundle; one collector job
  imports them all into ``$HARNESS_DB`` and renders the report. The benchmark machines need no database access.
- ``cluster``: one runner submits each commit to a chip-labelled Ray cluster (docs/cluster.md), whose nodes write
  to ``$HARNESS_DB``.
"""

from __future__ import annotations

import ast
import json
import re
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

TOPOLOGIES = ("shared-db", "bundles", "cluster")
DISTRIBUTION = "mlx-kernel-harness"
PYTHON_VERSION = "3.11"
MEASURE_WORKFLOW = ".github/workflows/harness-measure.yml"
GATE_WORKFLOW = ".github/workflows/harness-gate.yml"
SKIP_DIRS = {".git", ".venv", "venv", "env", "node_modules", "build", "dist", "site", "harness-out", "__pycache__",
             ".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
BUILTIN_MARKS = {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings", "timeout"}
SIZE_DEFAULTS = {"cpu": [256, 1024], "gpu": [1024, 4096]}


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


# ---------------------------------------------------------------------------------------------------------------
# Scanning the repository
# ---------------------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------------------
# harness.toml
# ---------------------------------------------------------------------------------------------------------------


def _toml_str(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid TOML basic string


def _grid(fn: BenchFunction, chip_class: str) -> str:
    cells = []
    for name, default in fn.params:
        values = [default] if default is not None else SIZE_DEFAULTS[chip_class]
        cells.append(f"{name} = {json.dumps(values)}")
    return "{ " + ", ".join(cells) + " }"


def _pytest_sections(found: RepoScan) -> list[str]:
    if not found.test_dirs:
        return ["# No tests found (test_*.py / *_test.py). A selection looks like:",
                "# [[pytest]]", '# name = "unit"', '# paths = ["tests"]', ""]
    lines = [f"# Tests found in: {', '.join(found.test_dirs)}. One job per selection, stored test by test."]
    if found.markers:
        lines.append(f"# Markers found: {', '.join(found.markers)} (select with m = \"...\", e.g. a slow selection).")
    lines += ["[[pytest]]", 'name = "unit"', f"paths = {json.dumps(list(found.test_dirs))}",
              'k = ""                          # -k expression', 'm = ""                          # -m expression',
              'args = []', 'workers = 0                     # pytest-xdist -n: 0 off, a number or "auto"',
              'chips = ["cpu", "gpu"]          # chip classes that run it', "timeout_s = 900", ""]
    if "slow" in found.markers:
        lines[lines.index('m = ""                          # -m expression')] = \
            'm = "not slow"                  # -m expression'
    return lines


def _function_sections(found: RepoScan) -> list[str]:
    if not found.functions:
        return ["# No benchmark functions found (decorated with harness.bench.benchmark). One looks like:",
                "#   from harness.bench import benchmark",
                "#   @benchmark(flops=lambda N, **_: 2 * N**3)",
                "#   def bench_matmul(N): ...; return lambda: a @ a",
                "# [[function]]", '# target = "mypkg.bench:bench_matmul"', "# grid.gpu = { N = [1024, 4096] }", ""]
    lines = ["# Benchmark functions found (harness.bench.benchmark). Each grid point is one job; sizes without a",
             "# default in the signature are placeholders: set the sizes you ship."]
    for fn in found.functions:
        module, function = fn.target.split(":")
        lines += ["[[function]]", f"target = {_toml_str(fn.target)}", f"name = {_toml_str(function)}"]
        if fn.params:
            lines += [f"grid.cpu = {_grid(fn, 'cpu')}", f"grid.gpu = {_grid(fn, 'gpu')}"]
        if fn.takes_dtype:
            lines.append('dtypes = ["float32", "float16"]')
        lines += ["timeout_s = 120", ""]
    return lines


def _kernel_sections(found: RepoScan) -> list[str]:
    if not found.kernels:
        return ["# Registered kernels (kernels.base.register(Kernel(...)) in a module listed in [suite] plugins)",
                "# get [[correctness]] checks and [[benchmark]] variant grids: docs/harness-toml.md.", ""]
    kernel = found.kernels[0]
    shape = {key: 1 for key in kernel.shape_keys} or {"N": 1}
    grid = {key: [64] for key in shape}
    variants = json.dumps(list(kernel.variants)) if kernel.variants else '"all"'
    lines = [f"# Registered kernels found: {', '.join(f'{k.name} ({k.module})' for k in found.kernels)}.",
             f"# To check {kernel.name} against its reference and time its variants, add {kernel.module!r} to",
             "# [suite] plugins and uncomment (shape keys guessed from the module: set the real sizes):",
             "# [[correctness]]", f'# name = "{kernel.name}-reference"', f'# kernel = "{kernel.name}"',
             '# variants = "all"', '# dtypes = ["float32", "float16"]', '# checks = ["reference"]',
             f"# shapes = [{_inline(shape)}]", "#", "# [[benchmark]]", f'# name = "{kernel.name}-variants"',
             f'# kernel = "{kernel.name}"', f"# variants = {variants}", '# dtypes = ["float16"]',
             f"# grid.gpu = {_inline(grid)}", ""]
    return lines


def _inline(table: dict) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in table.items()) + " }"


def render_toml(found: RepoScan) -> str:
    """A commented ``harness.toml`` for the scanned repository (the schema: harness/spec/suite.py)."""
    lines = [
        "# The harness's suite for this repository (generated by `harness init`; edit freely).",
        "# Every key: docs/harness-toml.md. Commit it, then try it here: harness run (the tutorial: docs/tutorial.md).",
        "",
        "[suite]",
        f"name = {_toml_str(found.name)}",
        "plugins = []                    # modules that register kernels (see the [[correctness]] example below)",
        "",
    ]
    if found.installable:
        lines += ["[install]                       # an isolated environment per install key (pyproject, locks)",
                  'command = "pip install -e . --no-deps"', "timeout_s = 900",
                  "per_commit = false              # true: a fresh environment per commit (compiled extensions)", ""]
    lines += ["[timing]                        # the timing protocol of every benchmark",
              "samples = 10                    # samples per job process",
              "trials = 3                      # job processes per benchmark and run (the unit of evidence)", ""]
    lines += _pytest_sections(found) + _function_sections(found) + _kernel_sections(found)
    for warning in found.warnings:
        lines.insert(3, f"# WARNING: {warning}")
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------------------------------------
# The harness's install source
# ---------------------------------------------------------------------------------------------------------------


def source_from_direct_url(direct_url: dict) -> str | None:
    """A pinned pip requirement for the harness from its PEP 610 ``direct_url.json``: a git install gives
    ``mlx-kernel-harness @ git+URL@COMMIT``; anything else (a local folder, an editable checkout) gives None."""
    vcs = direct_url.get("vcs_info") or {}
    url = direct_url.get("url", "")
    if vcs.get("vcs") == "git" and vcs.get("commit_id") and not url.startswith("file:"):
        return f"{DISTRIBUTION} @ git+{url}@{vcs['commit_id']}"
    return None


def installed_source() -> str | None:
    """Where this harness was installed from, pinned to the commit (None when not from a public git URL)."""
    try:
        text = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not text:
        return None  # installed from an index: pin the version
    try:
        return source_from_direct_url(json.loads(text))
    except json.JSONDecodeError:
        return None


def index_source() -> str | None:
    """``mlx-kernel-harness==X`` when this harness came from a package index (no direct URL recorded)."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    if dist.read_text("direct_url.json") or not dist.read_text("INSTALLER"):  # a URL, or a source tree's egg-info
        return None
    return f"{DISTRIBUTION}=={dist.version}"


# ---------------------------------------------------------------------------------------------------------------
# Workflows
# ---------------------------------------------------------------------------------------------------------------

MAC_RUNNERS = """${{ fromJSON(vars.HARNESS_MAC_RUNNERS || '[["self-hosted", "macOS", "ARM64"]]') }}"""
CLUSTER_RUNNER = """${{ fromJSON(vars.HARNESS_RUNNER || '["self-hosted"]') }}"""
SERVICE_RUNNER = """${{ fromJSON(vars.HARNESS_SERVICE_RUNNER || '["ubuntu-latest"]') }}"""
CHIP_KEY = """harness chips --format json | python -c "import json, sys; print(json.load(sys.stdin)['key'])\""""


def _header(topology: str, what: str) -> str:
    settings = {
        "shared-db": ("#   vars.HARNESS_MAC_RUNNERS     JSON list of runner label lists, one per benchmark machine\n"
                      '#                                (default [["self-hosted", "macOS", "ARM64"]]: your own Macs;\n'
                      "#                                GitHub's hosted macOS runners have a paravirtual GPU, unfit\n"
                      "#                                for timing: docs/macs.md)\n"
                      "#   vars.HARNESS_SERVICE_RUNNER  labels of the runner that renders the report (must reach\n"
                      '#                                the database; default ["ubuntu-latest"])\n'
                      "#   secrets.HARNESS_DB           the shared database, postgresql+psycopg://user:pw@host/db"),
        "bundles": ("#   vars.HARNESS_MAC_RUNNERS     JSON list of runner label lists, one per benchmark machine\n"
                    '#                                (default [["self-hosted", "macOS", "ARM64"]]: your own Macs)\n'
                    "#   vars.HARNESS_SERVICE_RUNNER  labels of the collector (imports every bundle, renders the\n"
                    '#                                report; default ["ubuntu-latest"])\n'
                    "#   secrets.HARNESS_DB           the collector's database (only the collector uses it)"),
        "cluster": ("#   vars.HARNESS_RUNNER          labels of a runner that reaches the cluster (default\n"
                    '#                                ["self-hosted"]), not one of the benchmark nodes\n'
                    "#   vars.HARNESS_RAY_ADDRESS     the cluster's Jobs API, e.g. http://10.0.0.5:8265\n"
                    "#   secrets.HARNESS_DB           the shared database the nodes write to\n"
                    "#   secrets.RAY_AUTH_TOKEN       the cluster's token (--auth-mode token)"),
    }[topology]
    return (f"# {what}\n# Generated by `harness init --topology {topology}` (docs/ci.md, docs/topology.md).\n"
            f"# Settings (Settings > Secrets and variables > Actions); a missing one fails the job with its name:\n"
            f"{settings}\n")


def _setup_steps(fetch_depth: bool = True) -> str:
    checkout = ("      - uses: actions/checkout@v4\n        with:\n          fetch-depth: 0  # full history: parents "
                "and merge bases\n") if fetch_depth else ""
    return (f"{checkout}      - uses: actions/setup-python@v5\n        with:\n"
            f'          python-version: "{PYTHON_VERSION}"\n'
            "      - name: Install the harness\n"
            '        run: python -m pip install "$HARNESS_SOURCE"\n')


def _check_step(*names: str) -> str:
    checks = "\n".join(
        f'          test -n "${name}" || {{ echo "::error::{_what(name)} is not set (docs/ci.md, Settings)"; '
        "exit 2; }" for name in names)
    return f"      - name: Check the settings\n        run: |\n{checks}\n"


def _what(name: str) -> str:
    return f"repository variable {name}" if name == "HARNESS_RAY_ADDRESS" else f"secret {name}"


def _env(topology: str, indent: str = "      ") -> str:
    lines = ["HARNESS_DB: ${{ secrets.HARNESS_DB }}"]
    if topology == "cluster":
        lines += ["HARNESS_RAY_ADDRESS: ${{ vars.HARNESS_RAY_ADDRESS }}",
                  "RAY_AUTH_MODE: ${{ secrets.RAY_AUTH_TOKEN != '' && 'token' || 'disabled' }}",
                  "RAY_AUTH_TOKEN: ${{ secrets.RAY_AUTH_TOKEN }}"]
    return "".join(f"{indent}{line}\n" for line in lines)


def _top(source: str) -> str:
    return ("permissions:\n  contents: read\n\nenv:\n"
            f"  HARNESS_SOURCE: {_toml_str(source)}  # the harness, pinned (docs/ci.md)\n"
            '  RAY_USAGE_STATS_ENABLED: "0"\n')


MEASURE_COMMITS = """\
          if [ -z "$COMMITS" ]; then
            set -- "$GITHUB_SHA"
          else  # backfill: shas, or ranges A..B (oldest first)
            set -- $(for c in $COMMITS; do
              case "$c" in *..*) git rev-list --reverse "$c" ;; *) git rev-parse --verify "$c^{commit}" ;; esac
            done)
          fi
          rc=0
          for sha in "$@"; do
            echo "::group::measure $sha"
            MEASURE_COMMAND || { code=$?; [ "$code" -gt "$rc" ] && rc=$code; }
            echo "::endgroup::"
          done
          exit "$rc"
"""

COMPARE_PARENT = """\
      - name: Compare with the parent commit
        if: ${{ !cancelled() }}
        run: |
          parent=$(git rev-parse --verify -q "$GITHUB_SHA^" || true)
          if [ -z "$parent" ]; then echo "::notice::$GITHUB_SHA has no parent: nothing to compare"; exit 0; fi
CHIPLINE          set +e
          harness compare "$parent" "$GITHUB_SHA" --db "DB"CHIP --format markdown > compare.md 2> compare.err
          code=$?
          set -e
          case "$code" in
            0|1) cat compare.md >> "$GITHUB_STEP_SUMMARY" ;;
            *) echo "::warning::not compared with the parent $parent: $(tail -n 1 compare.err) -- measure it:"\\
                 "run harness-measure with commits=$parent (docs/ci.md, Backfill)" ;;
          esac
"""


def _measure_job(topology: str, event: str) -> str:
    """The job(s) that measure: on push/backfill the branch's commits, on a pull request its head commit."""
    commits_env = "      COMMITS: ${{ inputs.commits }}\n" if event == "push" else \
        "      COMMITS: ${{ github.event.pull_request.head.sha }}\n"
    if topology == "cluster":
        command = ('harness submit --address "$HARNESS_RAY_ADDRESS" --commit "$sha" '
                   '--repo "$GITHUB_SERVER_URL/$GITHUB_REPOSITORY" --db "$HARNESS_DB" --wait --timeout 12600')
        return ("  measure:\n"
                f"    runs-on: {CLUSTER_RUNNER}\n    timeout-minutes: 240\n    env:\n{_env(topology)}{commits_env}"
                f"    steps:\n{_setup_steps()}{_check_step('HARNESS_RAY_ADDRESS', 'HARNESS_DB')}"
                "      - name: Submit to the cluster and wait\n        run: |\n"
                + MEASURE_COMMITS.replace("MEASURE_COMMAND", command))
    db = '"$HARNESS_DB"' if topology == "shared-db" else "sqlite:///harness-out/results.db"
    command = f'harness run --repo . --commit "$sha" --db {db} --no-report'
    job = ("  measure:\n    strategy:\n      fail-fast: false\n      matrix:\n"
           f"        runner: {MAC_RUNNERS}\n    runs-on: ${{{{ matrix.runner }}}}\n    timeout-minutes: 240\n"
           f"    env:\n{_env(topology) if topology == 'shared-db' else ''}{commits_env}"
           f"    steps:\n{_setup_steps()}"
           + (_check_step("HARNESS_DB") if topology == "shared-db" else "")
           + "      - name: Which chip\n        run: harness chips\n"
           "      - name: Measure\n        run: |\n" + MEASURE_COMMITS.replace("MEASURE_COMMAND", command))
    if topology == "shared-db" and event == "push":
        job += COMPARE_PARENT.replace("DB", "$HARNESS_DB").replace("CHIPLINE", f"          chip=$({CHIP_KEY})\n") \
            .replace("CHIP", ' --chip "$chip"')
    if topology == "bundles":
        job += ("      - name: Bundle the results\n        if: ${{ !cancelled() }}\n        run: |\n"
                f"          key=$({CHIP_KEY})\n"
                "          harness export --db sqlite:///harness-out/results.db \\\n"
                '            --out "bundles/$key-$GITHUB_RUN_ID.bundle"\n'
                "      - uses: actions/upload-artifact@v4\n        if: ${{ !cancelled() }}\n        with:\n"
                "          name: harness-bundle-${{ strategy.job-index }}\n          path: bundles\n"
                "          if-no-files-found: error\n          retention-days: 7\n")
    return job


def _collect_steps() -> str:
    """Bundles: the collector imports every runner's bundle into ``$HARNESS_DB``."""
    return ("      - uses: actions/download-artifact@v4\n        with:\n          pattern: harness-bundle-*\n"
            "          merge-multiple: true\n          path: bundles\n"
            "      - name: Import the bundles\n        run: |\n"
            "          ls bundles/*.bundle\n"
            '          for bundle in bundles/*.bundle; do harness import --db "$HARNESS_DB" "$bundle"; done\n')


def measure_workflow(topology: str, source: str, branch: str) -> str:
    """Measure every push to ``branch`` (and backfill on demand), then render the report and publish it on Pages."""
    collect = _collect_steps() if topology == "bundles" else ""
    checkout_for_compare = "      - uses: actions/checkout@v4\n        with:\n          fetch-depth: 0\n"
    compare = "" if topology == "shared-db" else \
        COMPARE_PARENT.replace("DB", "$HARNESS_DB").replace("CHIPLINE", "").replace("CHIP", "")
    return (
        _header(topology, f"Measure every push to {branch} (and backfill on demand), render the report, publish it.")
        + "# Pages: Settings > Pages > Source: GitHub Actions (set vars.HARNESS_PAGES to \"false\" to skip it).\n"
        "name: harness-measure\n\n"
        f"on:\n  push:\n    branches: [{_toml_str(branch)}]\n  workflow_dispatch:\n    inputs:\n      commits:\n"
        '        description: "Backfill: commits to measure (shas or ranges A..B, space-separated; empty: the tip)"\n'
        '        required: false\n        default: ""\n\n'
        + _top(source)
        + "\nconcurrency:  # one measurement at a time per branch; a newer push waits, it does not cancel\n"
        "  group: harness-measure-${{ github.ref }}\n  cancel-in-progress: false\n\njobs:\n"
        + _measure_job(topology, "push")
        + "\n  report:\n    needs: measure\n    if: ${{ !cancelled() }}\n"
        f"    runs-on: {SERVICE_RUNNER}\n    timeout-minutes: 60\n    env:\n{_env('shared-db')}"
        f"    steps:\n{checkout_for_compare}{_setup_steps(fetch_depth=False)}{_check_step('HARNESS_DB')}"
        + collect + compare
        + '      - name: Render the report\n        run: harness report --db "$HARNESS_DB" --out site\n'
        "      - uses: actions/upload-artifact@v4\n        with:\n          name: harness-report\n"
        "          path: site\n          if-no-files-found: error\n"
        "      - uses: actions/upload-pages-artifact@v3\n        if: ${{ vars.HARNESS_PAGES != 'false' }}\n"
        "        with:\n          path: site\n"
        "\n  pages:\n    needs: report\n    if: ${{ vars.HARNESS_PAGES != 'false' }}\n"
        "    runs-on: ubuntu-latest\n    timeout-minutes: 10\n    permissions:\n      pages: write\n"
        "      id-token: write\n    environment:\n      name: github-pages\n"
        "      url: ${{ steps.deploy.outputs.page_url }}\n    steps:\n      - id: deploy\n"
        "        uses: actions/deploy-pages@v4\n"
    )


GATE_COMPARE = """\
      - name: Merge base
        if: ${{ !cancelled() }}
        run: |
          base=$(git merge-base "origin/$BASE_REF" "$HEAD_SHA")
          echo "BASE_SHA=$base" >> "$GITHUB_ENV"
          echo "comparing $HEAD_SHA with the merge base $base of $BASE_REF (not the tip of $BASE_REF)"
      - name: Compare with the merge base
        if: ${{ !cancelled() }}
        run: |
          mkdir -p gate
          name=NAME
          set +e
          harness compare "$BASE_SHA" "$HEAD_SHA" --db "$HARNESS_DB"CHIPSETTLE --format markdown \\
            > "gate/$name.md" 2> compare.err
          code=$?
          set -e
          if [ "$code" -ge 2 ]; then
            { echo "### $name: no comparison"; echo; sed 's/^/    /' compare.err; echo
              echo "The merge base $BASE_SHA must be measured first: run harness-measure with commits=$BASE_SHA"
              echo "(docs/ci.md, Backfill)."; } > "gate/$name.md"
          fi
          echo "$code" > "gate/$name.code"
          cat "gate/$name.md" >> "$GITHUB_STEP_SUMMARY"
"""

GATE_VERDICT = """\
      - name: Post the comment
        env:
          GH_TOKEN: ${{ github.token }}
          GH_REPO: ${{ github.repository }}
          PR: ${{ github.event.pull_request.number }}
        run: |
          { echo "## Benchmark gate: $HEAD_SHA against the merge base"; echo
            cat gate/*.md 2>/dev/null || echo "No chip compared: see the measure jobs of this run."; } > comment.md
          gh pr comment "$PR" --body-file comment.md --edit-last || gh pr comment "$PR" --body-file comment.md
      - name: Gate
        run: |
          ls gate/*.code > /dev/null 2>&1 || { echo "::error::no chip compared (see the measure jobs)"; exit 2; }
          worst=0
          for f in gate/*.code; do code=$(cat "$f"); [ "$code" -gt "$worst" ] && worst=$code; done
          case "$worst" in
            0) echo "no confirmed regression, no correctness failure (inconclusive rows pass: see the comment)" ;;
            1) echo "::error::a confirmed regression or a correctness failure (see the comment)"; exit 1 ;;
            *) echo "::error::the comparison could not be made (see the comment)"; exit 2 ;;
          esac
"""


def gate_workflow(topology: str, source: str) -> str:
    """Pull requests: measure the head commit, compare it with the merge base, comment, fail on a regression."""
    settle = " --settle"
    settling = ("harness compare --settle\n# measures more trials where a verdict is inconclusive)"
                if topology == "shared-db" else
                "no settling here:\n# inconclusive rows stay inconclusive, docs/topology.md)")
    head = (f"# Pull requests: measure the head commit, compare it with the merge base ({settling}, comment on\n"
            "# the pull request, fail on a\n"
            "# confirmed regression or a correctness failure. Make the job `verdict` a required status check\n"
            "# (Settings > Branches > branch protection rule > Require status checks) so a red gate blocks merging.\n"
            "# The merge base must already be measured on each chip (by harness-measure when it landed): else the\n"
            "# gate says so and exits 2. Pull requests from forks get no secrets: the gate then fails by name.\n")
    env_pr = ("      HEAD_SHA: ${{ github.event.pull_request.head.sha }}\n"
              "      BASE_REF: ${{ github.event.pull_request.base.ref }}\n")
    if topology == "shared-db":
        # --settle compares this machine's chip (its own --chip) and re-measures the inconclusive series here
        compare = GATE_COMPARE.replace("NAME", f'"$({CHIP_KEY})"').replace("CHIP", "").replace("SETTLE", settle)
        jobs = (_measure_job(topology, "pr").replace("      COMMITS:", env_pr + "      COMMITS:")
                + compare
                + "      - uses: actions/upload-artifact@v4\n        if: ${{ !cancelled() }}\n        with:\n"
                "          name: harness-gate-${{ strategy.job-index }}\n          path: gate\n"
                "\n  verdict:\n    needs: measure\n    if: ${{ !cancelled() }}\n    runs-on: ubuntu-latest\n"
                f"    timeout-minutes: 10\n    env:\n{env_pr}    steps:\n"
                "      - uses: actions/download-artifact@v4\n        with:\n          pattern: harness-gate-*\n"
                "          merge-multiple: true\n          path: gate\n" + GATE_VERDICT)
    else:
        # One place compares every chip: the collector (bundles) or the submitting runner (cluster). --settle
        # needs the chip it measures on, which neither has: inconclusive rows stay inconclusive (docs/topology.md).
        compare = GATE_COMPARE.replace("NAME", '"all-chips"').replace("CHIP", "").replace("SETTLE", "")
        measure = _measure_job(topology, "pr").replace("      COMMITS:", env_pr + "      COMMITS:")
        service = ("\n  verdict:\n    needs: measure\n    if: ${{ !cancelled() }}\n"
                   f"    runs-on: {SERVICE_RUNNER}\n    timeout-minutes: 60\n    env:\n{_env('shared-db')}{env_pr}"
                   f"    steps:\n{_setup_steps()}{_check_step('HARNESS_DB')}"
                   + (_collect_steps() if topology == "bundles" else "") + compare + GATE_VERDICT)
        jobs = measure + service
    return (head + _header(topology, "The pull-request gate.") + "name: harness-gate\n\n"
            "on:\n  pull_request:\n    types: [opened, synchronize, reopened]\n\n"
            + _top(source).replace("  contents: read\n", "  contents: read\n  pull-requests: write  # the comment\n")
            + "\nconcurrency:  # a newer push to the pull request replaces the gate in progress\n"
            "  group: harness-gate-${{ github.event.pull_request.number }}\n  cancel-in-progress: true\n\njobs:\n"
            + jobs)


def render_files(found: RepoScan, topology: str, source: str, branch: str) -> dict[str, str]:
    """Every file ``harness init`` writes, by path relative to the repository root."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"--topology must be one of {', '.join(TOPOLOGIES)}, not {topology!r}")
    return {"harness.toml": render_toml(found),
            MEASURE_WORKFLOW: measure_workflow(topology, source, branch),
            GATE_WORKFLOW: gate_workflow(topology, source)}
