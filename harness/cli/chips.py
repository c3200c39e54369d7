"""`harness chips`: print this machine's chip identity."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from harness.cli.common import app
from harness.core.chip import detect, machine_facts
from harness.core.errors import HarnessError


@app.command()
def chips(
    format: Annotated[str, typer.Option("--format", help="text or json")] = "text",
    chip_label: Annotated[str | None, typer.Option(help="Override the detected chip key.")] = None,
) -> None:
    """Print this machine's chip identity (the key results are stored under)."""
    ident = detect(chip_label)
    if format == "json":
        print(json.dumps({**ident.to_dict(), "machine": machine_facts()}, indent=2, default=str))
        return
    if format != "text":
        raise HarnessError(f"--format must be text or json, not {format!r}")
    print(f"key:          {ident.key}")
    print(f"backend:      {ident.backend}")
    print(f"device:       {ident.device_name}")
    print(f"architecture: {ident.architecture}")
    if ident.gpu_cores:
        print(f"GPU cores:    {ident.gpu_cores}")
    if ident.memory_bytes:
        print(f"memory:       {ident.memory_bytes / 2**30:.1f} GiB")
    print(f"OS:           {ident.os}")
    print(f"MLX:          {ident.mlx_version}")
