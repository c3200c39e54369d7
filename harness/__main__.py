"""`python -m harness` is the `harness` command."""

from harness.cli import main

main()
