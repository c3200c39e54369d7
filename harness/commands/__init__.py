"""One module per CLI verb (asv style): the command surface is the file list."""
