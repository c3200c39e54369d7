"""The harness command line: one module per verb (asv style), so the command surface is the file list."""
