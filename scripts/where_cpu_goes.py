#!/usr/bin/env python3
"""Where the CPU that recording adds goes, stage by stage, in ns per event.

    scripts/where_cpu_goes.py                    # every workload of compare_profilers.py
    scripts/where_cpu_goes.py --kinds rayon      # only some
    scripts/where_cpu_goes.py --quick            # smaller inputs, for a smoke test

For each workload it runs the release `workload` binary under `perf record -e cpu-clock`,
unprofiled (`HIGHWATER=off`) and recorded (lossless), alternating, `--repeat` times each, and
sorts every sample by thread and by the function it landed in (its own code: a function
inlined into another counts as that other). A sample stands for a fixed slice of CPU time, so
a stage's CPU is its samples times that slice; per event it is divided by the events the
recorded run made. Stages:

- the program's threads: *hook*, highwater's code in the allocator (less what the
  unprofiled run spent in the same functions passing calls through); *kernel*, the kernel on
  their behalf beyond the unprofiled run's (waits for room, wake-ups, the rings' page faults);
  *program*, the program's own code beyond its unprofiled CPU (caches and cores it shares with
  the collector);
- the collector thread: *drain* (copying events out of the rings), *merge* (ordering the rings'
  events and decoding them), *live map* (finding and storing blocks by address), *growth* (the
  live map building a table anew as the live set outgrows it), *timeline* (counters, peaks,
  spans, the series), *kernel*, *other*.

Work done after the workload ends (symbolizing call sites, writing the profile and report) is
counted apart and left out of the per-event figures, as `compare_profilers.py` leaves it out
of the added CPU. Medians over the runs. Needs `perf` (cpu-clock works without hardware
counters). Results land in $CARGO_TARGET_DIR/highwater-bench/where_cpu_goes.json.
"""

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from compare_profilers import BINARY, ROOT, TARGET, log, machine, workload_args

RESULTS = TARGET / "highwater-bench" / "where_cpu_goes.json"
# CPU time each sample stands for: small enough for a few thousand samples per second of CPU.
PERIOD_NS = 250_000
COLLECTOR_COMM = "highwater-colle"
# The live map's rebuilds of its tables, by their out-of-line functions (their code is in the
# live map's file, like the lookups'): `make_room` and its closure, which build a table anew as
# the live set outgrows it, and `widen_packing`, which repacks every entry when the slab
# outgrows the bits its index has.
GROWTH = re.compile(r"LiveMap9make_room|LiveMap13widen_packing")
# Functions kept per run, the busiest first, to name where a stage's time goes.
TOP_FUNCTIONS = 40

# The collector's stages, first match wins: (stage, pattern on the source path of the sample's
# first frame outside the standard library).
COLLECTOR_STAGES = [
    ("finish", r"gimli|addr2line|rustc-demangle|/src/symbolize|/serde|flate2|miniz|/object-|"
               r"highwater-profile/src/(profile|fileio)|highwater-export"),
    ("live map", r"highwater-profile/src/analysis/live|/hashbrown-"),
    ("timeline", r"highwater-profile/src/analysis/"),
    ("drain", r"/src/capture/ring"),
    ("merge", r"/src/collector/|/src/capture/(raw|clock)"),
]
# Highwater's own code on a program's thread: the library's sources, and the allocator shims.
HOOK = re.compile(r"^" + re.escape(str(ROOT)) + r"/src/")
HOOK_FUNCTIONS = re.compile(r"__rust_alloc|__rust_dealloc|__rust_realloc|__rdl_")
STAGES = [
    ("program threads", ["hook", "kernel", "program"]),
    ("collector", ["drain", "merge", "live map", "growth", "timeline", "kernel", "other"]),
]


def perf_run(args, env, scratch):
    """One run under perf; returns (its result line, CPU in ns by (thread group, stage), the
    busiest functions)."""
    data = scratch / "perf.data"
    command = ["perf", "record", "-q", "-e", "cpu-clock", "-c", str(PERIOD_NS), "-o", str(data),
               "--", "env"] + [f"{k}={v}" for k, v in env.items()] + [str(BINARY)] + args
    log(" ".join(command[-len(args) - 1 - len(env):]))
    done = subprocess.run(command, cwd=scratch, text=True, capture_output=True)
    if done.returncode != 0:
        sys.exit(f"perf record failed ({done.returncode}): {done.stderr[-2000:]}")
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    if not lines:
        sys.exit(f"no result line from {' '.join(command)}")
    script = subprocess.run(
        ["perf", "script", "-i", str(data), "--no-demangle", "-F", "comm,period,ip,sym,symoff,dso"],
        text=True, capture_output=True, check=True,
    ).stdout
    data.unlink()
    samples = []
    for line in script.splitlines():
        found = re.match(r"\s*(.+?)\s+(\d+)\s+[0-9a-f]+\s+(\S*?)(?:\+0x([0-9a-f]+))?\s*\(([^()]*)\)\s*$", line)
        if found:
            comm, period, symbol, offset, dso = found.groups()
            samples.append((comm.strip(), int(period), symbol, int(offset or "0", 16), dso))
    frames = inline_frames({(s, o) for _, _, s, o, dso in samples if dso == str(BINARY)})
    cpu, functions = {}, {}
    for comm, period, symbol, offset, dso in samples:
        chain = frames.get((symbol, offset), [])
        key = classify(comm, symbol, chain, dso)
        if key:
            cpu[key] = cpu.get(key, 0) + period
            name = next((f"{plain(f)} [{short(path)}]" for f, path in chain
                         if not path.startswith("/rustc/")),
                        plain(chain[-1][0]) if chain else symbol or dso)
            function = (key[0], key[1], name)
            functions[function] = functions.get(function, 0) + period
    top = sorted(functions.items(), key=lambda item: -item[1])[:TOP_FUNCTIONS]
    return json.loads(lines[-1]), cpu, [[g, s, f, v] for (g, s, f), v in top]


def short(path):
    """A source path without the checkout's or the registry's prefix."""
    path = path.removeprefix(str(ROOT) + "/")
    found = re.search(r"/registry/src/[^/]+/(.*)$", path)
    return found.group(1) if found else path


def inline_frames(places):
    """For each (mangled symbol, offset) in the workload binary, its inline chain: (function,
    source path) pairs, innermost first (`addr2line -i`). The path comes from the line table
    and the name from the scope, which optimised code does not always keep together: a
    line of the live map's code may sit in the merge's scope."""
    addresses = {}
    for line in subprocess.run(["nm", str(BINARY)], text=True, capture_output=True, check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            addresses.setdefault(parts[2], int(parts[0], 16))
    wanted = sorted({(s, o) for s, o in places if s in addresses})
    if not wanted:
        return {}
    query = "\n".join(hex(addresses[s] + o) for s, o in wanted) + "\n"
    out = subprocess.run(["addr2line", "-a", "-f", "-i", "-C", "-e", str(BINARY)],
                         input=query, text=True, capture_output=True, check=True).stdout
    chains = []
    lines = out.splitlines()
    at = 0
    while at < len(lines):
        # `-a` starts each address's answer with the address; then (function, place) pairs.
        if re.fullmatch(r"0x[0-9a-f]+", lines[at]):
            chains.append([])
            at += 1
            continue
        place = lines[at + 1] if at + 1 < len(lines) else ""
        chains[-1].append((lines[at], place.rsplit(":", 1)[0]))
        at += 2
    return dict(zip(wanted, chains))


def classify(comm, symbol, chain, dso):
    """(thread group, stage) of one sample, from the inline chain of the code it landed in
    (its first frame outside the standard library decides); None for perf's own `env`."""
    if comm in ("env", "perf-exec"):
        return None
    kernel = "kernel" in dso
    own = next((path for _, path in chain if not path.startswith("/rustc/")), "")
    function = next((f for f, path in chain if not path.startswith("/rustc/")), "")
    if comm == COLLECTOR_COMM:
        if kernel:
            return ("collector", "kernel")
        if GROWTH.search(symbol):
            return ("collector", "growth")
        for stage, pattern in COLLECTOR_STAGES:
            if re.search(pattern, own):
                return ("collector", stage)
        # Standard-library code not inlined anywhere: the drain's copy into the staging queue.
        if re.search(r"VecDeque.*Extend", symbol):
            return ("collector", "drain")
        return ("collector", "other")
    if comm.startswith("highwater"):
        return ("highwater's other threads", "all")
    if kernel:
        return ("program threads", "kernel")
    if HOOK.search(own) or HOOK_FUNCTIONS.search(function):
        return ("program threads", "hook")
    if re.search(r"/crates/highwater-(profile|export)/|symbolize|gimli|addr2line", own):
        return ("program threads", "finish")
    return ("program threads", "program")


def measure(args, repeat, scratch):
    """Every run's result and CPU by stage, unprofiled and recorded."""
    runs = {"unprofiled": [], "recorded": []}
    for round_index in range(repeat):
        order = [("unprofiled", {"HIGHWATER": "off"}), ("recorded", {"HIGHWATER_CAPTURE": "lossless"})]
        if round_index % 2:
            order.reverse()
        for label, env in order:
            env = dict(env, HIGHWATER_OUT=str(scratch / "profile.json"))
            result, cpu, top = perf_run(args, env, scratch)
            runs[label].append({
                "result": result,
                "cpu": {f"{g}/{s}": v for (g, s), v in cpu.items()},
                "functions": top,
            })
    return runs


def breakdown(entry):
    """ns per event by stage (medians), the total and the events; None without samples."""
    runs = entry["runs"]
    recorded, unprofiled = runs["recorded"], runs["unprofiled"]
    events = statistics.median(r["result"]["events"] for r in recorded)
    if not events:
        return None

    def cpu(rows, key):
        return statistics.median(r["cpu"].get(key, 0) for r in rows)

    out = {}
    for group, stages in STAGES:
        for stage in stages:
            key = f"{group}/{stage}"
            value = cpu(recorded, key)
            if group == "program threads":
                value -= cpu(unprofiled, key)
            out[key] = value / events
    out["total"] = sum(out.values())
    out["events"] = events
    return out


def busiest(entry, group, count):
    """The `count` functions of `group` (a thread group) that took the most CPU per event in
    the recorded runs, medians over the runs (0 in a run that did not name it among its
    busiest), the stop's work left out: (stage, function, ns per event) tuples."""
    recorded = entry["runs"]["recorded"]
    events = statistics.median(r["result"]["events"] for r in recorded)
    names = {(s, f) for r in recorded for g, s, f, _ in r["functions"] if g == group}
    rows = []
    for stage, function in names:
        values = [
            next((v for g, s, f, v in r["functions"] if (g, s, f) == (group, stage, function)), 0)
            for r in recorded
        ]
        rows.append((stage, function, statistics.median(values) / events))
    rows = [row for row in rows if row[0] != "finish"]
    return sorted(rows, key=lambda row: -row[2])[:count]


def plain(name):
    """A function's name without its generic arguments (`extend<T, A, I>` is `extend`)."""
    while True:
        shorter = re.sub(r"(?<=[A-Za-z0-9_])<[^<>]*>", "", name)
        if shorter == name:
            return name
        name = shorter


def table(data):
    """The Markdown table, as lines: one row per workload, one column per stage; and each
    workload's breakdown, by name, for what else a report says of it."""
    columns = [f"{g}/{s}" for g, stages in STAGES for s in stages]
    heads = [f"{'program' if g == 'program threads' else 'collector'}: {s}"
             for g, stages in STAGES for s in stages]
    lines = [
        "| workload | events | " + " | ".join(heads) + " | total |",
        "|---|---|" + "---|" * (len(columns) + 1),
    ]
    rows = {}
    for kind, entry in data["workloads"].items():
        row = breakdown(entry)
        if not row:
            continue
        rows[kind] = row
        cells = [f"{row[c]:.0f}" for c in columns]
        lines.append(f"| {kind} | {row['events']:,.0f} | " + " | ".join(cells)
                     + f" | {row['total']:.0f} |")
    return lines, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller inputs, for a smoke test")
    parser.add_argument("--kinds", default="syn,json,maps,rayon,tight1,tight2,realloc")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each mode")
    parser.add_argument("--report-only", action="store_true", help="re-print the last run")
    args = parser.parse_args()
    if args.report_only:
        print("\n".join(table(json.loads(RESULTS.read_text()))[0]))
        return
    if not shutil.which("perf"):
        sys.exit("perf is not installed (apt-get install linux-perf)")
    header = machine()
    log(header)
    subprocess.run(["cargo", "build", "--release", "--example", "workload"], cwd=ROOT, check=True)
    every = workload_args(args.quick)
    data = {"machine": header, "quick": args.quick, "period_ns": PERIOD_NS, "workloads": {}}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="highwater-where-") as scratch:
        for kind in args.kinds.split(","):
            if kind not in every:
                sys.exit(f"unknown workload {kind!r}: choose from {', '.join(every)}")
            workload, _ = every[kind]
            data["workloads"][kind] = {
                "args": workload,
                "runs": measure(workload, args.repeat, Path(scratch)),
            }
            RESULTS.write_text(json.dumps(data, indent=1))
    print("\n".join(table(data)[0]))


if __name__ == "__main__":
    main()
