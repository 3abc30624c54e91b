#!/usr/bin/env bash
# RELIABILITY C-K1, the kill -9 crash loop, in full: `rproxy client` is
# started on one cache directory, fed cache-filling requests (bodies of
# 0-8 MiB, 20 % of them the key just written) and SIGKILLed after a
# uniformly random 0-500 ms, ITERATIONS times (default 200). After each
# restart the test checks: no temp files, no partial files under final
# names, every entry on disk matching its digest, every entry whose
# "committed" log line came before the kill still there, and a hit served
# with the right bytes. It prints the counts and exits non-zero on any
# violation.
#
# Usage: scripts/crash-loop.sh [ITERATIONS]
#
# The test is `c_k1_kill_9_crash_loop_200_iterations` in
# tests/cache_faults.rs (ignored in the normal suite, which runs a
# 10-iteration version). The loop takes a few minutes.
set -euo pipefail

cd "$(dirname "$0")/.."
export RPROXY_CK1_ITERATIONS="${1:-200}"
exec cargo test --test cache_faults c_k1_kill_9_crash_loop_200_iterations \
    -- --ignored --nocapture
