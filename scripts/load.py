#!/usr/bin/env python3
"""Load generator for scripts/load.sh (targets L-5 and L-7 of RELIABILITY.md).

Python 3 standard library only (asyncio on raw non-blocking sockets). It is
started by scripts/load.sh, which builds rproxy, starts nginx and two client
proxies, and cleans up; run on its own it needs those already running:

  load.py run --idle-port P --idle-pid PID --idle-timeout 120 \
              --slow-port Q --slow-pid QID --slow-timeout 10 \
              --url http://127.0.0.1:ORIGIN/cached/1k.txt [--idle-conns 10000] ...
  load.py legit --port P --url URL --count 200 --interval 0.01
      (one legitimate request per fresh connection; prints JSON latencies)

Every request goes to the proxy in absolute form (forward proxy, as
`curl -x` sends it). Legitimate requests are measured by a separate
process (`load.py legit`), so the attack's own event loop does not add to
their latency. Exit status: 0 when the measurements ran (whether or not the
targets were met), 2 on a setup failure (proxy unreachable, not a cache hit).
"""

import argparse
import asyncio
import json
import os
import socket
import sys
import time

MIB = 1024 * 1024


class SetupError(Exception):
    pass


def log(msg):
    print(f"load: {msg}", file=sys.stderr, flush=True)


def percentile(values, p):
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))  # ceil(n * p / 100)
    return ordered[int(rank) - 1]


def rss_kib(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise SetupError(f"no {field} in /proc/{pid}/status")


def reset_peak(pid):
    """Resets VmHWM (peak RSS) so that it measures from now on."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def fd_count(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def listen_overflows():
    """Host-wide count of connections dropped for a full accept queue."""
    try:
        with open("/proc/net/netstat") as f:
            lines = [line.split() for line in f if line.startswith("TcpExt:")]
        return int(dict(zip(lines[0], lines[1]))["ListenOverflows"])
    except (OSError, KeyError, IndexError, ValueError):
        return 0


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def request_bytes(url, close):
    host = url.split("/")[2]
    conn = "close" if close else "keep-alive"
    return (
        f"GET {url} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: rproxy-load\r\n"
        f"Connection: {conn}\r\n\r\n"
    ).encode()


def parse_head(head):
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def body_done(headers, body, eof):
    if "content-length" in headers:
        return len(body) >= int(headers["content-length"])
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return body.endswith(b"0\r\n\r\n")
    return eof


# ---- legitimate requests (own process, blocking sockets) -----------------


def blocking_get(host, port, req, timeout):
    """One request on a fresh connection: (status, headers, seconds)."""
    start = time.perf_counter()
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(req)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("closed before the response head")
            buf += chunk
        head, _, body = buf.partition(b"\r\n\r\n")
        status, headers = parse_head(head)
        eof = False
        while not body_done(headers, body, eof):
            chunk = s.recv(65536)
            if not chunk:
                eof = True
                if "content-length" in headers:
                    raise ConnectionError("closed in the middle of the body")
                continue
            body += chunk
    return status, headers, time.perf_counter() - start


def legit_main(args):
    req = request_bytes(args.url, close=True)
    try:  # untimed: the first request pays for Python's own warm-up
        blocking_get(args.host, args.port, req, 5.0)
    except OSError:
        pass
    lat, at, errors, misses = [], [], [], 0
    next_at = time.perf_counter()
    for _ in range(args.count):
        try:
            started = time.monotonic()
            status, headers, secs = blocking_get(args.host, args.port, req, 5.0)
            if status != 200:
                errors.append(f"status {status}")
            else:
                lat.append(secs * 1000.0)
                at.append(started)
                if "hit" not in headers.get("cache-status", "").lower():
                    misses += 1
        except OSError as e:
            errors.append(f"{type(e).__name__}: {e}")
        next_at += args.interval
        pause = next_at - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    json.dump({"ms": lat, "at": at, "errors": errors, "misses": misses}, sys.stdout)


async def legit(port, args, count=None, interval=None):
    """Runs `load.py legit` as a child process; returns its result dict."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, os.path.abspath(__file__), "legit",
        "--host", args.host, "--port", str(port), "--url", args.url,
        "--count", str(count or args.legit), "--interval", str(interval or args.interval),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise SetupError(f"legit request process failed (status {proc.returncode})")
    return json.loads(out)


def summarize(result):
    ms = result["ms"]
    if not ms:
        return {"p50": float("nan"), "p99": float("nan"), "n": 0,
                "errors": len(result["errors"]), "misses": result["misses"],
                "first_error": (result["errors"] or [""])[0]}
    return {"p50": percentile(ms, 50), "p99": percentile(ms, 99), "n": len(ms),
            "max": max(ms), "top": sorted(ms)[-3:],
            "top_at": [t for _, t in sorted(zip(ms, result["at"]))[-3:]], "errors": len(result["errors"]),
            "misses": result["misses"],
            "first_error": (result["errors"] or [""])[0]}


# ---- asyncio helpers ----------------------------------------------------


async def aconnect(loop, host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        await loop.sock_connect(s, (host, port))
    except BaseException:
        s.close()
        raise
    return s


async def aread_response(loop, s):
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = await loop.sock_recv(s, 65536)
        if not chunk:
            raise ConnectionError("closed before the response head")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    status, headers = parse_head(head)
    while not body_done(headers, body, False):
        chunk = await loop.sock_recv(s, 65536)
        if not chunk:
            raise ConnectionError("closed in the middle of the body")
        body += chunk
    return status, headers


def still_open(s):
    """True if the peer has not closed the socket (non-blocking peek)."""
    try:
        data = s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        return len(data) > 0  # unexpected bytes, but the connection is open
    except BlockingIOError:
        return True
    except OSError:
        return False


async def open_keepalive(loop, host, port, url, n, parallel):
    """n connections, each after one complete request and response.

    Returns (sockets, idle_since_times, errors)."""
    req = request_bytes(url, close=False)
    socks, since, errors = [], [], []
    sem = asyncio.Semaphore(parallel)

    async def one():
        async with sem:
            s = None
            try:
                s = await aconnect(loop, host, port)
                await loop.sock_sendall(s, req)
                status, _ = await asyncio.wait_for(aread_response(loop, s), 10)
                if status != 200:
                    raise ConnectionError(f"status {status}")
                socks.append(s)
                since.append(time.monotonic())
            except (OSError, asyncio.TimeoutError) as e:
                errors.append(f"{type(e).__name__}: {e}")
                if s is not None:
                    s.close()

    await asyncio.gather(*(one() for _ in range(n)))
    return socks, since, errors


async def rss_sampler(pid, box, stop):
    while not stop.is_set():
        try:
            box["max"] = max(box.get("max", 0), rss_kib(pid))
        except (OSError, SetupError):
            return
        try:
            await asyncio.wait_for(stop.wait(), 0.1)
        except asyncio.TimeoutError:
            pass


def verdict(ok):
    return "met" if ok else "NOT met"


def fmt_ms(v):
    return f"{v:.2f} ms"


# ---- the phases -----------------------------------------------------------


async def warm(loop, port, args):
    """Fetches the URL twice through a proxy: the second must be a hit."""
    req = request_bytes(args.url, close=True)
    headers = {}
    for _ in range(2):
        try:
            s = await aconnect(loop, args.host, port)
            await loop.sock_sendall(s, req)
            status, headers = await asyncio.wait_for(aread_response(loop, s), 10)
            s.close()
        except (OSError, asyncio.TimeoutError) as e:
            raise SetupError(f"cannot fetch {args.url} through 127.0.0.1:{port}: {e}")
        if status != 200:
            raise SetupError(f"{args.url} through 127.0.0.1:{port}: status {status}")
    cs = headers.get("cache-status", "")
    if "hit" not in cs.lower():
        raise SetupError(f"{args.url} is not a cache hit the second time (Cache-Status: {cs!r})")


def print_legit(label, st):
    extra = ""
    if st["errors"]:
        extra += f"; {st['errors']} errors (first: {st['first_error']})"
    if st["misses"]:
        extra += f"; {st['misses']} not cache hits"
    top = ", ".join(f"{v:.1f}" for v in st.get("top", []))
    print(f"  legit {label:<26} p50 {fmt_ms(st['p50'])}, p99 {fmt_ms(st['p99'])}"
          f" ({st['n']} requests, slowest {top} ms{extra})")


async def phase_idle(loop, args, report):
    port, pid, n = args.idle_port, args.idle_pid, args.idle_conns
    print(f"\nL-5 idle keep-alive connections: {n} connections, each sends one complete"
          f" request (a cache hit), reads the response, then stays idle.")
    print(f"  The proxy runs with --header-read-timeout {args.idle_timeout}: hyper's"
          f" header-read timer also closes idle keep-alive connections,")
    print(f"  so a long one keeps the {n} connections open while they are measured.")
    base = summarize(await legit(port, args))
    print_legit("baseline", base)
    await asyncio.sleep(0.5)
    rss0, fds0 = rss_kib(pid), fd_count(pid)
    reset_peak(pid)
    t0, lo0 = time.monotonic(), listen_overflows()
    socks, _, errors = await open_keepalive(loop, args.host, port, args.url, n, args.parallel)
    opened = time.monotonic() - t0
    print(f"  opened {len(socks)} of {n} in {opened:.1f} s"
          + (f"; {len(errors)} failed (first: {errors[0]})" if errors else "")
          + f"; accept-queue overflows (host-wide) {listen_overflows() - lo0}")
    await asyncio.sleep(args.settle)
    rss1, hwm, fds1 = rss_kib(pid), rss_kib(pid, "VmHWM"), fd_count(pid)
    during = summarize(await legit(port, args))
    open_now = sum(1 for s in socks if still_open(s))
    rss2 = rss_kib(pid)
    for s in socks:
        s.close()
    await asyncio.sleep(1)
    if not alive(pid):
        raise SetupError("the idle-test client proxy died")
    rss3 = rss_kib(pid)
    conns = max(len(socks), 1)
    growth = (max(rss1, rss2) - rss0) / 1024
    per_conn = (max(rss1, rss2) - rss0) / conns
    print(f"  proxy fds {fds0} -> {fds1}; {open_now} of {len(socks)} still open after the"
          f" legit run")
    print_legit("during the idle load", during)
    # 150 MiB for 10,000 connections; scaled when fewer were opened.
    limit = 150 * len(socks) / 10000
    ok_rss = growth <= limit
    ok_p99 = during["p99"] <= 10 and during["errors"] == 0
    print(f"  RSS {rss0 / 1024:.1f} -> {max(rss1, rss2) / 1024:.1f} MiB (peak {hwm / 1024:.1f}),"
          f" {rss3 / 1024:.1f} MiB 1 s after they were closed")
    print(f"  => RSS growth {growth:.1f} MiB = {per_conn:.1f} KiB/conn for {len(socks)} conns"
          f"   target <= {limit:.0f} MiB (150 MiB for 10000, 15.4 KiB/conn): {verdict(ok_rss)}")
    print(f"  => legit p99 during idle load {fmt_ms(during['p99'])} (baseline"
          f" {fmt_ms(base['p99'])})   target <= 10 ms: {verdict(ok_p99)}")
    if len(socks) < n:
        print(f"  NOTE: only {len(socks)} of {n} idle connections could be opened")
    report["L-5 RSS growth"] = ok_rss
    report["L-5 legit p99"] = ok_p99


async def phase_slowloris(loop, args, report):
    port, pid, n, timeout = args.slow_port, args.slow_pid, args.slow_conns, args.slow_timeout
    every = args.byte_interval
    print(f"\nL-7 slowloris: {n} connections, each sends one byte of a request head every"
          f" {every:g} s and never finishes it;")
    # Legitimate requests spread over the attack (until ~1 s before the
    # timeout), so that they also meet the attackers' byte bursts every
    # `every` seconds; the baseline is paced the same way.
    spread = max(args.interval, (timeout - 2) / max(args.legit, 1))
    print(f"  the proxy runs with --header-read-timeout {timeout}; legit requests"
          f" {spread * 1000:.0f} ms apart.")
    base = summarize(await legit(port, args, interval=spread))
    print_legit("baseline", base)
    await asyncio.sleep(0.5)
    rss0 = rss_kib(pid)
    reset_peak(pid)
    box = {}
    stop = asyncio.Event()
    sampler = asyncio.create_task(rss_sampler(pid, box, stop))
    head = b"GET http://127.0.0.1/slow HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
    closed_after, closed_at, got_bytes, errors = [], [], [0], []
    connected = [0]
    sem = asyncio.Semaphore(args.parallel)
    give_up = timeout + args.slow_grace

    # Callbacks rather than a task per connection: the generator's own work
    # at each byte burst stays small (it shares a core with the legitimate
    # requests).
    live = {}  # fd -> [socket, connect time, bytes sent, timer handle]
    all_done = asyncio.Event()
    launching = [True]

    def finish(fd, closed_by_proxy):
        entry = live.pop(fd, None)
        if entry is None:
            return
        s, start, _, handle = entry
        if closed_by_proxy:
            closed_at.append(time.monotonic())
            closed_after.append(closed_at[-1] - start)
        loop.remove_reader(fd)
        if handle is not None:
            handle.cancel()
        s.close()
        if not live and not launching[0]:
            all_done.set()

    def on_readable(fd):
        entry = live.get(fd)
        if entry is None:
            return
        try:
            data = entry[0].recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            got_bytes[0] += len(data)
        else:
            finish(fd, True)

    def send_next(fd):
        entry = live.get(fd)
        if entry is None:
            return
        s, start, i, _ = entry
        if time.monotonic() - start > give_up:
            finish(fd, False)  # never closed by the proxy
            return
        try:
            s.send(head[i:i + 1] if i < len(head) else b"a")
        except BlockingIOError:
            pass
        except OSError:
            finish(fd, True)
            return
        entry[2] = i + 1
        entry[3] = loop.call_at(loop.time() + (start + (i + 1) * every - time.monotonic()),
                                send_next, fd)

    async def one():
        async with sem:
            try:
                s = await aconnect(loop, args.host, port)
            except OSError as e:
                errors.append(f"{type(e).__name__}: {e}")
                return
        connected[0] += 1
        fd = s.fileno()
        live[fd] = [s, time.monotonic(), 0, None]
        loop.add_reader(fd, on_readable, fd)
        send_next(fd)

    async def attack_all():
        await asyncio.gather(*(one() for _ in range(n)))
        launching[0] = False
        if not live:
            all_done.set()
        await all_done.wait()

    t0, lo0 = time.monotonic(), listen_overflows()
    attack = asyncio.ensure_future(attack_all())
    # Legitimate requests once every attacker is connected (or after 3 s).
    while connected[0] + len(errors) < n and time.monotonic() - t0 < 3:
        await asyncio.sleep(0.05)
    ramp = time.monotonic() - t0
    overflows = listen_overflows() - lo0
    during = summarize(await legit(port, args, interval=spread))
    legit_end = time.monotonic() - t0
    slow_at = ", ".join(f"{t - t0:.1f}" for t in during.get("top_at", []))
    await attack
    stop.set()
    await sampler
    if not alive(pid):
        raise SetupError("the slowloris-test client proxy died")
    rss_peak = max(box.get("max", rss0), rss_kib(pid, "VmHWM"))
    rss_after = rss_kib(pid)
    growth = (rss_peak - rss0) / 1024
    target = timeout + 1
    n_conn = connected[0]
    print(f"  {n_conn} of {n} connected in {ramp:.1f} s"
          + (f"; {len(errors)} failed (first: {errors[0]})" if errors else "")
          + f"; accept-queue overflows (host-wide) {overflows}"
          f"; legit requests ran from {ramp:.1f} s to {legit_end:.1f} s")
    print_legit("during the attack", during)
    print(f"  (the slowest three started {slow_at} s after the attack; bytes go out"
          f" {ramp:.1f} s wide every {every:g} s)")
    if got_bytes[0]:
        print(f"  the proxy sent {got_bytes[0]} bytes to the attackers before closing"
              f" (~{got_bytes[0] / max(len(closed_after), 1):.0f} per connection, e.g. a 408)")
    else:
        print("  the proxy sent no bytes to the attackers before closing (no 408)")
    if closed_at:
        print(f"  the last one was closed {max(closed_at) - t0:.2f} s after the attack started")
    print(f"  RSS {rss0 / 1024:.1f} -> peak {rss_peak / 1024:.1f} MiB, {rss_after / 1024:.1f}"
          f" after the attack")
    # 50 MiB for 2,000 connections; scaled when another count ran.
    limit = 50 * n_conn / 2000
    ok_rss = growth <= limit
    print(f"  => RSS growth {growth:.1f} MiB ({growth * 1024 / max(n_conn, 1):.1f} KiB/conn)"
          f"   target <= {limit:.0f} MiB (50 MiB for 2000, 25.6 KiB/conn): {verdict(ok_rss)}")
    if closed_after:
        mx, p99, p50 = max(closed_after), percentile(closed_after, 99), percentile(closed_after, 50)
        not_closed = n_conn - len(closed_after)
        ok_close = not_closed == 0 and mx <= target
        print(f"  => closed by the proxy after: p50 {p50:.2f} s, p99 {p99:.2f} s, max {mx:.2f} s;"
              f" {len(closed_after)} of {n_conn} closed"
              + (f", {not_closed} still open after {give_up:g} s" if not_closed else "")
              + f"   target all <= {target:g} s (timeout + 1 s): {verdict(ok_close)}")
    else:
        ok_close = False
        print(f"  => none of the {n_conn} connections was closed within {give_up:g} s"
              f"   target all <= {target:g} s: NOT met")
    ratio = during["p99"] / base["p99"] if base["p99"] > 0 else float("inf")
    ok_p99 = ratio <= 2 and during["errors"] == 0
    print(f"  => legit p99 during the attack {fmt_ms(during['p99'])} = {ratio:.2f} x baseline"
          f" {fmt_ms(base['p99'])}   target <= 2 x: {verdict(ok_p99)}")
    report["L-7 RSS growth"] = ok_rss
    report["L-7 closed by timeout + 1 s"] = ok_close
    report["L-7 legit p99 <= 2x"] = ok_p99


async def phase_idle_close(loop, args, report):
    """L-5's last clause: idle keep-alive connections closed at the timeout."""
    port, pid, n, timeout = args.slow_port, args.slow_pid, args.close_conns, args.slow_timeout
    print(f"\nL-5 idle timeout: {n} keep-alive connections (one request each, then idle)"
          f" to the proxy with --header-read-timeout {timeout};")
    print("  time from the end of each response until the proxy closed the connection.")
    rss0 = rss_kib(pid)
    socks, since, errors = await open_keepalive(loop, args.host, port, args.url, n, args.parallel)
    if errors:
        print(f"  {len(errors)} failed to open (first: {errors[0]})")
    closed_after, stray = [], [0]
    give_up = timeout + args.slow_grace
    pending = dict(zip((s.fileno() for s in socks), zip(socks, since)))
    done = asyncio.Event()

    def on_readable(fd):
        s, t = pending[fd]
        if still_open(s):
            try:
                stray[0] += len(s.recv(65536))  # a 408? keep waiting for the close
            except OSError:
                pass
            if still_open(s):
                return
        closed_after.append(time.monotonic() - t)
        loop.remove_reader(fd)
        del pending[fd]
        s.close()
        if not pending:
            done.set()

    for fd in list(pending):
        loop.add_reader(fd, on_readable, fd)
    rss_peak = rss_kib(pid)
    deadline = (max(since) if since else time.monotonic()) + give_up
    while pending and time.monotonic() < deadline:
        rss_peak = max(rss_peak, rss_kib(pid))
        try:
            await asyncio.wait_for(done.wait(), 0.2)
        except asyncio.TimeoutError:
            pass
    left = len(pending)
    for fd, (s, _) in list(pending.items()):
        loop.remove_reader(fd)
        s.close()
    await asyncio.sleep(0.5)
    rss_after = rss_kib(pid)
    if not alive(pid):
        raise SetupError("the client proxy died")
    print(f"  RSS {rss0 / 1024:.1f} -> peak {rss_peak / 1024:.1f} -> {rss_after / 1024:.1f} MiB"
          f" once they were closed")
    print(f"  the proxy sent {stray[0]} bytes on the idle connections before closing them")
    if closed_after:
        lo, hi = min(closed_after), max(closed_after)
        ok = left == 0 and timeout - 1 <= lo and hi <= timeout + 1
        print(f"  => closed after: min {lo:.2f} s, p50 {percentile(closed_after, 50):.2f} s,"
              f" p99 {percentile(closed_after, 99):.2f} s, max {hi:.2f} s; {len(closed_after)}"
              f" of {len(socks)} closed" + (f", {left} still open after {give_up:g} s" if left else "")
              + f"   target all in {timeout} s +- 1 s: {verdict(ok)}")
    else:
        ok = False
        print(f"  => none of {len(socks)} closed within {give_up:g} s"
              f"   target {timeout} s +- 1 s: NOT met")
    report["L-5 idle closed at timeout +- 1 s"] = ok


async def run_main(args):
    loop = asyncio.get_running_loop()
    await warm(loop, args.idle_port, args)
    await warm(loop, args.slow_port, args)
    report = {}
    if args.idle_conns > 0:
        await phase_idle(loop, args, report)
    if args.slow_conns > 0:
        await phase_slowloris(loop, args, report)
    if args.close_conns > 0:
        await phase_idle_close(loop, args, report)
    print("\nSummary:")
    for name, ok in report.items():
        print(f"  {name:<36} {verdict(ok)}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    lg = sub.add_parser("legit")
    lg.add_argument("--host", default="127.0.0.1")
    lg.add_argument("--port", type=int, required=True)
    lg.add_argument("--url", required=True)
    lg.add_argument("--count", type=int, default=200)
    lg.add_argument("--interval", type=float, default=0.01)
    r = sub.add_parser("run")
    r.add_argument("--host", default="127.0.0.1")
    r.add_argument("--url", required=True, help="absolute URL of a small cacheable file")
    r.add_argument("--idle-port", type=int, required=True)
    r.add_argument("--idle-pid", type=int, required=True)
    r.add_argument("--idle-timeout", type=int, required=True)
    r.add_argument("--idle-conns", type=int, default=10000)
    r.add_argument("--slow-port", type=int, required=True)
    r.add_argument("--slow-pid", type=int, required=True)
    r.add_argument("--slow-timeout", type=int, required=True)
    r.add_argument("--slow-conns", type=int, default=2000)
    r.add_argument("--close-conns", type=int, default=10000)
    r.add_argument("--byte-interval", type=float, default=5.0)
    r.add_argument("--slow-grace", type=float, default=10.0,
                   help="seconds past the timeout before giving up on a close")
    r.add_argument("--legit", type=int, default=200)
    r.add_argument("--interval", type=float, default=0.01,
                   help="pause between legitimate requests (s)")
    r.add_argument("--parallel", type=int, default=100, help="connects in flight")
    r.add_argument("--settle", type=float, default=2.0)
    args = p.parse_args()
    if args.cmd == "legit":
        legit_main(args)
        return 0
    try:
        asyncio.run(run_main(args))
    except SetupError as e:
        print(f"load: FAIL: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
