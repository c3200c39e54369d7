"""Start and stop the Ray processes of a harness cluster: a head, and chip-labelled worker nodes.

Every process is a ``ray start --block`` that we launch in its own process group and record in a state file
(pid, process group, address, session folder, log). Stopping sends SIGTERM to that one process (Ray drains the
node and ends its own children), then SIGKILL to its process group if anything is left. Nothing here ever runs
``ray stop``: that would end every Ray process on the machine, other users' clusters included.
"""

from __future__ import annotations

import json
import os
import platform
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.core import config
from harness.core.errors import HarnessError

AUTH_MODES = ("disabled", "token")
MACOS_CLUSTER_FLAG = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
MACOS_NOTE = (f"macOS: Ray supports multi-node clusters officially on Linux only; setting {MACOS_CLUSTER_FLAG}=1 "
              "so this node may join one (see docs/cluster.md)")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"  # Ray's own: the token, or a file holding it
RAY_DEFAULT_TOKEN = Path.home() / ".ray" / "auth_token"  # where Ray looks last (`ray get-auth-token --generate`)
# In the head's environment (so in every job the Jobs API runs there): the Python that started it, which has the
# harness installed. `harness submit` runs its driver with it (not whatever `python` the head's PATH finds: a head
# started as `.venv/bin/harness cluster up`, the venv not activated, has none with the harness).
HEAD_PYTHON_ENV = "HARNESS_HEAD_PYTHON"
# what a --dry-run shows of the env (never the token itself: only the file that holds it)
SHOWN_ENV = ("RAY_USAGE_STATS_ENABLED", "RAY_AUTH_MODE", TOKEN_PATH_ENV, MACOS_CLUSTER_FLAG, HEAD_PYTHON_ENV)
SESSION_IN_LOG = re.compile(r"(\S*/session_[0-9_-]+)(?=/logs/)")
ANSI_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")  # Ray styles its terminal output (bold paths)
STARTED = "Ray runtime started"
REFUSED_TOKEN = "InvalidAuthToken"  # what a node's `ray start` logs when the GCS refuses its token
LOOPBACK_JOIN = "harness.cluster.nodes"  # `python -m` this module = `ray`, joining a loopback head as is


def state_dir() -> Path:
    return config.cache_dir() / "cluster"


@dataclass
class Launched:
    """One ``ray start --block`` process we started: enough to find and stop exactly it later."""

    role: str  # "head" or "node"
    pid: int
    pgid: int
    address: str  # the GCS address nodes and drivers connect to (HEAD:PORT)
    log: str
    command: list[str]
    dashboard: str = ""
    chip: str = ""
    session_dir: str = ""
    auth_mode: str = "disabled"
    token_file: str = ""  # with auth mode token: the file holding the token (never the token itself)
    python: str = ""  # a head: the Python its submitted drivers run with (HEAD_PYTHON_ENV)
    started_at: float = 0.0
    state_file: str = ""

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.state_file = str(path)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Launched:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise HarnessError(f"cannot read cluster state {path}: {exc}") from None
        launched = cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        launched.state_file = str(path)
        return launched


def ray_executable() -> str:
    """The ``ray`` CLI of this Python environment (the one whose Ray the harness imports)."""
    beside = Path(sys.executable).with_name("ray")
    if beside.exists():
        return str(beside)
    found = shutil.which("ray")
    if not found:
        raise HarnessError("the `ray` command is not installed (pip install 'ray[default]')")
    return found


def auth_mode(requested: str | None) -> str:
    """``--auth-mode``, else ``$RAY_AUTH_MODE``, else "disabled": always explicit in the Ray processes' env."""
    mode = (requested or os.environ.get("RAY_AUTH_MODE") or "disabled").lower()
    if mode not in AUTH_MODES:
        raise HarnessError(f"--auth-mode must be one of {', '.join(AUTH_MODES)}, not {mode!r}")
    return mode


def read_token(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise HarnessError(f"cannot read the Ray auth token file {path}: {exc.strerror}") from None
    if not token:
        raise HarnessError(f"the Ray auth token file {path} is empty")
    return token


def find_token(mode: str, token_file: Path | None = None) -> tuple[str, Path | None]:
    """The token of a token-auth cluster, as Ray looks for it: ``--token-file``, else ``$RAY_AUTH_TOKEN``, else
    ``$RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``. Returns (token, file or None); ("", None) without auth."""
    if mode != "token":
        return "", None
    if token_file:
        return read_token(token_file), token_file
    if os.environ.get(TOKEN_ENV, "").strip():
        return os.environ[TOKEN_ENV].strip(), None
    if os.environ.get(TOKEN_PATH_ENV):
        path = Path(os.environ[TOKEN_PATH_ENV]).expanduser()
        return read_token(path), path
    if RAY_DEFAULT_TOKEN.is_file():
        return read_token(RAY_DEFAULT_TOKEN), RAY_DEFAULT_TOKEN
    raise HarnessError("--auth-mode token needs the head's token: pass --token-file PATH (the file `harness "
                       f"cluster up` printed) or set ${TOKEN_ENV}")


def new_token_file(path: Path) -> Path:
    """A fresh random token (as ``ray get-auth-token --generate`` makes one) in ``path``, readable by this user only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32))
    os.chmod(path, 0o600)
    return path


def auth_headers(token: str) -> dict[str, str]:
    """What Ray's dashboard (Jobs API) checks with token auth."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def ray_env(mode: str, *, joining: bool, system: str | None = None,
            token_file: Path | None = None, loopback_head: bool = False) -> tuple[dict[str, str], list[str]]:
    """The environment of a ``ray start``: usage stats off, explicit auth mode, the token's file (token auth), the
    macOS cluster opt-in. Returns the environment and the notes to show the user.
    """
    env = dict(os.environ)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["RAY_AUTH_MODE"] = mode
    if mode == "token" and token_file:
        env[TOKEN_PATH_ENV] = str(token_file)  # the file, so the token is in no process's environment
        env.pop(TOKEN_ENV, None)
    notes = []
    system = system or platform.system()
    if loopback_head:
        # A head on loopback: Ray resolves its node address (GCS, raylet, agents...) to 127.0.0.1 only while this is
        # 0 (it rewrites `--node-ip-address 127.0.0.1` to the LAN address otherwise). Nodes of the same machine
        # still join it (they run with 1: `ray start --address` refuses 0).
        env[MACOS_CLUSTER_FLAG] = "0"
    elif system == "Darwin":
        env[MACOS_CLUSTER_FLAG] = "1"
        notes.append(MACOS_NOTE)
    elif joining:
        # Ray refuses `ray start --address` when this is 0 (a loopback-only test setting), on any platform.
        env[MACOS_CLUSTER_FLAG] = "1"
    return env, notes


def shell_line(command: list[str], env: dict[str, str]) -> str:
    """``command`` run with the Ray variables of ``env``, as one line a POSIX shell runs as is (every word quoted:
    ``--resources '{"harness_node": 1.0}'`` stays one argument)."""
    assignments = [f"{key}={shlex.quote(env[key])}" for key in SHOWN_ENV if key in env]
    return " ".join([*assignments, shlex.join(command)])


def head_command(*, port: int, host: str, dashboard_port: int, dashboard: bool = True,
                 client_port: int | None = None, chip: str | None = None,
                 extra: tuple[str, ...] = ()) -> list[str]:
    """``ray start --head``; with ``chip`` the head is also a node of that chip (a one-machine cluster)."""
    command = [ray_executable(), "start", "--head", "--port", str(port), "--node-ip-address", host,
               "--disable-usage-stats", "--block", "--include-dashboard", "true" if dashboard else "false"]
    command += _worker_args(chip) if chip else ["--num-cpus", "0", "--num-gpus", "0"]  # drivers only
    if dashboard:
        command += ["--dashboard-host", host, "--dashboard-port", str(dashboard_port)]
    if client_port is not None:
        command += ["--ray-client-server-port", str(client_port)]
    return command + list(extra)


def _worker_args(chip: str) -> list[str]:
    from harness.execute.ray_executor import node_labels, node_resources  # loads ray: only when needed

    labels = ",".join(f"{k}={v}" for k, v in node_labels(chip).items())
    return ["--labels", labels, "--resources", json.dumps(node_resources())]


def _given(extra: tuple[str, ...], option: str) -> bool:
    return any(part == option or part.startswith(option + "=") for part in extra)


def node_command(*, address: str, chip: str, node_ip: str | None = None, num_cpus: int | None = None,
                 extra: tuple[str, ...] = ()) -> list[str]:
    """``ray start --address`` labelled ``chip=KEY``. Joining a loopback head (several nodes on one machine) the node
    binds to loopback too and gets its own dashboard-agent port and temp folder (Ray's defaults are one per machine:
    port 52365, /tmp/ray), unless ``extra`` sets them."""
    host = address.rsplit(":", 1)[0]
    # Joining a loopback head, `ray start` runs through LOOPBACK_JOIN (see there); otherwise as is.
    ray = [sys.executable, "-m", LOOPBACK_JOIN] if is_loopback(host) else [ray_executable()]
    command = [*ray, "start", "--address", address, *_worker_args(chip), "--disable-usage-stats", "--block"]
    if is_loopback(host):
        agent_port = free_port()
        if not _given(extra, "--dashboard-agent-listen-port"):
            command += ["--dashboard-agent-listen-port", str(agent_port)]
        if not _given(extra, "--temp-dir"):  # short: Ray's socket paths under it must fit 107 bytes
            command += ["--temp-dir", f"{_own_temp_prefix()}{agent_port}"]
    if node_ip:
        command += ["--node-ip-address", node_ip]
    if num_cpus is not None:
        command += ["--num-cpus", str(num_cpus)]
    return command + list(extra)


def _own_temp_prefix() -> str:
    return str(Path(tempfile.gettempdir()) / f"hr-{os.getuid()}-")


def _remove_own_temp_dir(command: list[str]) -> None:
    """The temp folder ``node_command`` chose for a loopback node (never one the user passed): removed once the node
    is stopped, so they do not pile up in /tmp."""
    if "--temp-dir" in command[:-1]:
        folder = command[command.index("--temp-dir") + 1]
        if folder.startswith(_own_temp_prefix()) and folder[len(_own_temp_prefix()):].isdigit():
            shutil.rmtree(folder, ignore_errors=True)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _tcp_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _http_ok(url: str, headers: dict[str, str] | None = None) -> bool:
    request = urllib.request.Request(url, headers=headers or {})  # noqa: S310 - our own dashboard URL
    try:
        with urllib.request.urlopen(request, timeout=2) as response:  # noqa: S310 - our own dashboard URL
            return response.status == 200
    except OSError:  # refused, not up yet, or 401 (a wrong token: the timeout then says so with the log)
        return False


def plain(text: str) -> str:
    """Ray's output without its terminal styling (ANSI escapes): what we parse and show."""
    return ANSI_ESCAPE.sub("", text)


def _log_tail(path: Path, lines: int = 8) -> str:
    return "\n".join(_read(path).splitlines()[-lines:])


def launch(role: str, command: list[str], env: dict[str, str], log_path: Path, *, ready, address: str,
           timeout_s: float = 120, **fields) -> Launched:
    """Start ``command`` in its own process group, logging to ``log_path``; wait until ``ready()`` or fail.

    The log is this session's only: an earlier session's log (same state file) is kept as ``*.previous.log``, never
    appended to, so its "Ray runtime started" and session folder can neither satisfy nor mislead this start.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if log_path.exists():
        log_path.replace(log_path.with_suffix(".previous.log"))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    launched = Launched(role, proc.pid, os.getpgid(proc.pid), address, str(log_path), command,
                        started_at=time.time(), **fields)
    deadline = time.monotonic() + timeout_s
    while True:
        code = proc.poll()
        if code is not None:
            raise HarnessError(f"`ray start` ({role}) exited with status {code}:\n{_log_tail(log_path)}")
        if STARTED in _read(log_path) and ready():
            break
        if REFUSED_TOKEN in _read(log_path):  # Ray itself retries for minutes: it never gets better
            stop(launched)
            raise HarnessError(f"the Ray head refused this {role}'s auth token (not the head's token file)")
        if time.monotonic() > deadline:
            stop(launched)
            raise HarnessError(f"the Ray {role} did not start within {timeout_s:g} s:\n{_log_tail(log_path)}")
        time.sleep(0.5)
    match = SESSION_IN_LOG.search(_read(log_path))
    launched.session_dir = match.group(1) if match else ""
    return launched


def _read(path: Path) -> str:
    """A log of Ray's output as plain text (terminal styling removed)."""
    try:
        return plain(path.read_text(errors="replace"))
    except OSError:
        return ""


def start_head(*, port: int, host: str = "127.0.0.1", dashboard_port: int = 8265, mode: str = "disabled",
               state: Path | None = None, client_port: int | None = None, chip: str | None = None,
               extra: tuple[str, ...] = (), timeout_s: float = 120, token_file: Path | None = None,
               python: str | None = None) -> Launched:
    """Start a Ray head bound to ``host`` and record it; refuses a port already taken or a state already live.

    ``python`` (default: this one, which has the harness) is what its submitted drivers run with: it is in the head's
    environment as ``$HARNESS_HEAD_PYTHON``, which ``harness submit``'s entrypoint uses unless told ``--python``.

    With token auth the token is ``token_file``, else Ray's own sources (``$RAY_AUTH_TOKEN``...), else a new one in
    ``head-PORT.token`` beside the state file (mode 0600); the readiness check sends it to the dashboard.
    """
    state = state or state_dir() / f"head-{port}.json"
    if state.exists():
        old = Launched.load(state)
        if is_ours(old):
            raise HarnessError(f"a head started by harness is already running on port {port} (pid {old.pid}); "
                               f"`harness cluster down --port {port}` stops it")
        state.unlink()
    probe_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    for option, number in (("port", port), ("dashboard-port", dashboard_port)):
        if _tcp_open(probe_host, number):
            raise HarnessError(f"port {number} on {host} is already in use; pick another with --{option}")
    token = ""
    if mode == "token":
        try:
            token, token_file = find_token(mode, token_file)
        except HarnessError:
            if token_file:  # the file named does not hold a token: say so
                raise
            token_file = new_token_file(state.with_suffix(".token"))  # none anywhere: a new cluster, a new token
            token = read_token(token_file)
    env, notes = ray_env(mode, joining=False, token_file=token_file, loopback_head=is_loopback(host))
    python = head_python(python)
    env[HEAD_PYTHON_ENV] = python
    command = head_command(port=port, host=host, dashboard_port=dashboard_port, client_port=client_port, chip=chip,
                           extra=extra)
    dashboard = f"http://{probe_host}:{dashboard_port}"
    headers = auth_headers(token)
    launched = launch("head", command, env, state.with_suffix(".log"), address=f"{probe_host}:{port}",
                      ready=lambda: _tcp_open(probe_host, port) and _http_ok(f"{dashboard}/api/version", headers),
                      timeout_s=timeout_s, dashboard=dashboard, auth_mode=mode, chip=chip or "",
                      token_file=str(token_file or ""), python=python)
    launched.save(state)
    for note in notes:
        print(note, file=sys.stderr)
    return launched


def head_python(python: str | None = None) -> str:
    """The Python a head runs submitted drivers with: ``python`` (a path, or a name on this PATH) checked to import the
    harness, else this process's own interpreter (the one that has the harness: a venv's, activated or not)."""
    if python is None:
        return sys.executable
    found = shutil.which(python) or python
    done = subprocess.run([found, "-c", "import harness.cluster.driver"], capture_output=True, text=True,
                          check=False, timeout=120) if Path(found).exists() else None
    if done is None or done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1] if done is not None else "no such file"
        raise HarnessError(f"--python {python} cannot run the harness's cluster driver: {last}")
    return found


def start_node(*, address: str, chip: str, node_ip: str | None = None, num_cpus: int | None = None,
               mode: str = "disabled", state: Path | None = None, extra: tuple[str, ...] = (),
               timeout_s: float = 120, token_file: Path | None = None,
               command: list[str] | None = None) -> Launched:
    """Start a worker node labelled with ``chip`` in the background and record it (``harness node leave``)."""
    env, _notes = ray_env(mode, joining=True, token_file=token_file)
    command = command or node_command(address=address, chip=chip, node_ip=node_ip, num_cpus=num_cpus, extra=extra)
    state = state or state_dir() / f"node-{chip}-{int(time.time() * 1000)}.json"
    launched = launch("node", command, env, state.with_suffix(".log"), address=address, ready=lambda: True,
                      timeout_s=timeout_s, chip=chip, auth_mode=mode, token_file=str(token_file or ""))
    launched.save(state)
    return launched


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        return [part.decode(errors="replace") for part in raw.split(b"\0") if part]
    except OSError:
        pass
    try:  # macOS: no /proc
        done = subprocess.run(["ps", "-p", str(pid), "-o", "command="], capture_output=True, text=True, timeout=5)
        return done.stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return []


def is_ours(launched: Launched) -> bool:
    """The recorded process is alive and still the ``ray start --block`` we launched (not a reused pid)."""
    argv = _argv(launched.pid)
    port = launched.address.rsplit(":", 1)[-1]
    launcher = any(Path(part).name == "ray" for part in argv[:3]) or LOOPBACK_JOIN in argv[:3]
    return launcher and "start" in argv and "--block" in argv and any(port in part for part in argv)


def _reap(pid: int) -> None:
    """Collect the exit status of ``pid`` if this process started it (else its zombie keeps its group alive)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except OSError:  # not our child (`cluster up` ran in another process): its parent or init reaps it
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop(launched: Launched, timeout_s: float = 45) -> str:
    """Stop exactly this launched ``ray start`` and its process group; returns what was done.

    Only a process verified to be that ``ray start`` (alive, same command) is signalled, and only the process group
    created for it (its pid) is killed if something outlives the SIGTERM: a stale record never hits another process.
    """
    if not is_ours(launched):
        if launched.state_file:
            Path(launched.state_file).unlink(missing_ok=True)
        if launched.role == "node":
            _remove_own_temp_dir(launched.command)
        return f"not running (stale record of pid {launched.pid} removed)"
    os.kill(launched.pid, signal.SIGTERM)  # Ray drains the node and ends its own processes
    deadline = time.monotonic() + timeout_s
    while True:
        _reap(launched.pid)
        if not _group_alive(launched.pgid) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    done = "stopped"
    if launched.pgid == launched.pid and launched.pgid != os.getpgid(0) and _group_alive(launched.pgid):
        os.killpg(launched.pgid, signal.SIGKILL)  # the group created for it, nothing else
        _reap(launched.pid)
        done = "killed"
    if launched.role == "node":
        _remove_own_temp_dir(launched.command)
    if launched.state_file:
        Path(launched.state_file).unlink(missing_ok=True)
    return done


def find_state(role: str, port: int | None = None, state: Path | None = None) -> list[Path]:
    """State files of processes this user started with harness (one explicit file, or by role/port)."""
    if state:
        if not state.exists():
            raise HarnessError(f"no cluster state at {state}")
        return [state]
    pattern = f"head-{port}.json" if (role == "head" and port) else f"{role}-*.json"
    return sorted(state_dir().glob(pattern))


def is_loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.")


def _ray_cli_keeping_loopback() -> None:
    """``ray`` (the CLI), except that a loopback head address stays loopback.

    Ray 2.60's ``ray start --address 127.0.0.1:P`` rewrites the loopback address to this machine's network address
    before connecting (``services.canonicalize_bootstrap_address`` -> ``resolve_ip_for_localhost``, whenever
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` is 1, and ``ray start --address`` refuses it at 0). A head bound to
    loopback only is not there: this keeps 127.x as it is, so the node reaches the head, takes 127.0.0.1 as its own
    address (the address it reaches the head from) and its raylet and agents bind to loopback as well.
    """
    from ray._private import services  # loads ray: only in this launcher process
    from ray.scripts.scripts import main  # loads ray: only in this launcher process

    rewrite = services.resolve_ip_for_localhost
    services.resolve_ip_for_localhost = lambda host: host if is_loopback(host) and host != "localhost" \
        else rewrite(host)
    sys.argv[0] = "ray"
    main()


if __name__ == "__main__":
    _ray_cli_keeping_loopback()
