"""`harness node join|leave`: make this machine a Ray worker node labelled with its chip."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.cluster import RayArgOption, TokenFileOption
from harness.cli.common import app, console, styled
from harness.cluster import nodes as cluster
from harness.core.chip import detect
from harness.core.errors import HarnessError

node_app = typer.Typer(no_args_is_help=True, help="Join this machine to a harness cluster, labelled by its chip.")
app.add_typer(node_app, name="node")


@node_app.command("join")
def join(
    address: Annotated[str, typer.Option(help="The head's cluster address HEAD:PORT (from `harness cluster up`).")],
    chip_label: Annotated[str | None, typer.Option(help="Chip key to label this node with (default: detected).")]
    = None,
    node_ip: Annotated[str | None, typer.Option(help="This node's address as the others reach it.")] = None,
    num_cpus: Annotated[int | None, typer.Option(help="CPUs Ray may use here (default: all).")] = None,
    auth_mode: Annotated[str | None, typer.Option(help="disabled or token, as the head (default $RAY_AUTH_MODE, "
                                                       "else disabled).")] = None,
    ray_arg: RayArgOption = None,
    token_file: TokenFileOption = None,
    detach: Annotated[bool, typer.Option("--detach", help="Run in the background and record it "
                                                          "(`harness node leave` stops it).")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the ray command and environment only.")]
    = False,
) -> None:
    """Start a Ray worker node labelled chip=<key> with one `harness_node` resource (foreground by default)."""
    from harness.execute.ray_executor import chip_label_value  # loads ray: only when this command runs

    if address.startswith(("http://", "https://")):
        raise HarnessError(f"{address} is the Jobs API address; join with the cluster address HEAD:PORT")
    key = chip_label_value(chip_label or detect().key)
    mode = cluster.auth_mode(auth_mode)
    _token, token_file = cluster.find_token(mode, token_file)  # a node without the head's token never joins
    env, notes = cluster.ray_env(mode, joining=True, token_file=token_file)
    for note in notes:
        console.print(styled(note, "yellow"))
    extra = tuple(ray_arg or ())
    command = cluster.node_command(address=address, chip=key, node_ip=node_ip, num_cpus=num_cpus, extra=extra)
    console.print(f"joining {address} as chip={key} (auth {mode})")
    if dry_run:
        print(cluster.shell_line(command, env))
        return
    if detach:
        node = cluster.start_node(address=address, chip=key, node_ip=node_ip, num_cpus=num_cpus, mode=mode,
                                  extra=extra, token_file=token_file, command=command)
        print(f"node running (pid {node.pid}) labelled chip={key}; log: {node.log}; state: {node.state_file}")
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(command[0], command, env)  # the service manager (systemd, launchd) supervises ray itself


@node_app.command("leave")
def leave(
    state: Annotated[Path | None, typer.Option("--state", help="State file of the node to stop (default: every "
                                                                 "node `node join --detach` started here).")] = None,
) -> None:
    """Stop the background node(s) that `harness node join --detach` started (only those)."""
    files = cluster.find_state("node", state=state)
    if not files:
        raise HarnessError("no node started by `harness node join --detach` is recorded here")
    for path in files:
        node = cluster.Launched.load(path)
        console.print(f"node chip={node.chip} (pid {node.pid}): {cluster.stop(node)}")
