"""Checks a highwater torch export the way PyTorch's memory viewer reads it.

Usage: torch_snapshot_check.py SNAPSHOT.pickle

Loads the file with Python's own pickle and rebuilds, per device, what the viewer's "Active
Memory Timeline" draws: blocks freed in the trace without an allocation there, and blocks in
`segments` not allocated in the trace, are live before the trace starts; then every alloc and
free moves the total. Fails (exit 1) when an invariant the viewer relies on is broken, else
prints one JSON object per device: {"device", "peak", "start", "end", "categories", "events"}.
"""
import json
import pickle
import sys

ALLOCATING = {"alloc", "segment_alloc"}
KNOWN = {"alloc", "segment_alloc", "free_requested", "free_completed", "segment_free", "snapshot"}


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(1)


def check(snapshot):
    if set(snapshot) != {"segments", "device_traces"}:
        fail(f"top-level keys {sorted(snapshot)}")
    traces = snapshot["device_traces"]
    categories = set()
    for trace in traces:
        for event in trace:
            if "category" in event:
                categories.add(event["category"])
    # The viewer pushes 'unknown' through a misspelt name when categories exist without it.
    if categories and "unknown" not in categories:
        fail("no event has the category 'unknown': the viewer's annotate_snapshot throws")
    segments_by_device = {}
    for segment in snapshot["segments"]:
        if segment["device"] >= len(traces):
            fail(f"segment on device {segment['device']} of {len(traces)}")
        if len(segment["blocks"]) != 1 or segment["blocks"][0]["size"] != segment["total_size"]:
            fail(f"segment is not one whole block: {segment}")
        segments_by_device.setdefault(segment["device"], []).append(segment)
    results = []
    for device, trace in enumerate(traces):
        segments = sorted(segments_by_device.get(device, []), key=lambda s: s["address"])
        for a, b in zip(segments, segments[1:]):
            if a["address"] + a["total_size"] > b["address"]:
                fail(f"device {device}: segments overlap at {b['address']:#x}")
        for event in trace:
            if event["action"] not in KNOWN:
                fail(f"device {device}: unknown action {event['action']}")
            for key in ("addr", "size", "time_us", "stream", "frames"):
                if key not in event:
                    fail(f"device {device}: event without {key}: {event}")
            if event["size"] < 0 or event["addr"] < 0 or event["addr"] >= 2**53:
                fail(f"device {device}: size or address out of range: {event}")
        # Forward replay of the trace: which blocks are allocated in it and still live at its end.
        live = {}
        freed_unallocated = []
        for event in trace:
            if event["action"] == "alloc":
                if event["addr"] in live:
                    fail(f"device {device}: alloc over a live block at {event['addr']:#x}")
                live[event["addr"]] = event["size"]
            elif event["action"] == "free_completed":
                if event["addr"] in live:
                    del live[event["addr"]]
                else:
                    freed_unallocated.append(event["size"])
        at_end_from_trace = set(live)
        segment_blocks = {s["address"]: s["blocks"][0]["requested_size"] for s in segments}
        if not at_end_from_trace <= set(segment_blocks):
            fail(f"device {device}: a block live at the end of the trace is not in segments")
        before = [size for addr, size in segment_blocks.items() if addr not in at_end_from_trace]
        start = sum(freed_unallocated) + sum(before)
        total = peak = start
        for event in trace:
            if event["action"] == "alloc":
                total += event["size"]
            elif event["action"] == "free_completed":
                total -= event["size"]
            if total < 0:
                fail(f"device {device}: live bytes below zero")
            peak = max(peak, total)
        if total != sum(segment_blocks.values()):
            fail(f"device {device}: replay ends at {total}, segments hold {sum(segment_blocks.values())}")
        device_name = None
        for event in trace:
            if event["frames"]:
                device_name = event["frames"][0]["filename"]
                break
        if device_name is None and segments:
            device_name = segments[0]["blocks"][0]["frames"][0]["filename"]
        results.append({
            "device": device_name,
            "peak": peak,
            "start": start,
            "end": total,
            "categories": sorted({e["category"] for e in trace if "category" in e}),
            "events": len(trace),
        })
    return results


def main():
    with open(sys.argv[1], "rb") as file:
        snapshot = pickle.load(file)
    for result in check(snapshot):
        print(json.dumps(result))


if __name__ == "__main__":
    main()
