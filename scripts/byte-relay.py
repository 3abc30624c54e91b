#!/usr/bin/env python3
"""A byte-counting TCP relay, for the benchmarks' "link" (issue 20).

  byte-relay.py LISTEN_PORT TARGET_HOST TARGET_PORT CONTROL_PORT

Listens on 127.0.0.1:LISTEN_PORT and relays each connection to
TARGET_HOST:TARGET_PORT, byte for byte, both ways, counting the TCP payload
it relays: `up` is what the connecting side sent (the client proxy's
requests: heads, basis signatures, bodies), `down` what came back (response
heads and bodies, chunked framing included). TCP/IP headers are not counted.
A chunk is counted before it is written on, so once the far side has a byte,
the counters include it.

Any HTTP request to 127.0.0.1:CONTROL_PORT (any path) is answered with the
counters as one flat JSON object of integers:
  {"up":N,"down":N,"connections":N}
the shape scripts/lib-nginx.sh's lab_stats and lab_field read.

Python 3 standard library only; started by lab_start_relay in
scripts/lib-nginx.sh, which stops it.
"""

import asyncio
import json
import sys

CHUNK = 256 * 1024
counts = {"up": 0, "down": 0, "connections": 0}


async def pipe(reader, writer, direction):
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            counts[direction] += len(data)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def relay(client_reader, client_writer, host, port):
    counts["connections"] += 1
    try:
        target_reader, target_writer = await asyncio.open_connection(host, port)
    except OSError:
        client_writer.close()
        return
    await asyncio.gather(
        pipe(client_reader, target_writer, "up"),
        pipe(target_reader, client_writer, "down"),
    )
    for writer in (client_writer, target_writer):
        writer.close()


async def control(reader, writer):
    try:
        # The request head only; nobody sends a body here.
        await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        writer.close()
        return
    body = (json.dumps(counts, separators=(",", ":")) + "\n").encode()
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
        + body
    )
    try:
        await writer.drain()
    except ConnectionError:
        pass
    writer.close()


async def main():
    listen_port, host, port, control_port = (
        int(sys.argv[1]),
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    relay_server = await asyncio.start_server(
        lambda r, w: relay(r, w, host, port), "127.0.0.1", listen_port
    )
    control_server = await asyncio.start_server(control, "127.0.0.1", control_port)
    async with relay_server, control_server:
        await asyncio.gather(relay_server.serve_forever(), control_server.serve_forever())


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
