#!/usr/bin/env python3
"""Load generator for scripts/soak.sh (rows L-13 and L-14 of RELIABILITY.md).

Python 3 standard library only (asyncio on raw non-blocking sockets; ssl
and hand-written HTTP/2 frames for h2stall). It is
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
  soak.py h2stall --port P --path PATH [--header K:V]... --streams N
          --per-conn S --settle T --pid NAME=PID... --bystander-path URL
          [--bystander-header K:V]... [--bystander-port Q]
      The same over HTTP/2 on TLS (ALPN h2), framed by hand: ceil(N/S)
      connections with N streams in all (at most S, and at most the
      server's SETTINGS_MAX_CONCURRENT_STREAMS, on each), every stream
      opened with a window of 0 (SETTINGS_INITIAL_WINDOW_SIZE=0) so that
      the server can send the response head but no DATA; no WINDOW_UPDATE
      is ever sent. The bystander uses a fresh h2 connection per request
      to the same TLS listener (Q, default P). Prints the same JSON as
      stall, plus "h2": streams opened, resets, GOAWAYs, connections the
      server closed.
  soak.py burst --port P --prefix URL --count N --expect DIR --pid NAME=PID...
      N concurrent GETs of PREFIX + fNNN (the files of DIR), each body
      checked against DIR; prints JSON: peak RSS (VmHWM reset before), time,
      failures.
  soak.py bystander --port P --path URL [--header K:V]... --count 200 [--h2]
      (one request per fresh connection, 10 ms apart; JSON latencies in ms;
      --h2: TLS and HTTP/2)
  soak.py mem --pid NAME=PID...
      (JSON: VmRSS, VmHWM and threads of each process and its children)
  soak.py mixed --port P --origin URL --root DIR --client-stats URL
          --accel-stats URL --pid NAME=PID... [--rate 50] [--conns 8]
          [--minutes 60] [--idle 5] [--sample 60] [--hot-files 200]
          [--delta-files 20] [--hot-pct 80] [--delta-pct 15]
      For scripts/soak-mixed.sh (row L-11): makes the files in DIR (nginx's
      root), then asks the client proxy (port P, absolute URLs under URL)
      at a fixed rate over CONNS keep-alive connections: hits (hot/, long
      max-age), deltas (delta/, no-cache: each edited just before it is
      asked for) and whole new bodies (full/, a fresh name each), every
      body checked against the file; then IDLE minutes with no request.
      Every SAMPLE seconds (and at 0, before the first request): VmRSS,
      open fds and threads of each PID and both proxies' stats; the client
      proxy's cache_bytes also every 5 s. Prints JSON: the samples, what
      the generator saw between them (statuses, wrong bodies, latencies),
      the largest cache_bytes against cache_budget.

Exit status: 0 when the measurements ran (whether or not targets were
met), 2 on a setup failure.
"""

import argparse
import asyncio
import json
import os
import socket
import ssl
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
                if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
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
    ctx = tls_context() if args.h2 else None

    def one():
        if args.h2:
            start = time.perf_counter()
            status, _ = h2_get_once(args.port, args.path, args.header, ctx)
            return status, time.perf_counter() - start
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
    if args.cmd == "h2stall":  # the same TLS listener, a fresh h2 connection each
        cmd.append("--h2")
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


# ---- HTTP/2 over TLS, framed by hand (RFC 9113, RFC 7541) ------------------
#
# Only what a client that stops reading needs: the preface, SETTINGS (and
# their acks), HEADERS out with HPACK literals, HEADERS/CONTINUATION in far
# enough to read :status, PING answers, and RST_STREAM / GOAWAY noted. No
# Huffman coding and no dynamic table on our side, so every request block is
# independent of the others.

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H2_DATA, H2_HEADERS, H2_RST_STREAM, H2_SETTINGS = 0x0, 0x1, 0x3, 0x4
H2_PING, H2_GOAWAY, H2_WINDOW_UPDATE, H2_CONTINUATION = 0x6, 0x7, 0x8, 0x9
H2_END_STREAM, H2_ACK, H2_END_HEADERS, H2_PADDED, H2_PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 0x2, 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
H2_REFUSED_STREAM = 0x7
# The static table's :status entries (RFC 7541 appendix A), index -> status.
HPACK_STATIC_STATUS = {8: 200, 9: 204, 10: 206, 11: 304, 12: 400, 13: 404, 14: 500}
# Huffman codes of the ten digits (RFC 7541 appendix B): enough to read a
# :status a server sends as a Huffman-coded literal.
HPACK_HUFFMAN_DIGITS = {(0b00000, 5): "0", (0b00001, 5): "1", (0b00010, 5): "2",
                        (0b011001, 6): "3", (0b011010, 6): "4", (0b011011, 6): "5",
                        (0b011100, 6): "6", (0b011101, 6): "7", (0b011110, 6): "8",
                        (0b011111, 6): "9"}


def h2_frame(kind, flags, stream, payload=b""):
    return (len(payload).to_bytes(3, "big") + bytes([kind, flags])
            + stream.to_bytes(4, "big") + payload)


def h2_settings(pairs):
    return h2_frame(H2_SETTINGS, 0, 0, b"".join(
        k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in pairs))


def hpack_int(value, prefix_bits, first=0):
    """An HPACK integer with an N-bit prefix (RFC 7541 section 5.1)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def hpack_read_int(block, pos, prefix_bits):
    limit = (1 << prefix_bits) - 1
    value = block[pos] & limit
    pos += 1
    if value < limit:
        return value, pos
    shift = 0
    while True:
        byte = block[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def hpack_block(path, headers, authority):
    """A request's header block: every field a literal without indexing with
    a new name (0x00), no Huffman, so nothing lands in the server's dynamic
    table and no decoder state is shared between requests. AUTHORITY is
    host:port as the client reached the server: the accelerator serves an
    h2 request itself only when :authority names it (the SNI name and its
    port, what a client proxy with an https:// upstream sends); any other
    authority is someone else's site, refused with 400."""
    fields = [(":method", "GET"), (":scheme", "https"), (":authority", authority),
              (":path", path), ("user-agent", "rproxy-soak")]
    for h in headers or []:
        name, _, value = h.partition(":")
        fields.append((name.strip().lower(), value.strip()))  # h2 names are lower case
    out = bytearray()
    for name, value in fields:
        n, v = name.encode(), value.encode()
        out += b"\x00" + hpack_int(len(n), 7) + n + hpack_int(len(v), 7) + v
    return bytes(out)


def hpack_status(block):
    """The :status of a response header block (it must be the first field),
    or 0 if it is coded in a way we do not decode (a dynamic table entry)."""
    try:
        pos = 0
        while block[pos] & 0xE0 == 0x20:  # dynamic table size updates come first
            _, pos = hpack_read_int(block, pos, 5)
        first = block[pos]
        if first & 0x80:  # indexed field
            index, _ = hpack_read_int(block, pos, 7)
            return HPACK_STATIC_STATUS.get(index, 0)
        # A literal, with incremental indexing (01), or without / never (000x).
        index, pos = hpack_read_int(block, pos, 6 if first & 0x40 else 4)
        if not 8 <= index <= 14:  # not the :status name
            return 0
        huffman = block[pos] & 0x80
        length, pos = hpack_read_int(block, pos, 7)
        raw = block[pos:pos + length]
        if not huffman:
            text = raw.decode("latin-1")
        else:
            bits = "".join(f"{b:08b}" for b in raw)
            text, code, width = "", 0, 0
            for bit in bits:
                code, width = code * 2 + int(bit), width + 1
                if (code, width) in HPACK_HUFFMAN_DIGITS:
                    text += HPACK_HUFFMAN_DIGITS[(code, width)]
                    code, width = 0, 0
                elif width > 6:
                    break  # the padding (all ones), or not a digit
        return int(text) if len(text) == 3 and text.isdigit() else 0
    except (IndexError, ValueError):
        return 0


def h2_strip(flags, payload, kind):
    """The header block fragment of a HEADERS frame: padding and priority off."""
    pos, end = 0, len(payload)
    if flags & H2_PADDED:
        end -= payload[0]
        pos = 1
    if kind == H2_HEADERS and flags & H2_PRIORITY:
        pos += 5
    return payload[pos:end]


def tls_context():
    """A client context offering only h2. No certificate check: the server is
    ours, on loopback, with a throw-away self-signed certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    return ctx


def h2_get_once(port, path, headers, ctx):
    """One GET on a fresh TLS connection speaking h2 (the bystander): the
    status and the body's length. Our windows stay at their 65,535 defaults,
    larger than the small body, so no WINDOW_UPDATE is needed."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with ctx.wrap_socket(raw, server_hostname="localhost") as s:
        if s.selected_alpn_protocol() != "h2":
            raise ConnectionError(f"ALPN chose {s.selected_alpn_protocol()!r}, not h2")
        # Preface, our SETTINGS and the request in one write: one round trip.
        s.sendall(H2_PREFACE + h2_settings([(SETTINGS_ENABLE_PUSH, 0)])
                  + h2_frame(H2_HEADERS, H2_END_HEADERS | H2_END_STREAM, 1,
                             hpack_block(path, headers, f"localhost:{port}")))
        buf, status, body = bytearray(), 0, 0
        while True:
            while len(buf) < 9 or len(buf) < 9 + int.from_bytes(buf[:3], "big"):
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionError("closed before the end of the stream")
                buf += chunk
            length = int.from_bytes(buf[:3], "big")
            kind, flags = buf[3], buf[4]
            stream = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
            payload = bytes(buf[9:9 + length])
            del buf[:9 + length]
            if kind == H2_SETTINGS and not flags & H2_ACK:
                s.sendall(h2_frame(H2_SETTINGS, H2_ACK, 0))
            elif kind == H2_PING and not flags & H2_ACK:
                s.sendall(h2_frame(H2_PING, H2_ACK, 0, payload))
            elif kind == H2_GOAWAY:
                code = int.from_bytes(payload[4:8], "big")
                if code or int.from_bytes(payload[:4], "big") & 0x7FFFFFFF < 1:
                    raise ConnectionError(f"GOAWAY, error {code}")
            elif stream != 1:
                continue
            elif kind == H2_RST_STREAM:
                raise ConnectionError(f"RST_STREAM, error {int.from_bytes(payload, 'big')}")
            elif kind == H2_HEADERS and not status:
                # (A response head fits one frame here: the server's
                # SETTINGS_MAX_FRAME_SIZE is 16 KiB at least.)
                status = hpack_status(h2_strip(flags, payload, kind))
            elif kind == H2_DATA:
                body += len(h2_strip(flags, payload, kind))
            if stream == 1 and kind in (H2_DATA, H2_HEADERS) and flags & H2_END_STREAM:
                return status, body


class H2Stalled:
    """One h2 connection whose streams get a zero window: SETTINGS_INITIAL_
    WINDOW_SIZE=0 before any stream opens, so the server may send response
    HEADERS (not flow-controlled) but not one byte of DATA. The connection
    window is left at its 65,535 start (SETTINGS cannot change it, and we
    never send a WINDOW_UPDATE): it does not matter while every stream's
    window is zero. The socket is read all along, as a real client's would
    be, to answer PINGs and see resets; nothing else is ever read off it
    because nothing else may be sent."""

    def __init__(self, number):
        self.number = number
        self.reader = self.writer = None
        self.port = None
        self.max_streams = None  # the server's SETTINGS_MAX_CONCURRENT_STREAMS
        self.server_settings = asyncio.Event()
        self.status = {}  # stream id -> :status, or "reset" / "refused"
        self.blocks = {}  # stream id -> header block being collected
        self.open = []  # stream ids opened
        self.done = asyncio.Event()  # every stream got a head (or a reset)
        self.closed = None  # why the connection ended, if it did
        self.data_bytes = 0  # DATA the server sent despite the zero window
        self.goaway = None
        self.resets_after_head = 0
        self.resets_late = 0  # RST_STREAM after the wait for heads ended
        self.waiting = True  # still in the wait for heads
        self.progress = None  # an Event set at every head or reset, shared

    async def connect(self, port, ctx):
        self.port = port
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # As the HTTP/1.1 readers: a small receive buffer, so the kernel
        # holds little on our side either.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        self.reader, self.writer = await asyncio.open_connection(
            sock=sock, ssl=ctx, server_hostname="localhost")
        alpn = self.writer.get_extra_info("ssl_object").selected_alpn_protocol()
        if alpn != "h2":
            raise ConnectionError(f"ALPN chose {alpn!r}, not h2")
        # Our SETTINGS go before any HEADERS, and the server applies them in
        # order, so every stream starts with a window of 0.
        self.writer.write(H2_PREFACE + h2_settings([
            (SETTINGS_ENABLE_PUSH, 0), (SETTINGS_INITIAL_WINDOW_SIZE, 0)]))
        await self.writer.drain()

    async def open_streams(self, count, path, headers):
        # The server's first frame is its SETTINGS: wait for its stream limit.
        await asyncio.wait_for(self.server_settings.wait(), 30)
        if self.max_streams is not None and count > self.max_streams:
            log(f"h2 connection {self.number}: the server allows {self.max_streams} "
                f"streams at once, opening {self.max_streams} of {count}")
            count = self.max_streams
        out = bytearray()
        for k in range(count):
            sid = 2 * k + 1
            self.open.append(sid)
            out += h2_frame(H2_HEADERS, H2_END_HEADERS | H2_END_STREAM, sid,
                            hpack_block(path.replace("{i}", f"{self.number}-{sid}"), headers,
                                        f"localhost:{self.port}"))
        self.writer.write(bytes(out))
        await self.writer.drain()
        if not self.open:
            self.done.set()

    def _settled(self, sid, outcome):
        if sid in self.status:
            return
        self.status[sid] = outcome
        if self.progress:
            self.progress.set()
        if len(self.status) == len(self.open):
            self.done.set()

    async def run(self):
        """Reads frames until the connection ends."""
        try:
            while True:
                head = await self.reader.readexactly(9)
                length = int.from_bytes(head[:3], "big")
                kind, flags = head[3], head[4]
                sid = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                payload = await self.reader.readexactly(length) if length else b""
                if kind == H2_SETTINGS and not flags & H2_ACK:
                    for at in range(0, len(payload) - 5, 6):
                        if int.from_bytes(payload[at:at + 2], "big") == SETTINGS_MAX_CONCURRENT_STREAMS:
                            self.max_streams = int.from_bytes(payload[at + 2:at + 6], "big")
                    self.writer.write(h2_frame(H2_SETTINGS, H2_ACK, 0))
                    self.server_settings.set()
                elif kind == H2_PING and not flags & H2_ACK:
                    self.writer.write(h2_frame(H2_PING, H2_ACK, 0, payload))
                elif kind == H2_GOAWAY:
                    self.goaway = (f"last stream {int.from_bytes(payload[:4], 'big') & 0x7FFFFFFF}, "
                                   f"error {int.from_bytes(payload[4:8], 'big')}")
                elif kind in (H2_HEADERS, H2_CONTINUATION):
                    block = self.blocks.get(sid, b"") + h2_strip(flags, payload, kind)
                    if flags & H2_END_HEADERS:
                        self.blocks.pop(sid, None)
                        self._settled(sid, hpack_status(block))
                    else:
                        self.blocks[sid] = block
                elif kind == H2_RST_STREAM:
                    code = int.from_bytes(payload[:4], "big")
                    if sid in self.status:
                        self.resets_after_head += 1
                    if not self.waiting:
                        self.resets_late += 1
                    self._settled(sid, "refused" if code == H2_REFUSED_STREAM else "reset")
                elif kind == H2_DATA:
                    self.data_bytes += length
        except (asyncio.IncompleteReadError, OSError, ConnectionError) as e:
            self.closed = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        finally:
            self.server_settings.set()
            self.done.set()

    def close(self):
        if self.writer:
            self.writer.close()


async def h2stall_main(args):
    pids = parse_pids(args.pid)
    before = mem_all(pids)
    for pid in pids.values():
        reset_peak(pid)
    ctx = tls_context()
    nconns = -(-args.streams // args.per_conn)
    # The streams dealt out as evenly as the connections allow.
    counts = [args.streams // nconns + (k < args.streams % nconns) for k in range(nconns)]
    conns = [H2Stalled(k) for k in range(nconns)]
    progress = asyncio.Event()
    for conn in conns:
        conn.progress = progress
    readers, failed_conns = [], 0
    started = time.monotonic()
    for conn, count in zip(conns, counts):
        try:
            await conn.connect(args.port, ctx)
            readers.append(asyncio.ensure_future(conn.run()))
            await conn.open_streams(count, args.path, args.header)
        except (OSError, ConnectionError, asyncio.TimeoutError) as e:
            failed_conns += 1
            log(f"h2 connection {conn.number}: {type(e).__name__}: {e}")
            conn.done.set()
    # Every stream's head, within the same 30 s per stream the HTTP/1.1
    # readers get (the heads come back in parallel, so 30 s is for all);
    # but stop after 5 s without a new head or reset: a server may hold a
    # head back until the window lets DATA follow it (nginx 1.22 does), and
    # waiting longer only brings its send_timeout and our measurement closer.
    async def all_heads():
        for c in conns:
            await c.done.wait()

    all_done = asyncio.ensure_future(all_heads())
    deadline = time.monotonic() + 30
    while not all_done.done() and time.monotonic() < deadline:
        progress.clear()
        quiet = asyncio.ensure_future(progress.wait())
        await asyncio.wait([all_done, quiet], timeout=min(5, deadline - time.monotonic()),
                           return_when=asyncio.FIRST_COMPLETED)
        if not quiet.done():
            quiet.cancel()
            break
    all_done.cancel()
    for conn in conns:
        conn.waiting = False
    heads = {"ok": 0, "other": 0, "failed": 0}
    outcomes = {}
    for conn, count in zip(conns, counts):
        heads["failed"] += count - len(conn.open)  # never opened
        for sid in conn.open:
            outcome = conn.status.get(sid, "no head")
            outcomes[str(outcome)] = outcomes.get(str(outcome), 0) + 1
            if outcome == 200:
                heads["ok"] += 1
            elif isinstance(outcome, int):
                heads["other"] += 1
            else:
                heads["failed"] += 1
    log(f"{nconns - failed_conns} h2 connections, {sum(len(c.open) for c in conns)} streams, "
        f"heads {heads} {outcomes}, in {time.monotonic() - started:.1f}s")
    await asyncio.sleep(args.settle)
    stalled = mem_all(pids)
    bystander = await asyncio.get_running_loop().run_in_executor(None, run_bystander, args)
    during = mem_all(pids)
    h2 = {
        "connections": nconns, "connections_failed": failed_conns,
        "streams_asked": args.streams,
        "streams_opened": sum(len(c.open) for c in conns),
        "server_max_streams": sorted({c.max_streams for c in conns if c.max_streams is not None}),
        "outcomes": outcomes,
        "resets_after_head": sum(c.resets_after_head for c in conns),
        "resets_late": sum(c.resets_late for c in conns),
        "data_bytes": sum(c.data_bytes for c in conns),
        "goaway": [c.goaway for c in conns if c.goaway],
        # Connections the server ended before we closed them (an idle
        # timeout shows here): the measurement then saw fewer stalled streams.
        "closed_by_server": [c.closed for c in conns if c.closed],
    }
    for conn in conns:
        conn.close()
    for task in readers:
        task.cancel()
    json.dump({"before": before, "stalled": stalled, "after_bystander": during,
               "heads": heads, "bystander": bystander, "h2": h2}, sys.stdout)


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


# ---- mixed load at a fixed rate (L-11) ------------------------------------------
#
# For scripts/soak-mixed.sh: hits, deltas and whole new bodies through the
# client proxy at RATE requests a second for a while, then nothing for a
# while, with the processes sampled all along. The files are made here, in
# the nginx root the script gives.

import base64  # noqa: E402 (this section's own needs)
import random  # noqa: E402
import urllib.request  # noqa: E402

MIXED_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def mixed_vocabulary(rng, n=800):
    return ["".join(rng.choice(MIXED_LETTERS) for _ in range(rng.randint(2, 10))) for _ in range(n)]


def mixed_line(rng, words):
    return " ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) + "\n"


def mixed_lines(rng, words, size):
    lines, n = [], 0
    while n < size:
        line = mixed_line(rng, words)
        lines.append(line)
        n += len(line)
    return lines


def mixed_write(path, data, mtime=None):
    """Writes DATA under PATH in one rename, so nginx never serves half a
    file; MTIME (seconds) set before the rename."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    if mtime is not None:
        os.utime(tmp, (mtime, mtime))
    os.rename(tmp, path)


def mixed_fds(pid):
    # load.py's fd_count, reused rather than copied.
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    from load import fd_count

    return fd_count(pid)


class MixedInterval:
    """What the load generator saw between two samples."""

    def __init__(self):
        self.sent = {"hot": 0, "delta": 0, "full": 0}
        self.ok = {"hot": 0, "delta": 0, "full": 0}
        self.cache_hit = {"hot": 0, "delta": 0, "full": 0}  # "hit" in Cache-Status
        self.ms = {"hot": [], "delta": [], "full": []}
        self.statuses = {}  # status (str) -> count, 200 left out
        self.five_xx = 0
        self.wrong = 0  # 200 with a body other than the file's
        self.failed = 0  # no complete response (timeout, closed)
        self.reconnects = 0  # a reused keep-alive connection closed under us, retried
        self.lag_ms = []  # how late each request started against its slot
        self.first_error = ""
        self.bytes = 0

    def json(self):
        def p(values, q):
            return round(percentile(values, q), 2) if values else None

        return {
            "sent": self.sent, "ok": self.ok, "cache_hit": self.cache_hit,
            "p50_ms": {k: p(v, 50) for k, v in self.ms.items()},
            "p99_ms": {k: p(v, 99) for k, v in self.ms.items()},
            "statuses": self.statuses, "five_xx": self.five_xx, "wrong": self.wrong,
            "failed": self.failed, "reconnects": self.reconnects,
            "lag_p99_ms": p(self.lag_ms, 99), "lag_max_ms": round(max(self.lag_ms), 2) if self.lag_ms else None,
            "first_error": self.first_error, "bytes": self.bytes,
        }


class MixedLoad:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.words = mixed_vocabulary(random.Random(args.seed + 1))
        self.root = args.root
        self.origin = args.origin.rstrip("/")
        self.host = self.origin.split("/")[2]
        self.hot = []  # bodies
        self.delta = []  # lists of lines
        self.delta_locks = []
        self.full_seq = 0
        # nginx's ETag is the mtime in seconds and the size: two edits in one
        # second could give an equal ETag (and a 304 for a changed file), so
        # every edit sets an mtime of its own, counting up from a month ago.
        self.mtime = int(time.time()) - 30 * 86400
        self.interval = MixedInterval()
        self.total = MixedInterval()
        self.backlog_at_end = 0

    def make_files(self):
        rng = random.Random(self.args.seed + 2)
        for sub in ("hot", "delta", "full"):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        for i in range(self.args.hot_files):
            body = "".join(mixed_lines(rng, self.words, rng.randint(2000, 50000))).encode()
            self.hot.append(body)
            mixed_write(os.path.join(self.root, "hot", f"h{i:04d}.txt"), body)
        for i in range(self.args.delta_files):
            lines = mixed_lines(rng, self.words, rng.randint(10000, 100000))
            self.delta.append(lines)
            self.delta_locks.append(asyncio.Lock())
            mixed_write(os.path.join(self.root, "delta", f"d{i:04d}.txt"),
                        "".join(lines).encode(), self.mtime)

    def edit_delta(self, i):
        """One line changed (half the edits), inserted or deleted (a quarter
        each: the files keep their size over an hour) at a random place."""
        lines, rng = self.delta[i], self.rng
        at = rng.randrange(len(lines))
        roll = rng.random()
        if roll < 0.5:
            lines[at] = mixed_line(rng, self.words)
        elif roll < 0.75 or len(lines) < 50:
            lines.insert(at, mixed_line(rng, self.words))
        else:
            del lines[at]
        self.mtime += 1
        body = "".join(lines).encode()
        mixed_write(os.path.join(self.root, "delta", f"d{i:04d}.txt"), body, self.mtime)
        return body

    def new_full(self):
        """A fresh body of random base64 text at a URL never used before."""
        self.full_seq += 1
        size = self.rng.randint(50000, 500000)
        body = base64.encodebytes(os.urandom(size * 3 // 4 + 3))[:size]
        name = f"f{self.full_seq:07d}.txt"
        mixed_write(os.path.join(self.root, "full", name), body)
        return name, body

    def pick(self):
        roll = self.rng.random() * 100
        if roll < self.args.hot_pct:
            return "hot"
        if roll < self.args.hot_pct + self.args.delta_pct:
            return "delta"
        return "full"

    def count(self, error, fn):
        """FN applied to this interval's figures and the run's; ERROR, if
        any, kept as the first of each."""
        for box in (self.interval, self.total):
            fn(box)
            if error and not box.first_error:
                box.first_error = error

    async def worker(self, queue):
        loop = asyncio.get_running_loop()
        conn = None  # (socket, Reader, requests sent on it)
        try:
            while True:
                job = await queue.get()
                if job is None:
                    return
                kind, due = job
                lag = (time.monotonic() - due) * 1000.0
                lock = None
                if kind == "hot":
                    i = self.rng.randrange(len(self.hot))
                    path, body = f"/hot/h{i:04d}.txt", self.hot[i]
                elif kind == "delta":
                    i = self.rng.randrange(len(self.delta))
                    # One request at a time per file: the edit and the body
                    # it must bring back go together.
                    lock = self.delta_locks[i]
                    await lock.acquire()
                    body = self.edit_delta(i)
                    path = f"/delta/d{i:04d}.txt"
                else:
                    name, body = self.new_full()
                    path = f"/full/{name}"
                req = (f"GET {self.origin}{path} HTTP/1.1\r\nHost: {self.host}\r\n"
                       f"User-Agent: rproxy-soak-mixed\r\n\r\n").encode()
                started = time.perf_counter()
                result = None
                try:
                    for attempt in (1, 2):
                        fresh, head_seen = conn is None, False
                        if fresh:
                            sock = await connect(loop, self.args.port)
                            conn = [sock, Reader(loop, sock)]
                        try:
                            await loop.sock_sendall(conn[0], req)
                            status, headers = parse_head(
                                await asyncio.wait_for(conn[1].until(b"\r\n\r\n"), self.args.timeout))
                            head_seen = True
                            got = await asyncio.wait_for(conn[1].body(headers), self.args.timeout)
                            result = (status, headers, got)
                            if headers.get("connection", "").lower() == "close":
                                conn[0].close()
                                conn = None
                            break
                        except ConnectionError:
                            conn[0].close()
                            conn = None
                            # A reused keep-alive connection the proxy closed
                            # while it was idle, before any byte of an
                            # answer: ask again once on a new one (as user
                            # agents do). Anything else is a failure.
                            if fresh or head_seen or attempt == 2:
                                raise
                            self.count("", lambda b: setattr(b, "reconnects", b.reconnects + 1))
                except (OSError, asyncio.TimeoutError, ValueError) as e:
                    if conn is not None:
                        conn[0].close()
                        conn = None
                    err = f"{kind} {path}: {type(e).__name__}: {e}"

                    def failed(b, kind=kind):
                        b.sent[kind] += 1
                        b.failed += 1
                        b.lag_ms.append(lag)
                    self.count(err, failed)
                finally:
                    if lock is not None:
                        lock.release()
                    if kind == "full":
                        try:
                            os.unlink(os.path.join(self.root, "full", path.rsplit("/", 1)[1]))
                        except OSError:
                            pass
                if result is None:
                    continue
                status, headers, got = result
                ms = (time.perf_counter() - started) * 1000.0
                hit = "hit" in headers.get("cache-status", "").lower()
                err = ""
                if status != 200:
                    err = f"{kind} {path}: status {status}"
                elif got != body:
                    err = f"{kind} {path}: {len(got)} bytes, the file has {len(body)}"

                def record(b, kind=kind, status=status, got=got, hit=hit, ms=ms, lag=lag, ok=not err):
                    b.sent[kind] += 1
                    b.lag_ms.append(lag)
                    b.bytes += len(got)
                    if status >= 500:
                        b.five_xx += 1
                    if status != 200:
                        b.statuses[str(status)] = b.statuses.get(str(status), 0) + 1
                    elif not ok:
                        b.wrong += 1
                    if ok:
                        b.ok[kind] += 1
                        b.ms[kind].append(ms)
                        b.cache_hit[kind] += hit
                self.count(err, record)
        finally:
            if conn is not None:
                conn[0].close()

    async def dispatch(self, queue, t0, seconds):
        """Requests at fixed times, RATE a second, to whichever worker is
        free (a shared queue): a slow answer delays no slot but its own."""
        n = 0
        while True:
            due = t0 + n / self.args.rate
            if due >= t0 + seconds:
                break
            pause = due - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            queue.put_nowait((self.pick(), due))
            n += 1
        self.backlog_at_end = queue.qsize()
        for _ in range(self.args.conns):
            queue.put_nowait(None)


def mixed_stats(url):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no http_proxy from the env
    try:
        with opener.open(url.rstrip("/") + "/.rproxy/stats", timeout=5) as r:
            return json.loads(r.read())
    except (OSError, ValueError) as e:
        log(f"stats from {url}: {e}")
        return None


def mixed_proc(pid):
    f = status_fields(pid)
    # RSS split: anonymous (heap, stacks) and file-backed (mostly the
    # binary's code, paged in as paths first run: no leak).
    return {"rss_kib": f.get("VmRSS", 0), "anon_kib": f.get("RssAnon", 0), "file_kib": f.get("RssFile", 0),
            "threads": f.get("Threads", 0), "fds": mixed_fds(pid)}


async def mixed_main(args):
    loop = asyncio.get_running_loop()
    pids = parse_pids(args.pid)
    load = MixedLoad(args)
    load.make_files()
    load_s, idle_s = args.minutes * 60.0, args.idle * 60.0
    cache = {"max_bytes": 0, "budget": None, "over": 0, "polls": 0, "failed_polls": 0}

    def note_cache(c):
        if c is None:
            cache["failed_polls"] += 1
            return
        cache["budget"] = c.get("cache_budget")
        cache["max_bytes"] = max(cache["max_bytes"], c.get("cache_bytes", 0))
        cache["over"] += c.get("cache_bytes", 0) > c.get("cache_budget", 0)
        cache["polls"] += 1

    def sample(t, phase):
        return {"t": round(t, 1), "phase": phase,
                "procs": {name: mixed_proc(pid) for name, pid in pids.items()},
                "client": mixed_stats(args.client_stats), "accel": mixed_stats(args.accel_stats)}

    async def poll_cache(stop):
        """cache_bytes between the samples too, every CACHE_POLL seconds."""
        while not stop.is_set():
            note_cache(await loop.run_in_executor(None, mixed_stats, args.client_stats))
            try:
                await asyncio.wait_for(stop.wait(), args.cache_poll)
            except asyncio.TimeoutError:
                pass

    samples = [sample(0.0, "baseline")]
    note_cache(samples[0]["client"])
    samples[0]["gen"] = MixedInterval().json()
    log(f"baseline: {json.dumps(samples[0]['procs'])}")
    times = sorted({round(k * args.sample, 3) for k in range(1, int((load_s + idle_s) / args.sample) + 1)}
                   | {load_s, load_s + idle_s})
    t0 = time.monotonic()
    queue = asyncio.Queue()
    workers = [asyncio.ensure_future(load.worker(queue)) for _ in range(args.conns)]
    dispatcher = asyncio.ensure_future(load.dispatch(queue, t0, load_s))
    stop = asyncio.Event()
    poller = asyncio.ensure_future(poll_cache(stop))
    for t in times:
        pause = t0 + t - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)
        s = await loop.run_in_executor(None, sample, time.monotonic() - t0, "load" if t <= load_s else "idle")
        note_cache(s["client"])
        s["gen"] = load.interval.json()
        load.interval = MixedInterval()
        samples.append(s)
        g, procs = s["gen"], s["procs"]
        c, prev = s["client"] or {}, samples[-2]["client"] or {}
        d = {k: c.get(k, 0) - prev.get(k, 0) for k in ("requests", "hits", "misses", "deltas", "basis_same_url")}
        log(f"{t / 60:5.1f} min {s['phase']}: sent hot/delta/full {g['sent']['hot']}/{g['sent']['delta']}/"
            f"{g['sent']['full']}, 5xx {g['five_xx']}, wrong {g['wrong']}, failed {g['failed']}; client "
            f"hits {d['hits']} misses {d['misses']} deltas {d['deltas']} (own-URL basis {d['basis_same_url']}); "
            + ", ".join(f"{n} RSS {p['rss_kib'] / 1024:.1f} MiB fds {p['fds']} threads {p['threads']}"
                        for n, p in procs.items())
            + f"; cache {c.get('cache_bytes', 0) / 1048576:.1f} of {c.get('cache_budget', 0) / 1048576:.0f} MiB")
        if t == load_s:
            # The load is over: no new slot; the workers finish what they
            # hold and close their connections before the idle time counts.
            await dispatcher
            await asyncio.gather(*workers)
    stop.set()
    await poller
    json.dump({"samples": samples, "total": load.total.json(), "cache": cache,
               "backlog_at_end": load.backlog_at_end,
               "config": {"rate": args.rate, "conns": args.conns, "minutes": args.minutes,
                          "idle": args.idle, "sample": args.sample, "hot_files": args.hot_files,
                          "delta_files": args.delta_files, "mix": [args.hot_pct, args.delta_pct,
                                                                   100 - args.hot_pct - args.delta_pct]}},
              sys.stdout)


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
    h = sub.add_parser("h2stall")
    h.add_argument("--port", type=int, required=True)
    h.add_argument("--path", required=True)
    h.add_argument("--header", action="append")
    h.add_argument("--streams", type=int, default=1000)
    h.add_argument("--per-conn", type=int, default=100)
    h.add_argument("--settle", type=float, default=5.0)
    h.add_argument("--pid", action="append")
    h.add_argument("--bystander-port", type=int)
    h.add_argument("--bystander-path", required=True)
    h.add_argument("--bystander-header", action="append")
    h.add_argument("--bystanders", type=int, default=200)
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
    y.add_argument("--h2", action="store_true")
    m = sub.add_parser("mem")
    m.add_argument("--pid", action="append")
    x = sub.add_parser("mixed")
    x.add_argument("--port", type=int, required=True, help="the client proxy's")
    x.add_argument("--origin", required=True, help="nginx's URL, as the requests name it")
    x.add_argument("--root", required=True, help="nginx's root, where the files are made")
    x.add_argument("--client-stats", required=True)
    x.add_argument("--accel-stats", required=True)
    x.add_argument("--pid", action="append")
    x.add_argument("--rate", type=float, default=50.0)
    x.add_argument("--conns", type=int, default=8)
    x.add_argument("--minutes", type=float, default=60.0)
    x.add_argument("--idle", type=float, default=5.0)
    x.add_argument("--sample", type=float, default=60.0)
    x.add_argument("--cache-poll", type=float, default=5.0)
    x.add_argument("--hot-files", type=int, default=200)
    x.add_argument("--delta-files", type=int, default=20)
    x.add_argument("--hot-pct", type=float, default=80.0)
    x.add_argument("--delta-pct", type=float, default=15.0)
    x.add_argument("--timeout", type=float, default=30.0)
    x.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    try:
        if args.cmd == "stall":
            asyncio.run(stall_main(args))
        elif args.cmd == "h2stall":
            if args.bystander_port is None:
                args.bystander_port = args.port
            asyncio.run(h2stall_main(args))
        elif args.cmd == "burst":
            asyncio.run(burst_main(args))
        elif args.cmd == "bystander":
            bystander_main(args)
        elif args.cmd == "mixed":
            asyncio.run(mixed_main(args))
        else:
            json.dump(mem_all(parse_pids(args.pid)), sys.stdout)
    except (OSError, subprocess.CalledProcessError) as e:
        log(f"setup failure: {e}")
        sys.exit(2)


if __name__ == "__main__":
    main()
