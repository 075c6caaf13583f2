#!/usr/bin/env python3
"""Run every highwater benchmark in one go and print the tables of BENCHMARKS.md.

    scripts/bench.py                 # everything, about 10-15 minutes on 2 cores
    scripts/bench.py --quick         # a smaller stream and baseline prefix, for a smoke test
    scripts/bench.py --out FILE      # also write the Markdown there
    scripts/bench.py --report-only   # re-print the tables from the last run's results

Each table compares contenders measured in this same run, as ratios; absolute figures are
labelled with the machine they came from (printed at the top). Results land in
$CARGO_TARGET_DIR (or ./target): criterion's estimates under criterion/, the analysis bench's
JSON under highwater-bench/.

Needs: cargo, python3 (standard library only), lscpu (optional, for the machine label).
"""

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
CRITERION = TARGET / "criterion"

HOT_PATH_ROWS = [
    ("system", "system allocator"),
    ("highwater_passthrough", "highwater, no session (passthrough)"),
    ("highwater_recording", "highwater, recording"),
    ("stats_alloc", "stats_alloc"),
    ("tracking_allocator", "tracking-allocator (counting tracker)"),
    ("dhat", "dhat (heap mode)"),
]


def log(message):
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


REPORT_ONLY = False


def run(args, env=None, capture=True):
    """Runs a command from the repository root; returns its stdout (stderr goes through)."""
    if REPORT_ONLY:
        return ""
    log(" ".join(args))
    merged = dict(os.environ, **(env or {}))
    done = subprocess.run(
        args, cwd=ROOT, env=merged, text=True, stdout=subprocess.PIPE if capture else None
    )
    if done.returncode != 0:
        sys.exit(f"command failed ({done.returncode}): {' '.join(args)}")
    return done.stdout or ""


def machine():
    model, cores = platform.processor() or platform.machine(), os.cpu_count()
    try:
        lscpu = subprocess.run(["lscpu"], text=True, capture_output=True).stdout
        found = re.search(r"^Model name:\s*(.+)$", lscpu, re.M)
        if found:
            model = found.group(1).strip()
        hypervisor = re.search(r"^Hypervisor vendor:\s*(.+)$", lscpu, re.M)
        if hypervisor:
            model += f" ({hypervisor.group(1).strip()} guest)"
    except OSError:
        pass
    rustc = subprocess.run(["rustc", "-V"], text=True, capture_output=True).stdout.strip()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True, capture_output=True
    ).stdout.strip()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"Machine: {model}, {cores} cores, {platform.system()} {platform.release()}; "
        f"{rustc}; commit {commit}; {when}; load average at start {load:.2f}."
    )


def ns(value):
    if value >= 1e6:
        return f"{value / 1e6:,.1f} ms"
    if value >= 1e3:
        return f"{value / 1e3:,.2f} µs"
    return f"{value:,.1f} ns"


def seconds(value):
    if value >= 1:
        return f"{value:,.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:,.1f} ms"
    return f"{value * 1e6:,.0f} µs"


def size(value):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:,.1f} {unit}"
    return f"{value:,} B"


def ratio(value, base):
    if not base:
        return "–"
    r = value / base
    if r >= 100:
        return f"{r:,.0f}×"
    return f"{r:,.2f}×" if r >= 0.1 else f"1/{1 / r:,.0f}"


def per_iteration(directory):
    """Criterion's samples of one benchmark, as ns per iteration, sorted."""
    data = json.loads((directory / "new" / "sample.json").read_text())
    return sorted(t / i for t, i in zip(data["times"], data["iters"]))


def estimate(directory):
    """Criterion's mean estimate of one benchmark, in ns per iteration."""
    data = json.loads((directory / "new" / "estimates.json").read_text())
    return data["mean"]["point_estimate"]


def hot_path():
    results = TARGET / "highwater-bench" / "hot_path.json"
    stdout = TARGET / "highwater-bench" / "hot_path.stdout"
    if REPORT_ONLY:
        out = stdout.read_text() if stdout.exists() else ""
    else:
        out = run(
            ["cargo", "bench", "--bench", "hot_path", "--", "alloc_free_64B"],
            env={"HIGHWATER_BENCH_HOT_OUT": str(results)},
        )
        stdout.write_text(out)
    drops = dict(re.findall(r"^highwater_recording/(\d+): .*\(([\d.]+)% dropped\)", out, re.M))
    group = CRITERION / "alloc_free_64B"
    threads = sorted({int(p.name) for p in (group / "system").iterdir() if p.name.isdigit()})
    samples = {
        (name, t): per_iteration(group / name / str(t))
        for name, _ in HOT_PATH_ROWS
        for t in threads
        if (group / name / str(t) / "new" / "sample.json").exists()
    }

    def table(pick, what):
        lines = [
            "| allocator | "
            + " | ".join(
                f"{t} thread{'s' if t > 1 else ''}: {what}, ×system, ×stats_alloc" for t in threads
            )
            + " |",
            "|---|" + "---|" * len(threads),
        ]
        for name, label in HOT_PATH_ROWS:
            cells = []
            for t in threads:
                if (name, t) not in samples:
                    cells.append("–")
                    continue
                value = pick(samples[(name, t)])
                system = pick(samples[("system", t)]) if ("system", t) in samples else None
                stats = pick(samples[("stats_alloc", t)]) if ("stats_alloc", t) in samples else None
                cells.append(f"{ns(value)}, {ratio(value, system)}, {ratio(value, stats)}")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        return lines

    turns = json.loads(results.read_text())
    by_key = {(r["name"], r["threads"]): r for r in turns if "fastest_ns" in r}
    turn_drops = {r["threads"]: r for r in turns if r["name"] == "highwater_recording_drops"}
    any_row = next(iter(by_key.values()))
    lines = [
        f"**Interleaved batches** (the headline): {any_row['batches']} rounds; in each, every "
        "contender runs one batch of about 2 ms (the order rotating), so all see the same mix of "
        "quiet and busy moments on a shared machine. Time per 64-byte `alloc` + `dealloc` pair "
        "per thread, all threads running at once; fastest batch, then median batch; ratios are "
        "to the system allocator and to stats_alloc in the same column, fastest to fastest.",
        "",
        "| allocator | "
        + " | ".join(
            f"{t} thread{'s' if t > 1 else ''}: fastest (median) ns/pair, ×system, ×stats_alloc"
            for t in threads
        )
        + " |",
        "|---|" + "---|" * len(threads),
    ]
    for name, label in HOT_PATH_ROWS:
        cells = []
        for t in threads:
            row = by_key.get((name, t))
            if row is None:
                cells.append("–")
                continue
            system = by_key.get(("system", t), {}).get("fastest_ns")
            stats = by_key.get(("stats_alloc", t), {}).get("fastest_ns")
            cells.append(
                f"{ns(row['fastest_ns'])} ({ns(row['median_ns'])}), "
                f"{ratio(row['fastest_ns'], system)}, {ratio(row['fastest_ns'], stats)}"
            )
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if turn_drops:
        lines += [
            "",
            "Events highwater dropped in these batches: "
            + ", ".join(
                f"{t} thread{'s' if t > 1 else ''}: "
                f"{100 * r['dropped'] / max(1, r['recorded'] + r['dropped']):.1f}%"
                for t, r in sorted(turn_drops.items())
            )
            + " (a 2 ms burst fits in a thread's ring; the collector drains it between bursts).",
        ]
    lines += [
        "",
        "**Criterion** (`alloc_free_64B`): each contender for 2 s after a 0.5 s warm-up, one "
        "after another, so a sustained tight loop, and whatever else the machine was doing "
        "during those seconds lands on that contender alone. Median sample, then fastest sample.",
        "",
    ]
    lines += table(lambda v: v[len(v) // 2], "median ns/pair")
    lines += [""]
    lines += table(lambda v: v[0], "fastest ns/pair")
    if drops:
        lines += [
            "",
            "Events highwater dropped during criterion's sustained loops (its rings were full): "
            + ", ".join(
                f"{t} thread{'s' if int(t) > 1 else ''}: {p}%" for t, p in sorted(drops.items())
            )
            + ".",
        ]
    return "\n".join(lines)


def analysis(quick):
    path = TARGET / "highwater-bench" / "analysis.json"
    env = {"HIGHWATER_BENCH_OUT": str(path)}
    if quick:
        env.update(HIGHWATER_BENCH_EVENTS="1000000", HIGHWATER_BENCH_PREFIX="5000")
    run(["cargo", "bench", "--bench", "analysis"], env=env, capture=False)
    data = json.loads(path.read_text())
    stream = data["stream"]
    ours_prefix, ours_full, base = data["replay"]
    lines = [
        f"Stream: {stream['events']:,} events from seed {stream['seed']:#x} "
        f"({stream['threads']} threads, {stream['training_steps']:,} training steps, "
        f"at most {stream['most_live_blocks']:,} blocks live at once, "
        f"{stream['end_live_blocks']:,} at the end). The baseline runs on the first "
        f"{stream['prefix']:,} events.",
        "",
        "| analysis | events | time | events/s | × baseline (whole prefix) | × baseline (after its first steps) | heap held after replay | most heap held |",
        "|---|---|---|---|---|---|---|---|",
    ]
    steady = base.get("second_half_events_per_s")
    points = base.get("checkpoints") or []
    lines.append(
        f"| candle-graph `analyze_memory` + node metrics (baseline) | {base['events']:,} | "
        f"{seconds(base['seconds'])} | {base['events_per_s']:,.0f} | 1× | – | "
        f"{size(base['retained_heap_bytes'])} | {size(base['peak_heap_bytes'])} |"
    )
    if steady:
        lines.append(
            f"| the same baseline run, second half of its walk only | {base['events'] // 2:,} | – | "
            f"{steady:,.0f} | – | 1× | – | – |"
        )
    for row in (ours_prefix, ours_full):
        lines.append(
            f"| highwater `Timeline` (apply + finish) | {row['events']:,} | "
            f"{seconds(row['seconds'])} | {row['events_per_s']:,.0f} | "
            f"{ratio(row['events_per_s'], base['events_per_s'])} | "
            f"{ratio(row['events_per_s'], steady)} | "
            f"{size(row['retained_heap_bytes'])} | {size(row['peak_heap_bytes'])} |"
        )
    if len(points) > 2:
        first = points[1]
        lines += [
            "",
            f"Where the baseline's time goes: its first {first[0]:,} memory records (the model "
            f"loading and the first training step, where live memory grows and nearly every "
            f"allocation is a new peak, so the whole live set is copied and sorted each time) "
            f"took {seconds(first[1])} of its {seconds(base['seconds'])}. After that it runs at "
            f"the steady rate in the second row, still well below highwater's: it clones a "
            f"string-keyed category map into a timeline point for every event.",
        ]
    lines += [
        "",
        f"highwater's heap after replay is its live map and tables: "
        f"{size(ours_prefix['retained_heap_bytes'])} after {ours_prefix['events']:,} events "
        f"({ours_prefix['end_live_blocks']:,} blocks live) and "
        f"{size(ours_full['retained_heap_bytes'])} after {ours_full['events']:,} events "
        f"({ours_full['end_live_blocks']:,} blocks live): it follows the live set, not the "
        f"event count. The baseline keeps a timeline point per memory event "
        f"({base['timeline_points']:,} points).",
    ]
    out_prefix, out_full, out_base = data["output"]
    replay = "\n".join(lines)
    lines = [
        f"The profiles of the replays above, and the baseline's document for its "
        f"{out_base['events']:,}-event prefix.",
        "",
        "| document | events | JSON size | × baseline size | write | × baseline write | read | × baseline read | HTML report | Chrome trace |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| candle-graph memory profile, pretty JSON (baseline) | {out_base['events']:,} | "
        f"{size(out_base['json_bytes'])} | 1× | {seconds(out_base['write_s'])} | 1× | "
        f"{seconds(out_base['load_s'])} | 1× | – | – |",
    ]
    for row in (out_prefix, out_full):
        # Ratios only between documents of the same events.
        same = row["events"] == out_base["events"]
        versus = lambda key: ratio(row[key], out_base[key]) if same else "–"  # noqa: E731
        lines.append(
            f"| highwater `Profile` | {row['events']:,} | {size(row['json_bytes'])} | "
            f"{versus('json_bytes')} | {seconds(row['write_s'])} | "
            f"{versus('write_s')} | {seconds(row['load_s'])} | "
            f"{versus('load_s')} | "
            f"{size(row['html_bytes'])} in {seconds(row['html_s'])} | "
            f"{size(row['chrome_bytes'])} in {seconds(row['chrome_s'])} |"
        )
    lines += [
        "",
        "Write is `Profile::write` (pretty JSON, temporary file, fsync, rename); read is "
        "`Profile::load`; HTML and Chrome are `export::html::render` and "
        "`export::chrome::render` (in memory). Medians of 5; the baseline once.",
    ]
    return replay, "\n".join(lines)


def candle_workload():
    example = ROOT / "examples" / "train_mlp.rs"
    manifest = (ROOT / "Cargo.toml").read_text()
    if not example.exists() or not re.search(r"^candle\s*=", manifest, re.M):
        return (
            "Not measured yet: `examples/train_mlp.rs` (with a `candle` feature) is not in this "
            "tree. When it is, this script runs it with and without `HIGHWATER=off`."
        )
    if REPORT_ONLY:
        return "Skipped (`--report-only`): run the script to measure the example."
    timings = {}
    outputs = {}
    try:
        run(["cargo", "build", "--release", "--features", "candle", "--example", "train_mlp"])
        # The built binary, not `cargo run`, so cargo's own start-up is not in the times.
        cmd = [str(TARGET / "release" / "examples" / "train_mlp")]
        for label, env in (("unprofiled (HIGHWATER=off)", {"HIGHWATER": "off"}), ("highwater", {})):
            began = time.perf_counter()
            outputs[label] = run(cmd, env=env)
            timings[label] = time.perf_counter() - began
    except SystemExit as failure:
        return f"Not measured: the example failed ({failure})."
    base = timings["unprofiled (HIGHWATER=off)"]
    lines = [
        "Whole-run wall time of the example (its own step-time output follows each row).",
        "",
        "| run | wall time | × unprofiled |",
        "|---|---|---|",
    ]
    for label, value in timings.items():
        lines.append(f"| {label} | {seconds(value)} | {ratio(value, base)} |")
    for label, text in outputs.items():
        tail = "\n".join(text.strip().splitlines()[-5:])
        lines += ["", f"`{label}` output (last lines):", "", "```text", tail, "```"]
    lines += ["", "dhat column: not wired yet (the example needs a dhat mode)."]
    return "\n".join(lines)


def pools():
    manifest = (ROOT / "Cargo.toml").read_text()
    if not (ROOT / "benches" / "pools.rs").exists() or not re.search(
        r'name\s*=\s*"pools"', manifest
    ):
        return "Not measured yet: `benches/pools.rs` is not in this tree."
    if REPORT_ONLY:
        return "Skipped (`--report-only`): run the script to measure the pools."
    started = time.time()
    out = run(["cargo", "bench", "--bench", "pools"])
    table = [line for line in out.splitlines() if line.startswith("|")]
    if table:
        return "\n".join(table)
    # No table printed: list the criterion estimates this run wrote, with ratios to the
    # original design's row of the same group (an id naming `vec`, `original` or `baseline`).
    rows = {}
    for path in CRITERION.glob("**/new/estimates.json"):
        if path.stat().st_mtime < started or "alloc_free_64B" in path.parts:
            continue
        bench = path.parent.parent
        rows[str(bench.relative_to(CRITERION))] = estimate(bench)
    lines = ["| benchmark | mean | × original design |", "|---|---|---|"]
    for name, value in sorted(rows.items()):
        group = name.split("/")[0]
        base = next(
            (
                v
                for n, v in rows.items()
                if n.split("/")[0] == group and re.search(r"vec|original|baseline", n)
                and n.split("/")[2:] == name.split("/")[2:]
            ),
            None,
        )
        lines.append(f"| {name} | {ns(value)} | {ratio(value, base)} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller stream, for a smoke test")
    parser.add_argument("--out", type=Path, help="also write the Markdown to this file")
    parser.add_argument(
        "--report-only", action="store_true", help="print the last run's tables, run nothing"
    )
    args = parser.parse_args()
    global REPORT_ONLY
    REPORT_ONLY = args.report_only
    (TARGET / "highwater-bench").mkdir(parents=True, exist_ok=True)

    header = machine()
    log(header)
    run(["cargo", "bench", "--no-run"], capture=False)
    hot = hot_path()
    workload = candle_workload()
    replay, output = analysis(args.quick)
    sections = [
        ("1. Hot path", hot),
        ("2. Real workload: candle MLP training", workload),
        ("3. Analysis: replaying a recorded stream", replay),
        ("4. Device pools", pools()),
        ("5. Output", output),
    ]
    text = "\n\n".join([header] + [f"## {title}\n\n{body}" for title, body in sections]) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
        log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
