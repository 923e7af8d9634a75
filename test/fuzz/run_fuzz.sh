#!/usr/bin/env bash
# Runs one libFuzzer harness for a bounded time: run_fuzz.sh HARNESS SEED_DIR SCRATCH_DIR SECONDS.
# New inputs go to SCRATCH_DIR (emptied first); SEED_DIR is only read. A finding (crash, leak,
# timeout, sanitizer report) fails the test and leaves the reproducer in SCRATCH_DIR/artifacts.
set -euo pipefail
harness=$1 seeds=$2 scratch=$3 seconds=$4
rm -rf "$scratch"
mkdir -p "$scratch/corpus" "$scratch/artifacts"
# libFuzzer exits 77 on a finding by default, which Meson counts as a skip: make every finding
# (crash, sanitizer report, timeout) exit 1. Out-of-memory exits 71, a failure already.
exec "$harness" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -error_exitcode=1 -timeout_exitcode=1 \
  -artifact_prefix="$scratch/artifacts/" "$scratch/corpus" "$seeds"
