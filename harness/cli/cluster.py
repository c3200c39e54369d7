"""`harness cluster up|down|status`: the Ray head of a harness cluster, started and stopped by this command only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.common import app, console, styled
from harness.cluster import nodes as cluster
from harness.cluster.driver import connect
from harness.core.chip import detect
from harness.core.errors import HarnessError

cluster_app = typer.Typer(no_args_is_help=True, help="Start or stop the Ray head of a harness cluster.")
app.add_typer(cluster_app, name="cluster")

RayArgOption = Annotated[list[str] | None, typer.Option("--ray-arg", help="Extra `ray start` argument, repeatable "
                                                                        "(fixed ports for a firewall, object store "
                                                                        "size...): --ray-arg=--object-store-memory=1e9"
                                                      )]
TokenFileOption = Annotated[Path | None, typer.Option(
    "--token-file", help="With --auth-mode token: file holding the cluster's token (default: $RAY_AUTH_TOKEN, "
                         "$RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token; `cluster up` creates one if there is none).")]
StateOption = Annotated[Path | None, typer.Option("--state", help="State file (default: one per port under "
                                                                    "$HARNESS_CACHE/cluster).")]


@cluster_app.command("up")
def up(
    port: Annotated[int, typer.Option(help="GCS port nodes join (Ray's default 6379 is often Redis's).")] = 6380,
    dashboard_port: Annotated[int, typer.Option(help="Dashboard / Jobs API port (harness submit).")] = 8265,
    host: Annotated[str, typer.Option(help="Address to bind. Loopback unless you mean other machines to join "
                                           "(then use this machine's LAN address and --auth-mode token).")]
    = "127.0.0.1",
    auth_mode: Annotated[str | None, typer.Option(help="Ray auth: disabled or token (default $RAY_AUTH_MODE, "
                                                       "else disabled).")] = None,
    client_server_port: Annotated[int | None, typer.Option(help="Ray Client server port (Ray default 10001).")]
    = None,
    worker: Annotated[bool, typer.Option("--worker", help="The head also runs jobs, labelled with its chip "
                                                          "(a one-machine cluster, or a head with a GPU).")] = False,
    chip_label: Annotated[str | None, typer.Option(help="With --worker: chip key (default: detected).")] = None,
    ray_arg: RayArgOption = None,
    token_file: TokenFileOption = None,
    insecure: Annotated[bool, typer.Option("--insecure", help="Allow a non-loopback --host with auth disabled "
                                                              "(anyone who reaches it can run code).")] = False,
    state: StateOption = None,
    python: Annotated[str | None, typer.Option(help="Python the head runs submitted drivers with (`harness "
                                                    "submit`): it must have the harness installed. Default: the one "
                                                    "running this command.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the head to come up.")] = 120,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the ray command and environment only.")]
    = False,
) -> None:
    """Start a Ray head (usage stats off, explicit auth mode) in the background and record it."""
    from harness.execute.ray_executor import chip_label_value  # loads ray: only when this command runs

    if chip_label and not worker:
        raise HarnessError("--chip-label labels the head's own jobs: add --worker")
    chip = None
    if worker:
        chip = chip_label_value(chip_label or detect().key)
    mode = cluster.auth_mode(auth_mode)
    if not cluster.is_loopback(host) and mode == "disabled":
        if not insecure:
            raise HarnessError(f"--host {host} with Ray auth disabled lets anyone who reaches it run code on every "
                               "node: add --auth-mode token (or --insecure if you mean it)")
        console.print(styled("warning:", "yellow"), f"the head listens on {host} with Ray auth disabled (--insecure).")
    if dry_run:
        env, notes = cluster.ray_env(mode, joining=False, token_file=token_file,
                                     loopback_head=cluster.is_loopback(host))
        for note in notes:
            console.print(styled(note, "yellow"))
        command = cluster.head_command(port=port, host=host, dashboard_port=dashboard_port,
                                       client_port=client_server_port, chip=chip, extra=tuple(ray_arg or ()))
        env[cluster.HEAD_PYTHON_ENV] = cluster.head_python(python)
        print(cluster.shell_line(command, env))
        return
    head = cluster.start_head(port=port, host=host, dashboard_port=dashboard_port, mode=mode, state=state,
                              client_port=client_server_port, chip=chip, extra=tuple(ray_arg or ()),
                              timeout_s=timeout, token_file=token_file, python=python)
    print(f"Ray head running (pid {head.pid}), auth mode {mode}" + (f", runs jobs as chip={chip}" if chip else ""))
    print(f"  cluster address: {head.address}")
    print(f"  Jobs API:        {head.dashboard}")
    print(f"  session:         {head.session_dir or '?'}")
    print(f"  log:             {head.log}")
    print(f"  drivers run by:  {head.python}")
    token_flag = ""
    if mode == "token":
        where = head.token_file or "$RAY_AUTH_TOKEN"
        print(f"  auth token:      {where} (copy it to every node and to CI; never print it)")
        token_flag = " --auth-mode token" + (f" --token-file {head.token_file}" if head.token_file else "")
    if cluster.is_loopback(host):
        print("Loopback only: no other machine can join (restart with --host <LAN address> for that); "
              "nodes of this machine can.")
    print("Join every machine (its chip is detected; --chip-label overrides):")
    print(f"  harness node join --address {head.address}{token_flag}")
    print("Submit a commit from CI:")
    print(f"  harness submit --address {head.dashboard} --commit SHA --repo URL --wait{token_flag}")
    print(f"Stop it: harness cluster down --port {port}")


@cluster_app.command("down")
def down(
    port: Annotated[int | None, typer.Option(help="Port of the head to stop (default: the only one recorded).")]
    = None,
    state: StateOption = None,
) -> None:
    """Stop the head that `harness cluster up` started (never any other Ray process on this machine)."""
    files = cluster.find_state("head", port, state)
    if not files:
        raise HarnessError("no head started by `harness cluster up` is recorded here"
                           + (f" for port {port}" if port else ""))
    if len(files) > 1:
        ports = ", ".join(cluster.Launched.load(f).address.rsplit(":", 1)[-1] for f in files)
        raise HarnessError(f"several heads are recorded (ports {ports}): pass --port")
    head = cluster.Launched.load(files[0])
    what = cluster.stop(head)
    console.print(f"head {head.address} (pid {head.pid}): {what}")


@cluster_app.command("status")
def status(
    address: Annotated[str | None, typer.Option(help="Cluster HEAD:PORT (default: the recorded head).")] = None,
) -> None:
    """List the chips of the cluster: live nodes per chip label."""
    if address is None:
        files = cluster.find_state("head")
        if len(files) != 1:
            raise HarnessError("pass --address HEAD:PORT")
        head = cluster.Launched.load(files[0])
        address = head.address
        if head.auth_mode == "token" and head.token_file:  # the recorded head's token, for ray.init here
            os.environ["RAY_AUTH_MODE"] = "token"
            os.environ[cluster.TOKEN_PATH_ENV] = head.token_file
            os.environ.pop(cluster.TOKEN_ENV, None)
    import ray  # loads ray: only when this command runs, after the auth env is set (Ray reads it on import)

    from harness.execute.ray_executor import live_chips  # loads ray: only when this command runs

    connect(address)
    try:
        chips = live_chips()
    finally:
        ray.shutdown()
    if not chips:
        print("no chip-labelled nodes: join one with `harness node join`")
    for key, nodes in sorted(chips.items()):
        print(f"{key}: {len(nodes)} node(s) {' '.join(n[:12] for n in nodes)}")
