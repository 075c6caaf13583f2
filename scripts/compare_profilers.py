#!/usr/bin/env python3
"""Compare highwater with heaptrack and valgrind's massif on real workloads, in one run.

    scripts/compare_profilers.py                  # every workload, full size
    scripts/compare_profilers.py --quick          # smaller inputs, for a smoke test
    scripts/compare_profilers.py --kinds json     # only some (syn, json, maps, rayon, tight1,
                                                  # tight2, realloc)
    scripts/compare_profilers.py --out FILE       # also write the Markdown there
    scripts/compare_profilers.py --report-only    # re-print the last run's tables
    scripts/compare_profilers.py --earlier OLD.json     # reuse OLD's massif rows (massif is slow)
    scripts/compare_profilers.py --earlier OLD.json --reuse massif,heaptrack:syn
    scripts/compare_profilers.py --skip massif:syn,heaptrack:syn   # leave rows out
    scripts/compare_profilers.py --baseline OLD/workload --baseline-label "main 28e6d4b"

For each workload of `examples/workload.rs` (syn parsing five crates' sources with all trees
alive at once; a ~25 MB JSON document through `serde_json::Value` and back; four threads
passing `HashMap<String, Vec<u64>>`s to be freed; rayon sorting 3 M strings on two threads and
folding them into maps; a tight alloc + free loop on one and on two threads; buffers grown one
element at a time) it runs the same release binary:

- unprofiled: `HIGHWATER=off` (highwater's hook passes every call straight through);
- highwater, lossless (`HIGHWATER_CAPTURE=lossless`, the default) and drop mode
  (`HIGHWATER_CAPTURE=drop`);
- heaptrack and `valgrind --tool=massif`, both on the `HIGHWATER=off` binary, so they see the
  program's allocations and nothing of highwater's.

The unprofiled and highwater runs are repeated (`--repeat`, default 3) in rotating order, so
each sees the same mix of quiet and busy moments on a shared machine; the median counts.
heaptrack and massif run once each (`--repeat-external` to change that). `--baseline` adds
another build of the workload binary (say, main's) in lossless mode to the same rotation, so a
change's before and after come from one run under the same load.

Work time is what the program measures around the workload itself (no process start, no
session start or finish, no profiler start-up or post-processing), printed on its last output
line. Resident memory is the child's maximum RSS from `wait4`.

Added CPU per event is what recording costs a program that keeps every core busy: (CPU of the
profiled run − CPU of the unprofiled run) / the events the program made (allocations, frees
and reallocs, as highwater's lossless run counts them). For highwater and the unprofiled run,
CPU is the process's CPU clock over the work (every thread, the collector's included; the
program prints it), so the fixed costs of starting and finishing a session stay out as the work
time keeps them out. heaptrack's interpreter is a process of its own, so its CPU is user +
system time of the whole run and its children (`wait4`) less the unprofiled run's: its start-up
is in it, its post-processing (`heaptrack_print`) is not. Peaks:

- highwater: `summary.peak_bytes`, requested bytes of blocks allocated while recording (the
  session starts before the workload reads or generates its input);
- heaptrack: the exact highest sum of requested bytes, replayed from its data file (the `+` and
  `-` records; `heaptrack_print` prints the same figure rounded); it includes a 72,704-byte
  block libstdc++ allocates at load time, which heaptrack's preload library brings in;
- massif (`--peak-inaccuracy=0.0`, so the peak snapshot is the true peak): the highest
  `mem_heap_B`, the requested bytes; its own per-block admin bytes and rounding are the
  separate `mem_heap_extra_B` and are not compared.

Needs: cargo, python3 (standard library only), heaptrack (with zstd or gzip data files),
valgrind, zstd. Results land in $CARGO_TARGET_DIR/highwater-bench/compare_profilers.json.
"""

import argparse
import datetime
import gzip
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
RESULTS = TARGET / "highwater-bench" / "compare_profilers.json"
BINARY = TARGET / "release" / "examples" / "workload"

# The five crates whose sources the syn workload parses (as many as the lock file has).
SYN_CRATES = ["syn", "serde_json", "clap_builder", "proptest", "regex-syntax"]
# A run may not take longer than this (massif on the full workloads takes minutes).
RUN_LIMIT_S = 3600
# The resident-memory target: 64 MiB plus this much per live allocation.
BYTES_PER_LIVE_BLOCK = 48

MODES = [
    ("unprofiled", {"HIGHWATER": "off"}),
    ("highwater lossless", {"HIGHWATER_CAPTURE": "lossless"}),
    ("highwater drop mode", {"HIGHWATER_CAPTURE": "drop"}),
]


def log(message):
    print(f"[compare {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def machine():
    model, cores = platform.processor() or platform.machine(), os.cpu_count()
    try:
        lscpu = subprocess.run(["lscpu"], text=True, capture_output=True).stdout
        found = re.search(r"^Model name:\s*(.+)$", lscpu, re.M)
        if found:
            model = found.group(1).strip()
    except OSError:
        pass
    rustc = subprocess.run(["rustc", "-V"], text=True, capture_output=True).stdout.strip()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True, capture_output=True
    ).stdout.strip()
    versions = []
    for tool in (["heaptrack", "--version"], ["valgrind", "--version"]):
        try:
            versions.append(
                subprocess.run(tool, text=True, capture_output=True).stdout.strip()
            )
        except OSError:
            versions.append(f"{tool[0]} missing")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()[0]
    return (
        f"Machine: {model}, {cores} cores, {platform.system()} {platform.release()}; {rustc}; "
        f"{', '.join(versions)}; commit {commit}; {when}; load average at start {load:.2f}."
    )


def workload_args(quick):
    """The command-line arguments of each workload."""
    metadata = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1"],
            cwd=ROOT,
            text=True,
            capture_output=True,
            check=True,
        ).stdout
    )
    roots = {}
    for package in metadata["packages"]:
        if package["name"] in SYN_CRATES and package["name"] not in roots:
            roots[package["name"]] = Path(package["manifest_path"]).parent / "src"
    strings = "300000" if quick else "3000000"
    pairs = "2000000" if quick else "20000000"
    rounds = "200" if quick else "2000"
    syn = ["--kind", "syn", "--copies", "1"]
    for name in SYN_CRATES:
        if name in roots and (not quick or name == "syn"):
            syn += ["--sources", str(roots[name])]
    return {
        "syn": (syn, f"syn parsing the sources of {', '.join(n for n in SYN_CRATES if n in roots and (not quick or n == 'syn'))}, all trees alive at once"),
        "json": (
            ["--kind", "json", "--json-mib", "4" if quick else "25"],
            f"a {4 if quick else 25} MiB JSON document parsed to `serde_json::Value`, walked, "
            "re-serialised, re-parsed",
        ),
        "maps": (
            ["--kind", "maps", "--threads", "4", "--rounds", "2" if quick else "10"],
            f"4 threads building `HashMap<String, Vec<u64>>`s ({2 if quick else 10} rounds of "
            "8 maps × 4,000 entries each) and passing them on to be freed",
        ),
        "rayon": (
            ["--kind", "rayon", "--threads", "2", "--strings", strings],
            f"rayon on 2 threads: {int(strings):,} strings made and `par_sort`ed, folded into "
            "per-task `HashMap`s of prefix counts and reduced; the calling thread frees them",
        ),
        "tight1": (
            ["--kind", "tight", "--threads", "1", "--pairs", pairs],
            f"one thread allocating 64–256 bytes and freeing them at once, {int(pairs):,} times",
        ),
        "tight2": (
            ["--kind", "tight", "--threads", "2", "--pairs", str(int(pairs) // 2)],
            f"two threads allocating 64–256 bytes and freeing them at once, "
            f"{int(pairs) // 2:,} times each",
        ),
        "realloc": (
            ["--kind", "realloc", "--rounds", rounds],
            f"{rounds} rounds of 64 `Vec<u64>`s and 64 `String`s grown one element at a time "
            "to up to 4,096, one in eight kept",
        ),
    }


def run(command, env, cwd):
    """Runs one command; returns (its last JSON output line, max RSS in bytes, wall seconds,
    CPU seconds: user + system, all threads)."""
    merged = dict(os.environ, **env)
    # The runs choose their own mode; an outer setting would skew them.
    for key in ("HIGHWATER", "HIGHWATER_CAPTURE", "HIGHWATER_RING_EVENTS"):
        if key not in env:
            merged.pop(key, None)
    merged["HIGHWATER_OUT"] = str(cwd / "profile.json")
    log(" ".join(f"{k}={v}" for k, v in env.items()) + " " + " ".join(command))
    began = time.perf_counter()
    with open(cwd / "stdout", "w") as out, open(cwd / "stderr", "w") as err:
        child = subprocess.Popen(command, cwd=cwd, env=merged, stdout=out, stderr=err)
        deadline = began + RUN_LIMIT_S
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                child.kill()
                os.wait4(child.pid, 0)
                sys.exit(f"timed out after {RUN_LIMIT_S} s: {' '.join(command)}")
            time.sleep(0.02)
    wall = time.perf_counter() - began
    code = os.waitstatus_to_exitcode(status)
    child.returncode = code
    if code != 0:
        sys.exit(
            f"failed ({code}): {' '.join(command)}\n{(cwd / 'stderr').read_text()[-3000:]}"
        )
    lines = [l for l in (cwd / "stdout").read_text().splitlines() if l.startswith("{")]
    if not lines:
        sys.exit(f"no result line from: {' '.join(command)}")
    return json.loads(lines[-1]), usage.ru_maxrss * 1024, wall, usage.ru_utime + usage.ru_stime


def heaptrack_peak(path):
    """The highest sum of live requested bytes in a heaptrack data file, the most blocks live
    at once and the allocation (`+`) and free (`-`) records it was replayed from (heaptrack
    writes a `realloc` as a free and an allocation)."""
    if path.suffix == ".zst":
        stream = subprocess.Popen(["zstd", "-dc", str(path)], stdout=subprocess.PIPE, text=True)
        lines = stream.stdout
    else:
        stream = None
        lines = gzip.open(path, "rt")
    sizes, live, peak, blocks, most_blocks, events = [], 0, 0, 0, 0, 0
    for line in lines:
        kind = line[:1]
        if kind == "+":
            live += sizes[int(line[2:], 16)]
            blocks += 1
            events += 1
            peak = max(peak, live)
            most_blocks = max(most_blocks, blocks)
        elif kind == "-":
            live -= sizes[int(line[2:], 16)]
            blocks -= 1
            events += 1
        elif kind == "a":
            sizes.append(int(line.split()[1], 16))
    if stream:
        stream.wait()
    return peak, most_blocks, events


def massif_peak(path):
    """The highest `mem_heap_B` of a massif output file."""
    return max(int(v) for v in re.findall(r"^mem_heap_B=(\d+)$", path.read_text(), re.M))


def heaptrack_run(binary, args, scratch):
    cwd = Path(tempfile.mkdtemp(dir=scratch))
    result, rss, wall, cpu = run(
        ["heaptrack", "-o", str(cwd / "heaptrack"), binary] + args, {"HIGHWATER": "off"}, cwd
    )
    peak, blocks, events = heaptrack_peak(next(cwd.glob("heaptrack.*")))
    row = {
        "result": result,
        "max_rss": rss,
        "wall_s": wall,
        "cpu_s": cpu,
        "peak": peak,
        "most_blocks": blocks,
        "records": events,
    }
    # heaptrack can die while the program runs on (the exit status is the program's): its data
    # file then stops early and its figures are not the run's.
    errors = (cwd / "stderr").read_text()
    if "terminate called" in errors or "bad_alloc" in errors:
        row["failed"] = " ".join(
            line.strip() for line in errors.splitlines() if "bad_alloc" in line
        ) or "heaptrack stopped early"
    return row


def massif_run(binary, args, scratch):
    cwd = Path(tempfile.mkdtemp(dir=scratch))
    out = cwd / "massif.out"
    result, rss, wall, cpu = run(
        [
            "valgrind",
            "--tool=massif",
            "--peak-inaccuracy=0.0",
            # Totals are all we read: a one-frame tree keeps the exact peak snapshots cheap.
            "--depth=1",
            f"--massif-out-file={out}",
            binary,
        ]
        + args,
        {"HIGHWATER": "off"},
        cwd,
    )
    return {
        "result": result,
        "max_rss": rss,
        "wall_s": wall,
        "cpu_s": cpu,
        "peak": massif_peak(out),
    }


def measure(kind, args, repeat, repeat_external, scratch, earlier, reuse, skip, modes):
    """Every run of one workload, by label. `modes` are (label, environment, binary). Rows
    named in `reuse` (`massif`, `heaptrack`, or `TOOL:KIND`) are taken from `earlier`, a
    previous run's results, instead of measured; rows named in `skip` are left out."""
    binary = str(BINARY)
    runs = {label: [] for label, _, _ in modes}
    for round_index in range(repeat):
        # Rotate the order so no mode always runs first (or right after another).
        order = modes[round_index % len(modes):] + modes[: round_index % len(modes)]
        for label, env, mode_binary in order:
            cwd = Path(tempfile.mkdtemp(dir=scratch))
            result, rss, wall, cpu = run([mode_binary] + args, env, cwd)
            runs[label].append({"result": result, "max_rss": rss, "wall_s": wall, "cpu_s": cpu})
    for tool, measure_once in (("heaptrack", heaptrack_run), ("massif", massif_run)):
        if tool in skip or f"{tool}:{kind}" in skip:
            continue
        if tool in reuse or f"{tool}:{kind}" in reuse:
            previous = earlier["workloads"].get(kind, {})
            if previous.get("args") != args:
                sys.exit(f"--earlier ran {kind} with other arguments: {previous.get('args')}")
            runs[tool] = [dict(row, reused=True) for row in previous["runs"][tool]]
        else:
            runs[tool] = [measure_once(binary, args, scratch) for _ in range(repeat_external)]
    return runs


def median(values):
    return statistics.median(values) if values else None


def size(value):
    sign = "−" if value < 0 else ""
    value = abs(value)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{sign}{value / scale:,.1f} {unit}"
    return f"{sign}{value:,} B"


def ratio(value, base):
    return f"{value / base:.2f}×" if value and base else "–"


def signed_pct(value, base):
    return f"{100 * (value - base) / base:+.3f} %" if base else "–"


def events_made(runs):
    """The events the program made: the median over highwater's lossless runs (recorded plus
    dropped, in case a run was told to drop)."""
    counts = [
        r["result"]["events"] + r["result"]["dropped_events"]
        for r in runs.get("highwater lossless", [])
    ]
    return median(counts)


def added_cpu_ns(runs, label, events):
    """(median CPU of `label`'s runs − median CPU unprofiled) / events, in ns: CPU over the
    work where the program reports it, over the whole run for heaptrack (see the module docs);
    None without the figures."""
    rows, base = runs.get(label), runs.get("unprofiled")
    if not rows or not base or not events:
        return None
    if label == "heaptrack":
        def cpu(row):
            return row.get("cpu_s")
    else:
        def cpu(row):
            return row["result"].get("work_cpu_s")
    if any(cpu(r) is None for r in rows + base):
        return None
    return 1e9 * (median([cpu(r) for r in rows]) - median([cpu(r) for r in base])) / events


def summary(data):
    """One row per workload: work time and added CPU per event, for each profiler."""
    labels = ["highwater lossless", "highwater drop mode", "heaptrack"]
    lines = [
        "| workload | events | "
        + " | ".join(f"{label}: × unprofiled, added CPU / event" for label in labels)
        + " |",
        "|---|---|" + "---|" * len(labels),
    ]
    for kind, entry in data["workloads"].items():
        runs = entry["runs"]
        if any(r.get("failed") for r in runs.get("heaptrack", [])):
            runs = dict(runs, heaptrack=[])
        events = events_made(runs)
        base = median([r["result"]["work_s"] for r in runs.get("unprofiled", [])])
        cells = []
        for label in labels:
            rows = runs.get(label)
            if not rows:
                cells.append("–")
                continue
            work = median([r["result"]["work_s"] for r in rows])
            cpu = added_cpu_ns(runs, label, events)
            cells.append(f"{ratio(work, base)}, {f'{cpu:.0f} ns' if cpu is not None else '–'}")
        lines.append(f"| {kind} | {events:,.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(data):
    lines = []
    for kind, entry in data["workloads"].items():
        runs = dict(entry["runs"])
        work = {
            label: median([r["result"]["work_s"] for r in rows])
            for label, rows in runs.items()
            if rows
        }
        rss = {label: median([r["max_rss"] for r in rows]) for label, rows in runs.items() if rows}
        # Earlier results files have no CPU times.
        cpu = {
            label: median([r["cpu_s"] for r in rows])
            for label, rows in runs.items()
            if rows and all("cpu_s" in r for r in rows)
        }
        base = work.get("unprofiled")
        failed = [r["failed"] for r in runs.get("heaptrack", []) if r.get("failed")]
        if failed:
            # A heaptrack that lost its data is no baseline: no ratio, no peak.
            runs["heaptrack"] = []
            work.pop("heaptrack", None)
        heaptrack = work.get("heaptrack")
        made = events_made(runs)
        massif = median([r["peak"] for r in runs.get("massif", [])])
        heap_peak = median([r["peak"] for r in runs.get("heaptrack", [])])
        most_blocks = median([r["most_blocks"] for r in runs.get("heaptrack", [])])
        lines += [
            f"**{kind}**: {entry['description']}.",
            "",
            "| run | work time | × unprofiled | × heaptrack | process CPU, × unprofiled | "
            "added CPU / event | peak | peak vs massif | events dropped | max RSS | "
            "added RSS (vs unprofiled) |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for label, rows in runs.items():
            if not rows:
                continue
            results = [r["result"] for r in rows]
            if label in ("heaptrack", "massif"):
                peak = median([r["peak"] for r in rows])
                dropped = "0 (does not drop)"
            elif label == "unprofiled":
                peak, dropped = None, "–"
            else:
                peak = median([r["peak_bytes"] for r in results])
                drops = [r["dropped_events"] for r in results]
                events = [r["events"] + r["dropped_events"] for r in results]
                dropped = ", ".join(
                    f"{d:,} ({100 * d / max(1, e):.1f} %)" for d, e in zip(drops, events)
                )
            added = (
                size(rss[label] - rss["unprofiled"])
                if label.startswith("highwater") and "unprofiled" in rss
                else "–"
            )
            cpu_cell = (
                f"{cpu[label]:.2f} s, {ratio(cpu[label], cpu.get('unprofiled'))}"
                if label in cpu
                else "–"
            )
            added_cpu = added_cpu_ns(runs, label, made) if label != "unprofiled" else None
            lines.append(
                f"| {label} | {work[label]:.3f} s | {ratio(work[label], base)} | "
                f"{ratio(work[label], heaptrack)} | {cpu_cell} | "
                f"{f'{added_cpu:.0f} ns' if added_cpu is not None else '–'} | "
                f"{size(peak) if peak else '–'} | "
                f"{signed_pct(peak, massif) if peak and massif else '–'} | {dropped} | "
                f"{size(rss[label])} | {added} |"
            )
        if failed:
            lines += [
                "",
                f"heaptrack failed on this workload ({failed[0]}; the program itself ran to "
                "the end): its data file stops early, so it has no row and no ratio.",
            ]
        if most_blocks:
            budget = (64 << 20) + BYTES_PER_LIVE_BLOCK * most_blocks
            lines += [
                "",
                f"Most blocks live at once (from heaptrack's records): {most_blocks:,}; the "
                f"resident-memory target for recording is 64 MiB + {BYTES_PER_LIVE_BLOCK} B "
                f"per live block = {size(budget)}.",
            ]
        if heap_peak and massif:
            lines += [
                f"heaptrack's peak is {heap_peak - massif:+,} B from massif's "
                f"(libstdc++'s 72,704-byte load-time block, brought in by heaptrack's preload "
                f"library, is in heaptrack's figure).",
            ]
        for tool in ("heaptrack", "massif"):
            if any(row.get("reused") for row in entry["runs"].get(tool, [])):
                lines.append(
                    f"{tool}'s figures are taken from an earlier run (`--earlier`, "
                    f"{data.get('earlier')}): it runs the `HIGHWATER=off` binary, so its peak does "
                    "not depend on highwater's recording; its time was measured under that "
                    "run's load."
                )
        lines.append("")
    return "\n".join([data["machine"], "", summary(data), ""] + lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller inputs, for a smoke test")
    parser.add_argument(
        "--kinds",
        default="syn,json,maps,rayon,tight1,tight2,realloc",
        help="workloads, comma-separated",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs of each highwater mode")
    parser.add_argument("--repeat-external", type=int, default=1, help="heaptrack/massif runs")
    parser.add_argument("--out", type=Path, help="also write the Markdown to this file")
    parser.add_argument("--report-only", action="store_true", help="re-print the last run")
    parser.add_argument("--earlier", type=Path, help="an earlier run's results file")
    parser.add_argument(
        "--reuse",
        default="massif",
        help="rows to take from --earlier instead of measuring: massif, heaptrack, TOOL:KIND",
    )
    parser.add_argument("--skip", default="", help="rows not to run: massif, heaptrack, TOOL:KIND")
    parser.add_argument(
        "--baseline", type=Path, help="another build of the workload binary, run lossless too"
    )
    parser.add_argument("--baseline-label", default="baseline", help="its name in the tables")
    args = parser.parse_args()
    if args.report_only:
        print(report(json.loads(RESULTS.read_text())))
        return
    for tool in ("heaptrack", "valgrind", "zstd"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is not installed (apt-get install heaptrack valgrind zstd)")
    header = machine()
    log(header)
    subprocess.run(
        ["cargo", "build", "--release", "--example", "workload"], cwd=ROOT, check=True
    )
    every = workload_args(args.quick)
    earlier = json.loads(args.earlier.read_text()) if args.earlier else None
    reuse = set(args.reuse.split(",")) if earlier else set()
    skip = set(filter(None, args.skip.split(",")))
    modes = [(label, env, str(BINARY)) for label, env in MODES]
    if args.baseline:
        modes.append(
            (
                f"highwater lossless, {args.baseline_label}",
                {"HIGHWATER_CAPTURE": "lossless"},
                str(args.baseline.resolve()),
            )
        )
    data = {
        "machine": header,
        "baseline": args.baseline_label if args.baseline else None,
        "quick": args.quick,
        "earlier": re.sub(r"^Machine: .*?; commit ", "commit ", earlier["machine"]).rstrip(".")
        if earlier
        else None,
        "workloads": {},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="highwater-compare-") as scratch:
        for kind in args.kinds.split(","):
            if kind not in every:
                sys.exit(f"unknown workload {kind!r}: choose from {', '.join(every)}")
            workload, description = every[kind]
            data["workloads"][kind] = {
                "args": workload,
                "description": description,
                "runs": measure(
                    kind,
                    workload,
                    args.repeat,
                    args.repeat_external,
                    scratch,
                    earlier,
                    reuse,
                    skip,
                    modes,
                ),
            }
            # After every workload, so a run stopped later keeps what it measured.
            RESULTS.write_text(json.dumps(data, indent=1))
    text = report(data)
    print(text)
    if args.out:
        args.out.write_text(text)
        log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
