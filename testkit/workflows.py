"""Run a GitHub workflow's jobs locally, without GitHub: the `run:` steps in order with their env (workflow, job,
step), the `${{ }}` expressions replaced by local values, `$GITHUB_ENV` / `$GITHUB_OUTPUT` / `$GITHUB_STEP_SUMMARY`
as files, and each `uses:` step replaced by its local equivalent:

- actions/checkout: the job runs in the given repository (already at the commit of the event);
- actions/setup-python: the test's interpreter is first on PATH;
- actions/upload-artifact / download-artifact: copies into and out of a local artifact folder;
- actions/upload-pages-artifact: the folder must hold an index.html (kept as the artifact "pages");
- actions/deploy-pages: nothing to deploy to (recorded as skipped).

The install step of the harness (`pip install "$HARNESS_SOURCE"`) is the one `run:` step replaced: the test's
interpreter already has this harness, as setup-python stands for the runner's; its command is returned for checks.
An expression the runner does not know fails loudly rather than turning into an empty string."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ruamel.yaml import YAML

EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
INSTALL_STEP = "Install the harness"


@dataclass
class StepResult:
    name: str
    code: int | None  # None: skipped (its `if:` was false, or a `uses:` step without a local effect)
    output: str = ""


@dataclass
class JobResult:
    steps: list[StepResult] = field(default_factory=list)

    @property
    def failed(self) -> StepResult | None:
        return next((s for s in self.steps if s.code not in (0, None)), None)

    def step(self, name: str) -> StepResult:
        return next(s for s in self.steps if s.name == name)


def load(path: Path) -> dict:
    return YAML(typ="safe").load(path.read_text())


class LocalRunner:
    def __init__(self, repo: Path, work: Path, values: dict[str, str], env: dict[str, str]):
        self.repo, self.work, self.values, self.env = repo, work, values, env
        self.artifacts = work / "artifacts"
        self.artifacts.mkdir(parents=True, exist_ok=True)

    def expand(self, text: str) -> str:
        def value(match: re.Match) -> str:
            expr = match.group(1)
            if expr not in self.values:
                raise KeyError(f"no local value for the expression ${{{{ {expr} }}}}")
            return self.values[expr]

        return EXPRESSION.sub(value, str(text))

    def condition(self, step_if: str | None, failed: bool) -> bool:
        if step_if is None:
            return not failed
        expr = EXPRESSION.sub(lambda m: m.group(1), str(step_if)).strip()
        if expr == "!cancelled()":
            return True
        if expr in self.values:
            return self.values[expr] == "true"
        raise KeyError(f"no local value for the condition {expr!r}")

    def run_job(self, workflow: dict, job_name: str) -> JobResult:
        job = workflow["jobs"][job_name]
        env = {**os.environ, **self.env}
        env.update({k: self.expand(v) for k, v in (workflow.get("env") or {}).items()})
        env.update({k: self.expand(v) for k, v in (job.get("env") or {}).items()})
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # setup-python
        files = {name: self.work / f"{job_name}.{name.lower()}" for name in
                 ("GITHUB_ENV", "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY")}
        for name, path in files.items():
            path.write_text("")
            env[name] = str(path)
        result, failed = JobResult(), False
        for index, step in enumerate(job["steps"]):
            name = step.get("name") or step.get("uses") or f"step {index}"
            if not self.condition(step.get("if"), failed):
                result.steps.append(StepResult(name, None))
                continue
            if "uses" in step:
                code = self._uses(step)
            elif name == INSTALL_STEP:
                code = None  # the test's interpreter has this harness (see the module docstring)
            else:
                step_env = {**env, **{k: self.expand(v) for k, v in (step.get("env") or {}).items()}}
                script = self.work / f"{job_name}-{index}.sh"
                script.write_text(self.expand(step["run"]))
                done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                                      cwd=self.repo, env=step_env, capture_output=True, text=True, timeout=900)
                code = done.returncode
                result.steps.append(StepResult(name, code, done.stdout + done.stderr))
                for line in files["GITHUB_ENV"].read_text().splitlines():
                    key, _, val = line.partition("=")
                    env[key] = val
                failed = failed or code != 0
                continue
            result.steps.append(StepResult(name, code))
            failed = failed or code not in (0, None)
        result.summary = files["GITHUB_STEP_SUMMARY"].read_text()  # type: ignore[attr-defined]
        return result

    def _uses(self, step: dict) -> int | None:
        action = step["uses"].split("@", 1)[0]
        args = {k: self.expand(v) for k, v in (step.get("with") or {}).items()}
        if action in ("actions/checkout", "actions/setup-python"):
            return 0  # the repository is the working folder; the interpreter is on PATH
        if action == "actions/upload-artifact":
            source = self.repo / args["path"]
            if not source.exists():
                return 1 if args.get("if-no-files-found") == "error" else 0
            shutil.copytree(source, self.artifacts / args["name"], dirs_exist_ok=True)
            return 0
        if action == "actions/download-artifact":
            target = self.repo / args.get("path", ".")
            for folder in sorted(self.artifacts.iterdir()):
                if fnmatch.fnmatch(folder.name, args.get("pattern", args.get("name", "*"))):
                    shutil.copytree(folder, target, dirs_exist_ok=True)
            return 0
        if action == "actions/upload-pages-artifact":
            source = self.repo / args["path"]
            if not (source / "index.html").is_file():
                return 1
            shutil.copytree(source, self.artifacts / "pages", dirs_exist_ok=True)
            return 0
        if action == "actions/deploy-pages":
            return None
        raise KeyError(f"no local equivalent for {action}")
