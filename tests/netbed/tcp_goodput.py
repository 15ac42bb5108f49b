#!/usr/bin/env python3
"""TCP goodput between two netbed sites when iperf3 is not installed.

`serve` accepts one connection and prints the receiver-side goodput in bit/s (payload bytes
only, timed from the first byte to the last); `send` streams zeros for --seconds.
"""
import argparse
import socket
import sys
import time

kChunk = 1 << 20  # bytes per send/recv call


def serve(args: argparse.Namespace) -> int:
    with socket.create_server((args.bind, args.port), reuse_port=False) as srv:
        srv.settimeout(args.timeout)
        print("listening", flush=True)  # the test waits for this line before sending
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(args.timeout)
            buf = bytearray(kChunk)
            view = memoryview(buf)
            n = conn.recv_into(view)
            first = time.monotonic()
            first_bytes = n  # arrived before `first`, so not counted
            total = 0
            last = first
            while n:
                total += n
                last = time.monotonic()
                n = conn.recv_into(view)
    secs = last - first
    if secs <= 0 or total <= first_bytes:
        print("error: nothing measurable received", file=sys.stderr)
        return 1
    print(f"{(total - first_bytes) * 8 / secs:.0f}")
    return 0


def send(args: argparse.Namespace) -> int:
    payload = bytes(kChunk)
    with socket.create_connection((args.to, args.port), timeout=args.timeout) as s:
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            s.sendall(payload)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    ps = sub.add_parser("serve")
    ps.add_argument("--bind", required=True)
    ps.add_argument("--port", type=int, default=5301)
    ps.add_argument("--timeout", type=float, default=15.0, help="seconds; watchdog on every wait")
    pc = sub.add_parser("send")
    pc.add_argument("--to", required=True)
    pc.add_argument("--port", type=int, default=5301)
    pc.add_argument("--seconds", type=float, default=2.0)
    pc.add_argument("--timeout", type=float, default=15.0)
    args = p.parse_args()
    return serve(args) if args.cmd == "serve" else send(args)


if __name__ == "__main__":
    sys.exit(main())
