#!/usr/bin/env bash
# Fair upload slots (issue 5): fairness, answer time and memory of the
# accelerator's queue with 1,000 clients against --slots 8. A manual
# benchmark: CI does not run it.
#
# 1. Fairness, in virtual time: `cargo run --release --example queue_sim`
#    (examples/queue_sim.rs) drives rproxy::queue::UploadQueue directly
#    with a simulated clock. 1,000 clients arrive over ~20 min in three
#    dialects (PARQ 1.0 with IDs, passive by address, legacy 0.1 on a held
#    connection) and five behaviours (retry at Retry-After, retry late
#    within the lifetime, vanish far back or near the head, flood too
#    early, let the lifetime lapse with X-Node and answer QUEUE callbacks);
#    uploads take 10..110 s.
#    Run twice: held connections open as long as the client wants, and
#    closed after 10 s idle as the accelerator's default
#    --header-read-timeout does. Prints clients served, places lost, served
#    order against arrival order among the well-behaved clients
#    (inversions, Kendall tau, most later arrivals served before one
#    client; target: no place lost, at most --slots overtaken), slot use,
#    and bytes per queue entry (ESTIMATED_BYTES_PER_ENTRY and the heap
#    growth of ENTRIES (20,000) queued entries of each dialect under a counting
#    allocator; target <= 1 KiB).
# 2. Live: the release binary `rproxy accelerator --slots 8 --queue-max
#    2000` in front of a python3 origin whose bodies take 10 minutes (one
#    byte a second). 8 slow downloads hold the slots, then 1,000 requests
#    (a third each X-Queue: 1.0, none, X-Queue: 0.1; each from its own
#    127.0.x.y source), 32 in flight, each on a fresh connection, timed from
#    the request sent to the 503 head read: p50/p99/max (target p99 <=
#    50 ms); the accelerator's RSS before and after (per entry; target <=
#    1 KiB); the stats 'queued' counter against the 503s counted; and, after
#    IDLE_WAIT seconds, how many held legacy connections the accelerator
#    closed (their places go with them).
# Each figure is printed next to its target with "met" / "NOT met". The
# exit status is non-zero only when the setup failed (build, start-up,
# accelerator unreachable or dead), never for a missed target. About 40 s
# after the build.
#
# Usage: scripts/queue-sim.sh
#   CLIENTS=1000      simulated clients (part 1)    SEED=1  simulation seed
#   ENTRIES=20000     entries for the memory measurement (part 1; 100000
#                     takes about a second)
#   REQUESTS=1000     live queued requests          CONCURRENCY=32 in flight
#   IDLE_WAIT=12      seconds the held legacy connections are left idle (0 skips)
#   RPROXY, CARGO_TARGET_DIR, KEEP_TMP: see scripts/lib-nginx.sh
# Needs: cargo, python3 (>= 3.8), curl. No nginx: the origin is python3.
set -euo pipefail

# shellcheck source=scripts/lib-nginx.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib-nginx.sh"
lab_init queue-sim

clients=${CLIENTS:-1000}
seed=${SEED:-1}
entries=${ENTRIES:-20000}
requests=${REQUESTS:-1000}
concurrency=${CONCURRENCY:-32}
idle_wait=${IDLE_WAIT:-12}

command -v python3 >/dev/null || lab_die "python3 is not installed"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 8))' || lab_die "python3 >= 3.8 is needed"

# Descriptors: the held legacy connections and the in-flight ones, twice
# (client and accelerator side are separate processes, but be generous).
hard=$(ulimit -Hn)
if [[ $hard == unlimited ]] || ((hard >= 8192)); then
    ulimit -n 8192 2>/dev/null || true
else
    ulimit -n "$hard" || true
fi

lab_build

# ---- part 1: fairness in virtual time ---------------------------------------
echo "== part 1: the queue alone, virtual time (examples/queue_sim.rs)"
lab_log "building and running the simulation"
(cd "$lab_repo" && cargo run --release --quiet --example queue_sim -- \
    --clients "$clients" --seed "$seed" --entries "$entries") ||
    lab_die "the simulation failed (cargo run --release --example queue_sim)"

# ---- part 2: live latency and memory ----------------------------------------
echo
echo "== part 2: the live accelerator, --slots 8 --queue-max 2000"
origin_port=$(lab_free_port)
python3 "$lab_repo/scripts/queue-sim.py" origin --port "$origin_port" \
    >"$lab_tmp/logs/origin.log" 2>&1 &
origin_pid=$!
lab_pids+=("$origin_pid")
lab_wait_http "http://127.0.0.1:$origin_port/quick" "$origin_pid" "slow origin"

accel_port=$(lab_free_port)
RUST_LOG=${RUST_LOG:-warn} "$lab_rproxy" accelerator \
    --listen "127.0.0.1:$accel_port" --admin-listen 127.0.0.1:0 --origin "http://127.0.0.1:$origin_port" \
    --slots 8 --queue-max 2000 \
    >"$lab_tmp/logs/accelerator.log" 2>&1 &
accel_pid=$!
lab_accel_pid=$accel_pid
lab_pids+=("$accel_pid")
lab_wait_http "http://127.0.0.1:$accel_port/.rproxy/stats" "$accel_pid" "rproxy accelerator"
lab_log "accelerator 127.0.0.1:$accel_port (pid $accel_pid), origin 127.0.0.1:$origin_port"

status=0
python3 "$lab_repo/scripts/queue-sim.py" run --port "$accel_port" --pid "$accel_pid" \
    --slots 8 --requests "$requests" --concurrency "$concurrency" --idle-wait "$idle_wait" || status=$?
if ((status != 0)); then
    lab_show_logs
    lab_die "the live client failed (status $status)"
fi
lab_check_alive
n=$(grep -c -e panicked -e ' ERROR ' "$lab_tmp/logs/accelerator.log" || true)
if ((n > 0)); then
    echo "the accelerator logged $n error/panic lines, e.g.:"
    grep -m 3 -e panicked -e ' ERROR ' "$lab_tmp/logs/accelerator.log"
fi
