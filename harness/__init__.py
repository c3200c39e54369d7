"""MLX kernel regression harness: plan, execute, record, analyse, render."""
