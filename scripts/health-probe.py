#!/usr/bin/env python3
"""Times GET /health every 50 ms for a while, from a process of its own (so a flood's client
threads do not delay the probe), and prints p50, p99 and max.

    scripts/health-probe.py PORT SECONDS
"""
import http.client
import sys
import time


def main():
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    latencies = []
    end = time.time() + seconds
    while time.time() < end:
        started = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/health")
        connection.getresponse().read()
        connection.close()
        latencies.append((time.perf_counter() - started) * 1000)
        time.sleep(0.05)
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99)]
    print(f"/health from its own process: {len(latencies)} probes, p50 {latencies[len(latencies) // 2]:.1f} ms, "
          f"p99 {p99:.1f} ms, max {latencies[-1]:.1f} ms")


if __name__ == "__main__":
    main()
