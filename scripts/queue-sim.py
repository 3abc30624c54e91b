#!/usr/bin/env python3
"""Live part of scripts/queue-sim.sh (issue 5): queued-request latency and
memory of the accelerator's upload queue.

Python 3 standard library only. Two subcommands:

  queue-sim.py origin --port P
      A slow origin: every GET is answered 200 with a body of SLOW_BYTES
      bytes sent one byte per second, so a download holds its upload slot
      for minutes. HEAD and /quick answer at once.
  queue-sim.py run --port A --pid PID --requests 1000 --concurrency 32
      Against the accelerator on 127.0.0.1:A (started with --slots 8):
      holds 8 slow downloads (all the slots), then sends the queued
      requests, mixed (X-Queue: 1.0; no X-Queue; X-Queue: 0.1 on a
      connection kept open), each from its own 127.0.x.y source address
      (passive places are kept by address, and one address may hold only a
      quarter of --queue-max), at most --concurrency in flight, each
      on a fresh connection, and times each from the request's last byte
      written to its response head read. Prints p50/p99/max against the
      50 ms target, the accelerator's RSS before and after (per entry), and
      the queue length the last replies gave; then waits --idle-wait
      seconds and counts the held legacy connections the accelerator
      closed meanwhile (their places go with them).

Every connection goes to 127.0.0.1 (sources in 127.0.0.0/8). Exit status 0
when the measurements ran, whatever the figures; 2 on a setup failure.
"""

import argparse
import asyncio
import http.server
import json
import re
import sys
import time
import urllib.request

SLOW_BYTES = 600
TARGET_MS = 50.0


class SetupError(Exception):
    pass


def log(msg):
    print(f"queue-sim: {msg}", file=sys.stderr, flush=True)


def percentile(values, p):
    if not values:
        return 0.0
    s = sorted(values)
    k = max(1, min(len(s), int(-(-p * len(s) // 100))))
    return s[k - 1]


def verdict(ok):
    return "met" if ok else "NOT met"


# ---- the slow origin --------------------------------------------------------


class SlowHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path.startswith("/quick"):
            body = b"quick\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(SLOW_BYTES))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        try:
            for _ in range(SLOW_BYTES):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(1)
        except OSError:
            pass
        self.close_connection = True


def serve_origin(port):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), SlowHandler)
    server.daemon_threads = True
    server.serve_forever()


# ---- the live measurement ---------------------------------------------------


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise SetupError(f"no VmRSS for pid {pid}")


def stats(port):
    url = f"http://127.0.0.1:{port}/.rproxy/stats"
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


async def read_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return status, headers


async def hold_slot(port, i, ready):
    """A slow download: its response head, then one byte at a time."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /slow/{i} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    await writer.drain()
    status, _ = await read_head(reader)
    ready.append(status)
    try:
        while await reader.read(64):
            pass
    except (OSError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


DIALECTS = ("parq", "passive", "legacy")


async def queued_request(port, i, sem, results, held):
    dialect = DIALECTS[i % 3]
    extra = ""
    if dialect == "parq":
        extra = "X-Queue: 1.0\r\n"
    elif dialect == "legacy":
        extra = "X-Queue: 0.1\r\n"
    # Its own address: passive places are kept by address, and one address
    # may hold only a quarter of --queue-max (--queue-per-address).
    local = (f"127.0.{1 + i // 250}.{1 + i % 250}", 0)
    async with sem:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=local)
        except OSError as e:
            results.append({"dialect": dialect, "error": f"connect: {e}"})
            return
        request = f"GET /file/{i} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n".encode()
        writer.write(request)
        await writer.drain()
        sent = time.perf_counter()
        try:
            status, headers = await asyncio.wait_for(read_head(reader), 10)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as e:
            results.append({"dialect": dialect, "error": repr(e)})
            writer.close()
            return
        ms = (time.perf_counter() - sent) * 1000
        results.append({"dialect": dialect, "status": status, "ms": ms, "headers": headers})
        if dialect == "legacy" and headers.get("connection", "").lower() != "close":
            held.append((reader, writer))
        else:
            writer.close()


def queue_length(headers):
    for name in ("x-queued", "x-queue"):
        m = re.search(r"length=(\d+)", headers.get(name, ""))
        if m:
            return int(m.group(1))
    return None


async def probe_length(port):
    """One more PARQ request: the queue length it is told."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /probe HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Queue: 1.0\r\nConnection: close\r\n\r\n")
    await writer.drain()
    status, headers = await asyncio.wait_for(read_head(reader), 10)
    writer.close()
    return status, queue_length(headers)


async def run(args):
    before_stats = stats(args.port)
    ready = []
    holders = [asyncio.create_task(hold_slot(args.port, i, ready)) for i in range(args.slots)]
    deadline = time.monotonic() + 10
    while len(ready) < args.slots:
        if time.monotonic() > deadline:
            raise SetupError(f"only {len(ready)} of {args.slots} slow downloads started")
        await asyncio.sleep(0.05)
    if any(s != 200 for s in ready):
        raise SetupError(f"slow downloads answered {ready}, not 200")
    await asyncio.sleep(0.5)
    rss_before = rss_kib(args.pid)
    log(f"{args.slots} slow downloads hold the slots; accelerator RSS {rss_before} KiB")

    sem = asyncio.Semaphore(args.concurrency)
    results, held = [], []
    t0 = time.perf_counter()
    await asyncio.gather(*(queued_request(args.port, i, sem, results, held) for i in range(args.requests)))
    elapsed = time.perf_counter() - t0
    await asyncio.sleep(0.5)
    rss_after = rss_kib(args.pid)
    after_stats = stats(args.port)
    status, length_now = await probe_length(args.port)

    errors = [r for r in results if "error" in r]
    ok = [r for r in results if "status" in r]
    lat = [r["ms"] for r in ok]
    by_status = {}
    for r in ok:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
    mix = ", ".join(f"{d} {sum(1 for r in results if r.get('dialect') == d)}" for d in DIALECTS)
    print(
        f"live: {args.requests} queued requests ({mix}),"
        f" at most {args.concurrency} in flight, in {elapsed:.1f} s; statuses {dict(sorted(by_status.items()))}, errors {len(errors)}"
    )
    for e in errors[:3]:
        print(f"  error: {e}")
    if lat:
        p50, p99, mx = percentile(lat, 50), percentile(lat, 99), max(lat)
        print(f"time to the 503 head: p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {mx:.2f} ms  (target p99 <= {TARGET_MS:.0f} ms)  {verdict(p99 <= TARGET_MS)}")
        for d in DIALECTS:
            dl = [r["ms"] for r in ok if r["dialect"] == d]
            if dl:
                print(f"  {d:8} p50 {percentile(dl, 50):.2f} ms, p99 {percentile(dl, 99):.2f} ms")
    lengths = [queue_length(r["headers"]) for r in ok if r["status"] == 503]
    lengths = [n for n in lengths if n is not None]
    queued_503 = sum(1 for r in ok if r["status"] == 503)
    served = sum(1 for r in ok if r["status"] == 200)
    print(f"replies: {queued_503} x 503, {served} served; queue length in the replies: max {max(lengths) if lengths else '?'}; a probe after them was told length {length_now} (status {status})")
    q = after_stats.get("queued", 0) - before_stats.get("queued", 0)
    print(f"/.rproxy/stats 'queued' grew by {q}, 503 replies {queued_503}: {'consistent' if q == queued_503 else 'INCONSISTENT'}")
    entries = length_now if length_now else queued_503
    grow = rss_after - rss_before
    print(
        f"accelerator RSS: {rss_before} KiB before, {rss_after} KiB with {entries} entries (+{grow} KiB,"
        f" {grow * 1024 / max(entries, 1):.0f} bytes per entry): an upper bound, with {len(held)} held connections and"
        f" {args.requests} served connections' buffers in it; the 1 KiB target is judged on part 1's heap measurement"
    )

    # Held legacy connections against the keep-alive idle close.
    if args.idle_wait > 0 and held:
        log(f"holding {len(held)} legacy connections idle for {args.idle_wait} s")
        await asyncio.sleep(args.idle_wait)
        closed = 0
        for reader, writer in held:
            # The 503's body is still unread; hyper answers 408 before it
            # closes. Either a 408 or the end of the stream counts.
            data, eof = b"", False
            try:
                while True:
                    chunk = await asyncio.wait_for(reader.read(4096), 0.2)
                    if not chunk:
                        eof = True
                        break
                    data += chunk
            except asyncio.TimeoutError:
                pass
            except OSError:
                eof = True
            closed += eof or b"HTTP/1.1 408" in data
        _, length_later = await probe_length(args.port)
        print(
            f"held legacy (X-Queue: 0.1) connections closed by the accelerator after {args.idle_wait} s idle"
            f" (pollMin is 45 s): {closed} of {len(held)}; queue length {length_now} -> {length_later}"
            f"  (target 0 closed)  {verdict(closed == 0)}"
        )
        for _, writer in held:
            writer.close()

    for h in holders:
        h.cancel()
    await asyncio.gather(*holders, return_exceptions=True)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("origin")
    o.add_argument("--port", type=int, required=True)
    r = sub.add_parser("run")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--pid", type=int, required=True)
    r.add_argument("--slots", type=int, default=8)
    r.add_argument("--requests", type=int, default=1000)
    r.add_argument("--concurrency", type=int, default=32)
    r.add_argument("--idle-wait", type=float, default=12)
    args = p.parse_args()
    if args.cmd == "origin":
        serve_origin(args.port)
        return
    try:
        asyncio.run(run(args))
    except SetupError as e:
        log(f"FAIL: {e}")
        sys.exit(2)


if __name__ == "__main__":
    main()
