#!/usr/bin/env python3
"""A slower network between firstword (or llama-server) and an rpc-server, on one machine.

Usage: scripts/rpc-link.py LISTEN_PORT TARGET_PORT [--delay-ms D] [--mbit M] [--stats FILE]

Listens on 127.0.0.1:LISTEN_PORT and forwards each connection to 127.0.0.1:TARGET_PORT, both
ways, each direction delayed by D milliseconds (one way: a round trip costs 2*D) and limited to
M megabits per second (0: no limit), as a link of that latency and bandwidth would. Bytes and
bursts (writes separated by a wait for the other side: about one per round trip) are counted
per direction; on SIGUSR1 they are written to FILE (JSON) and zeroed, so a caller can read what
one measured stretch sent. Standard library only.
"""
import argparse
import asyncio
import json
import signal
import time

COUNTS = {"to_server_bytes": 0, "to_client_bytes": 0, "to_server_bursts": 0, "to_client_bursts": 0}


async def pump(reader, writer, delay, rate, direction):
    """Copies reader to writer, each chunk delivered `delay` seconds after the link is free."""
    queue = asyncio.Queue()
    last_direction_data = 0.0

    async def deliver():
        while True:
            due, data = await queue.get()
            if data is None:
                writer.close()
                return
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    deliverer = asyncio.create_task(deliver())
    link_free = 0.0
    while True:
        data = await reader.read(1 << 16)
        now = time.monotonic()
        if not data:
            await queue.put((now, None))
            break
        COUNTS[f"to_{direction}_bytes"] += len(data)
        # A chunk after more than a millisecond of silence starts a new burst.
        if now - last_direction_data > 0.001:
            COUNTS[f"to_{direction}_bursts"] += 1
        last_direction_data = now
        start = max(now, link_free)
        link_free = start + (len(data) * 8 / rate if rate else 0.0)
        await queue.put((link_free + delay, data))
    await deliverer


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("listen", type=int)
    parser.add_argument("target", type=int)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--mbit", type=float, default=0.0)
    parser.add_argument("--stats", default=None)
    args = parser.parse_args()
    delay, rate = args.delay_ms / 1000.0, args.mbit * 1e6

    def dump():
        if args.stats:
            with open(args.stats, "w") as f:
                json.dump(COUNTS, f)
        for key in COUNTS:
            COUNTS[key] = 0

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump)

    async def handle(client_reader, client_writer):
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", args.target)
        for stream in (client_writer, server_writer):
            sock = stream.get_extra_info("socket")
            if sock is not None:
                import socket

                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(
            pump(client_reader, server_writer, delay, rate, "server"),
            pump(server_reader, client_writer, delay, rate, "client"),
        )

    server = await asyncio.start_server(handle, "127.0.0.1", args.listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
