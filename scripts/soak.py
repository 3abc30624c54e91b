#!/usr/bin/env python3
"""Load generator for scripts/soak.sh (rows L-13 and L-14 of RELIABILITY.md).

Python 3 standard library only (asyncio on raw non-blocking sockets). It is
started by scripts/soak.sh, which builds rproxy, starts nginx (origin and
reverse proxy) and the rproxy pair, and cleans up. Subcommands:

  soak.py stall --port P --path PATH [--header K:V]... --conns N --hold S
          --pid NAME=PID... --bystander-port Q --bystander-path URL
          [--bystander-header K:V]...
      N connections each send a GET for PATH ("{i}" in it: the connection's
      number) and read the response head,
      then never read again; with all of them stalled, a bystander process
      sends 200 small requests. Prints one JSON object: the processes'
      memory and threads before and while stalled, the bystander's
      latencies, and how many stalled requests got a 200 head.
  soak.py burst --port P --prefix URL --count N --expect DIR --pid NAME=PID...
      N concurrent GETs of PREFIX + fNNN (the files of DIR), each body
      checked against DIR; prints JSON: peak RSS (VmHWM reset before), time,
      failures.
  soak.py bystander --port P --path URL [--header K:V]... --count 200
      (one request per fresh connection, 10 ms apart; JSON latencies in ms)
  soak.py mem --pid NAME=PID...
      (JSON: VmRSS, VmHWM and threads of each process and its children)

Exit status: 0 when the measurements ran (whether or not targets were
met), 2 on a setup failure.
"""

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time


def log(msg):
    print(f"soak: {msg}", file=sys.stderr, flush=True)


def percentile(values, p):
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


# ---- /proc ---------------------------------------------------------------


def status_fields(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in ("VmRSS", "VmHWM"):
                    out[name] = int(value.split()[0])
                elif name == "Threads":
                    out[name] = int(value)
    except OSError:
        pass
    return out


def children(pid):
    kids = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(k) for k in f.read().split()]
    except OSError:
        pass
    return kids


def family(pid):
    """The process and its children (nginx: master and workers)."""
    return [pid] + children(pid)


def mem(pid):
    """RSS and peak RSS (KiB) and threads, summed over the family."""
    total = {"rss_kib": 0, "hwm_kib": 0, "threads": 0}
    for p in family(pid):
        f = status_fields(p)
        total["rss_kib"] += f.get("VmRSS", 0)
        total["hwm_kib"] += f.get("VmHWM", 0)
        total["threads"] += f.get("Threads", 0)
    return total


def reset_peak(pid):
    ok = True
    for p in family(pid):
        try:
            with open(f"/proc/{p}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            ok = False
    return ok


def parse_pids(items):
    out = {}
    for item in items or []:
        name, _, pid = item.partition("=")
        out[name] = int(pid)
    return out


def mem_all(pids):
    return {name: mem(pid) for name, pid in pids.items()}


# ---- HTTP/1.1 on raw sockets ------------------------------------------------


def request_bytes(path, headers):
    lines = [f"GET {path} HTTP/1.1", "Host: soak.test", "User-Agent: rproxy-soak"]
    lines += headers
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def parse_head(head):
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


class Reader:
    """Buffered reads from a non-blocking socket on the event loop."""

    def __init__(self, loop, sock):
        self.loop, self.sock, self.buf = loop, sock, bytearray()

    async def fill(self):
        chunk = await self.loop.sock_recv(self.sock, 1 << 18)
        if not chunk:
            raise ConnectionError("closed early")
        self.buf += chunk

    async def until(self, marker):
        while True:
            at = self.buf.find(marker)
            if at >= 0:
                out = bytes(self.buf[:at])
                del self.buf[: at + len(marker)]
                return out
            await self.fill()

    async def exactly(self, n):
        while len(self.buf) < n:
            await self.fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def body(self, headers):
        if "content-length" in headers:
            return await self.exactly(int(headers["content-length"]))
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parts = []
            while True:
                size = int((await self.until(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await self.until(b"\r\n")
                    return b"".join(parts)
                parts.append(await self.exactly(size))
                await self.until(b"\r\n")
        while True:  # until EOF
            try:
                await self.fill()
            except ConnectionError:
                out = bytes(self.buf)
                self.buf.clear()
                return out


async def connect(loop, port, rcvbuf=None):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    return sock


# ---- bystander (own process) -----------------------------------------------


def bystander_main(args):
    req = request_bytes(args.path, args.header or [])

    def one():
        start = time.perf_counter()
        with socket.create_connection(("127.0.0.1", args.port), timeout=10) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(req)
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionError("closed before the head")
                buf += chunk
            head, _, body = buf.partition(b"\r\n\r\n")
            status, headers = parse_head(head)
            if "content-length" in headers:
                need = int(headers["content-length"])
                while len(body) < need:
                    chunk = s.recv(65536)
                    if not chunk:
                        raise ConnectionError("closed in the body")
                    body += chunk
            else:  # chunked: up to the last chunk
                while not body.endswith(b"0\r\n\r\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        raise ConnectionError("closed in the body")
                    body += chunk
        return status, time.perf_counter() - start

    try:
        one()  # warm-up, untimed
    except OSError:
        pass
    ms, errors = [], []
    next_at = time.perf_counter()
    for _ in range(args.count):
        try:
            status, secs = one()
            if status == 200:
                ms.append(secs * 1000.0)
            else:
                errors.append(f"status {status}")
        except OSError as e:
            errors.append(f"{type(e).__name__}: {e}")
        next_at += 0.01
        pause = next_at - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    json.dump({"ms": ms, "errors": errors}, sys.stdout)


def run_bystander(args):
    cmd = [sys.executable, os.path.abspath(__file__), "bystander",
           "--port", str(args.bystander_port), "--path", args.bystander_path,
           "--count", str(args.bystanders)]
    for h in args.bystander_header or []:
        cmd += ["--header", h]
    out = subprocess.run(cmd, check=True, capture_output=True).stdout
    result = json.loads(out)
    ms = result["ms"]
    return {
        "p50_ms": percentile(ms, 50) if ms else None,
        "p99_ms": percentile(ms, 99) if ms else None,
        "max_ms": max(ms) if ms else None,
        "ok": len(ms),
        "errors": len(result["errors"]),
        "first_error": (result["errors"] or [""])[0],
    }


# ---- stalled readers ---------------------------------------------------------


async def stall_main(args):
    loop = asyncio.get_running_loop()
    pids = parse_pids(args.pid)
    before = mem_all(pids)
    for pid in pids.values():
        reset_peak(pid)
    socks, heads = [], {"ok": 0, "other": 0, "failed": 0}
    sem = asyncio.Semaphore(200)  # connects in flight at once

    async def one(i):
        req = request_bytes(args.path.replace("{i}", str(i)), args.header or [])
        async with sem:
            try:
                sock = await connect(loop, args.port, rcvbuf=64 << 10)
            except OSError:
                heads["failed"] += 1
                return
            socks.append(sock)
            try:
                await loop.sock_sendall(sock, req)
                reader = Reader(loop, sock)
                status, _ = parse_head(await asyncio.wait_for(reader.until(b"\r\n\r\n"), 30))
                heads["ok" if status == 200 else "other"] += 1
            except (OSError, asyncio.TimeoutError, ConnectionError):
                heads["failed"] += 1
            # From here on nothing is read: the response stalls.

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(args.conns)))
    log(f"{len(socks)} connections, heads {heads}, in {time.monotonic() - started:.1f}s")
    # Let the servers fill every buffer they will fill.
    await asyncio.sleep(args.settle)
    stalled = mem_all(pids)
    bystander = await loop.run_in_executor(None, run_bystander, args)
    during = mem_all(pids)
    for sock in socks:
        sock.close()
    json.dump({"before": before, "stalled": stalled, "after_bystander": during,
               "heads": heads, "bystander": bystander}, sys.stdout)


# ---- burst ---------------------------------------------------------------------


async def burst_main(args):
    loop = asyncio.get_running_loop()
    pids = parse_pids(args.pid)
    expected = {}
    for name in sorted(os.listdir(args.expect))[: args.count]:
        with open(os.path.join(args.expect, name), "rb") as f:
            expected[name] = f.read()
    before = mem_all(pids)
    peak_reset = all(reset_peak(pid) for pid in pids.values())
    results = {"ok": 0, "wrong": 0, "failed": 0, "first_error": ""}
    peaks = {name: 0 for name in pids}

    async def sample():
        while True:
            for name, m in mem_all(pids).items():
                peaks[name] = max(peaks[name], m["rss_kib"])
            await asyncio.sleep(0.05)

    async def one(name, body):
        try:
            sock = await connect(loop, args.port)
            try:
                await loop.sock_sendall(sock, request_bytes(args.prefix + name, []))
                reader = Reader(loop, sock)
                status, headers = parse_head(await reader.until(b"\r\n\r\n"))
                got = await reader.body(headers)
            finally:
                sock.close()
            if status == 200 and got == body:
                results["ok"] += 1
            else:
                results["wrong"] += 1
                if not results["first_error"]:
                    results["first_error"] = f"{name}: status {status}, {len(got)} bytes"
        except (OSError, ConnectionError, ValueError) as e:
            results["failed"] += 1
            if not results["first_error"]:
                results["first_error"] = f"{name}: {type(e).__name__}: {e}"

    sampler = asyncio.ensure_future(sample())
    started = time.monotonic()
    await asyncio.wait_for(
        asyncio.gather(*(one(n, b) for n, b in expected.items())), args.timeout)
    seconds = time.monotonic() - started
    sampler.cancel()
    after = mem_all(pids)
    json.dump({"before": before, "after": after, "sampled_peak_kib": peaks,
               "peak_reset": peak_reset, "seconds": seconds, **results}, sys.stdout)


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stall")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--path", required=True)
    s.add_argument("--header", action="append")
    s.add_argument("--conns", type=int, default=1000)
    s.add_argument("--settle", type=float, default=5.0)
    s.add_argument("--pid", action="append")
    s.add_argument("--bystander-port", type=int, required=True)
    s.add_argument("--bystander-path", required=True)
    s.add_argument("--bystander-header", action="append")
    s.add_argument("--bystanders", type=int, default=200)
    b = sub.add_parser("burst")
    b.add_argument("--port", type=int, required=True)
    b.add_argument("--prefix", required=True)
    b.add_argument("--count", type=int, default=300)
    b.add_argument("--expect", required=True)
    b.add_argument("--timeout", type=float, default=300)
    b.add_argument("--pid", action="append")
    y = sub.add_parser("bystander")
    y.add_argument("--port", type=int, required=True)
    y.add_argument("--path", required=True)
    y.add_argument("--header", action="append")
    y.add_argument("--count", type=int, default=200)
    m = sub.add_parser("mem")
    m.add_argument("--pid", action="append")
    args = parser.parse_args()
    try:
        if args.cmd == "stall":
            asyncio.run(stall_main(args))
        elif args.cmd == "burst":
            asyncio.run(burst_main(args))
        elif args.cmd == "bystander":
            bystander_main(args)
        else:
            json.dump(mem_all(parse_pids(args.pid)), sys.stdout)
    except (OSError, subprocess.CalledProcessError) as e:
        log(f"setup failure: {e}")
        sys.exit(2)


if __name__ == "__main__":
    main()
