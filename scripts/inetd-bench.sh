#!/usr/bin/env bash
# L-12 of RELIABILITY.md: inetd mode, measured. A manual benchmark (CI runs
# tests/inetd.rs instead, which checks that each process exits by itself).
#
# Spawns `rproxy accelerator --inetd` N times in sequence (500 by default),
# each with one end of a socketpair as stdin/stdout, as inetd, xinetd and
# systemd Accept=yes do. Each asks for /.rproxy/stats on a keep-alive
# connection (answered by the accelerator itself, so no origin is needed),
# reads the whole answer, then closes its end; the figure is the time from that close until the
# process has exited. Prints p50/p99/max against the 100 ms target, and
# the whole round trip per connection (spawn to exit) for scale.
#
# Usage: scripts/inetd-bench.sh      N=500, RPROXY=path (default: build release)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${N:-500}
if [[ -z ${RPROXY:-} ]]; then
    cargo build --release --quiet
    RPROXY=${CARGO_TARGET_DIR:-target}/release/rproxy
fi
[[ -x $RPROXY ]] || { echo "inetd-bench: no binary at $RPROXY" >&2; exit 1; }

python3 - "$RPROXY" "$N" <<'PY'
import socket, subprocess, sys, time

binary, n = sys.argv[1], int(sys.argv[2])
exit_after_eof, whole = [], []
for i in range(n):
    ours, theirs = socket.socketpair()
    started = time.monotonic()
    child = subprocess.Popen(
        [binary, "accelerator", "--inetd", "--origin", "http://127.0.0.1:9"],
        stdin=theirs, stdout=theirs, stderr=subprocess.DEVNULL)
    theirs.close()
    # Keep-alive: the process waits for another request until we close.
    ours.sendall(b"GET /.rproxy/stats HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    ours.settimeout(10)
    while True:
        chunk = ours.recv(65536)
        if not chunk:
            sys.exit(f"inetd-bench: connection {i}: closed before the answer ended")
        answer += chunk
        head, sep, body = answer.partition(b"\r\n\r\n")
        if sep:
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            if len(body) >= length:
                break
    if not answer.startswith(b"HTTP/1.1 200"):
        sys.exit(f"inetd-bench: connection {i}: unexpected answer {answer[:60]!r}")
    ours.close()
    closed = time.monotonic()
    child.wait(timeout=10)
    done = time.monotonic()
    exit_after_eof.append((done - closed) * 1000)
    whole.append((done - started) * 1000)

def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]

print(f"rproxy accelerator --inetd, {n} sequential connections on socketpairs")
print(f"  exit after the peer closed: p50 {pct(exit_after_eof, .5):.2f} ms, "
      f"p99 {pct(exit_after_eof, .99):.2f} ms, max {max(exit_after_eof):.2f} ms")
print(f"  spawn to exit, per connection: p50 {pct(whole, .5):.2f} ms, p99 {pct(whole, .99):.2f} ms")
met = "met" if max(exit_after_eof) <= 100 else "NOT met"
print(f"  => L-12 every process exits within 100 ms of peer EOF: {met}")
PY
