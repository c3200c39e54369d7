"""`harness init`: scan a kernel repository and write the files that adopt the harness there."""
