"""What the commands print: the predict report, the 4D-parallelism answers, validation against measured runs, the GEMM
report."""
