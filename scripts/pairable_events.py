#!/usr/bin/env python3
"""How many of a run's events fall in short-lived alloc+free pairs, from its allocation log.

A producer that held back its last W events could hand a block allocated and freed within them
to the collector as one event. This reads an allocation log (`HIGHWATER_ALLOC_LOG=path`, format
in `crates/highwater-profile/src/alloc_log.rs`) and prints, for several windows W, the share of
events in pairs whose free comes at most W events after its alloc. The log is in the merged
order of all threads and has no thread ids, so the figure is exact for a single-threaded
program and an upper bound for others. A realloc is logged as a free and an alloc.

    HIGHWATER_ALLOC_LOG=/tmp/run.alloc target/release/examples/workload --kind json
    scripts/pairable_events.py /tmp/run.alloc
"""

import argparse
import struct
import sys

MAGIC = b"HWALLOC1"
DEVICE_NAME = 2
WINDOWS = [1, 2, 4, 8, 16, 64, 256, 1024, 4096, 65536]


def pair_distances(data):
    """Counts, by distance, the frees whose alloc is in the log; returns them and all events."""
    if data[:8] != MAGIC:
        raise ValueError("not a highwater allocation log (no HWALLOC1 magic)")
    live = {}
    counts = {}
    events = 0
    at = 8
    while at < len(data):
        tag = data[at]
        if tag == DEVICE_NAME:
            if at + 5 > len(data):
                raise ValueError(f"truncated device record at byte {at}")
            (_, length) = struct.unpack_from("<HH", data, at + 1)
            at += 5 + length
            continue
        if at + 27 > len(data):
            raise ValueError(f"truncated record at byte {at}")
        device, _, key, _ = struct.unpack_from("<HQQQ", data, at + 1)
        at += 27
        kind = tag & 0x0F
        if kind == 0:
            live[(device, key)] = events
            events += 1
        elif kind == 1:
            born = live.pop((device, key), None)
            if born is not None:
                counts[events - born] = counts.get(events - born, 0) + 1
            events += 1
    return counts, events


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="an allocation log written by HIGHWATER_ALLOC_LOG")
    args = parser.parse_args()
    try:
        with open(args.log, "rb") as file:
            data = file.read()
        counts, total = pair_distances(data)
    except (OSError, ValueError) as error:
        print(f"pairable_events: {args.log}: {error}", file=sys.stderr)
        return 1
    print(f"{total} events (allocs and frees; a realloc is one of each)")
    for window in WINDOWS:
        pairs = sum(n for distance, n in counts.items() if distance <= window)
        share = 2 * pairs / total * 100 if total else 0.0
        print(f"freed within {window:6} events of its alloc: {pairs:10} pairs, {share:5.1f} % of events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
