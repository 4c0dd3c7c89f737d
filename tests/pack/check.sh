#!/bin/sh
# Runs every program of this pack through kiln-run and compares its results with the reference
# interpreter's, then times each workload against PyTorch (eager and torch.compile) on the same
# GPU. KILN_RUN_DEVICE=emulator runs the programs on the GPU emulator instead (the workloads at
# their tiny size). Prints one table, writes it as JSON (check-results.json here, or
# $KILN_CHECK_JSON) and exits non-zero on any mismatch or failure.
exec python3 "$(dirname "$0")/check.py" "$@"
