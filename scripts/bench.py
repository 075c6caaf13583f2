#!/usr/bin/env python3
"""Run highwater's benchmarks and write BENCHMARKS.md from what they measured.

    scripts/bench.py --out BENCHMARKS.md     # measure everything (about an hour on 2 cores)
    scripts/bench.py --quick                 # smaller inputs, for a smoke test
    scripts/bench.py --only hot,analysis     # measure some parts, keep the others' last results
    scripts/bench.py --report-only --out BENCHMARKS.md   # re-render from the last results

Every figure lands in one JSON file, $CARGO_TARGET_DIR/highwater-bench/bench.json (or
./target/...), and BENCHMARKS.md is rendered from it alone: the document is never edited by
hand. Parts:

- `hot`: the 64-byte alloc + free pair under each allocator (`cargo bench --bench hot_path`);
- `workloads`: real programs against heaptrack and massif (`scripts/compare_profilers.py`);
- `where`: where the added CPU goes, stage by stage, from `perf record` samples
  (`scripts/where_cpu_goes.py`);
- `candle`: the candle MLP's step time, recorded and not, in alternating blocks
  (`train_mlp --ab`);
- `analysis`: replaying a recorded stream, and the profile's size and write/read time
  (`cargo bench --bench analysis`);
- `pools`: the device pool manager (`cargo bench --bench pools`);
- `cuda`: what building with the `cuda` feature costs a CPU-only run
  (`scripts/cuda_feature_cost.py`);
- `layers`: what each layer of the live map earns, each turned off alone
  (`scripts/live_map_layers.py`).

Ratios compare contenders measured in the same run, alternating, so they share the machine's
load; absolute figures carry the machine line. Do not run it while anything else builds.
Needs: cargo, python3 (standard library only); heaptrack, valgrind and zstd for `workloads`;
perf and binutils (`nm`, `addr2line`) for `where`.
"""

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

# The workload figures are computed as compare_profilers.py computes them for its own report.
from compare_profilers import added_cpu_ns, events_made, size
from where_cpu_goes import STAGES, busiest, table

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
OUT_DIR = TARGET / "highwater-bench"
RESULTS = OUT_DIR / "bench.json"
CRITERION = TARGET / "criterion"
PARTS = ["hot", "workloads", "where", "candle", "analysis", "pools", "cuda", "layers"]

# A live-map layer stays while turning it off alone costs one workload this much work time.
LAYER_KEEP_RATIO = 1.03

HOT_PATH_ROWS = [
    ("system", "system allocator"),
    ("highwater_passthrough", "highwater, no session"),
    ("highwater_recording", "highwater, recording"),
    ("stats_alloc", "stats_alloc (counts only)"),
    ("tracking_allocator", "tracking-allocator (counts only)"),
    ("dhat", "dhat (heap profiler)"),
]

# The added CPU per event the workloads are held to (issue 36).
CPU_PER_EVENT_TARGET_NS = 60
# A lossless work ratio worth naming among the losses even where the CPU per event is on target.
SLOW_WORK_RATIO = 3.0


def log(message):
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(args, env=None, capture=True):
    """Runs a command from the repository root; returns its stdout."""
    log(" ".join(args))
    done = subprocess.run(
        args,
        cwd=ROOT,
        env=dict(os.environ, **(env or {})),
        text=True,
        stdout=subprocess.PIPE if capture else None,
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
    except OSError:
        pass
    rustc = subprocess.run(["rustc", "-V"], text=True, capture_output=True).stdout.strip()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True, capture_output=True
    ).stdout.strip()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return {
        "line": f"{model}, {cores} cores, {platform.system()} {platform.release()}; {rustc}",
        "commit": commit,
        "when": when,
        "load": os.getloadavg()[0],
    }


# ---------------------------------------------------------------------------------------------
# Measuring: each part returns plain data for bench.json.


def measure_hot():
    path = OUT_DIR / "hot_path.json"
    run(
        ["cargo", "bench", "--bench", "hot_path", "--", "alloc_free_64B"],
        env={"HIGHWATER_BENCH_HOT_OUT": str(path)},
    )
    return json.loads(path.read_text())


def measure_workloads(quick):
    command = [sys.executable, str(ROOT / "scripts" / "compare_profilers.py"), "--skip"]
    # massif runs the programs under valgrind: only where its exact peak is the check.
    command.append("massif:rayon,massif:tight1,massif:tight2,massif:realloc")
    if quick:
        command.append("--quick")
    run(command, capture=False)
    return json.loads((OUT_DIR / "compare_profilers.json").read_text())


def measure_where(quick):
    command = [sys.executable, str(ROOT / "scripts" / "where_cpu_goes.py")]
    if quick:
        command.append("--quick")
    run(command, capture=False)
    return json.loads((OUT_DIR / "where_cpu_goes.json").read_text())


def measure_layers(quick):
    command = [sys.executable, str(ROOT / "scripts" / "live_map_layers.py")]
    if quick:
        command += ["--rounds", "2"]
    run(command, capture=False)
    return json.loads((OUT_DIR / "live_map_layers.json").read_text())


def measure_candle(steps):
    run(["cargo", "build", "--release", "--features", "candle", "--example", "train_mlp"])
    binary = TARGET / "release" / "examples" / "train_mlp"
    out = OUT_DIR / "train_mlp_ab.json"
    text = run([str(binary), "--ab", "--steps", str(steps), "--out", str(out)])
    result = {"steps": steps}
    for what in ("wall", "cpu"):
        found = re.search(
            rf"^ab {what}\s*: recorded ([\d.]+) ms/step, unrecorded ([\d.]+) ms/step; ratio of "
            rf"means ([\d.]+), median pair ratio ([\d.]+) \((\d+) pairs\)",
            text,
            re.M,
        )
        if found:
            on, off, _, median, pairs = found.groups()
            result[what] = {
                "recorded_ms": float(on),
                "unrecorded_ms": float(off),
                "median_pair_ratio": float(median),
                "pairs": int(pairs),
            }
    return result


def measure_analysis(quick):
    path = OUT_DIR / "analysis.json"
    env = {"HIGHWATER_BENCH_OUT": str(path)}
    if quick:
        env.update(HIGHWATER_BENCH_EVENTS="1000000", HIGHWATER_BENCH_PREFIX="5000")
    run(["cargo", "bench", "--bench", "analysis"], env=env, capture=False)
    return json.loads(path.read_text())


def measure_pools():
    started = time.time()
    run(["cargo", "bench", "--bench", "pools"])
    rows = {}
    for path in CRITERION.glob("**/new/estimates.json"):
        if path.stat().st_mtime < started:
            continue
        bench = path.parent.parent
        estimate = json.loads(path.read_text())["mean"]["point_estimate"]
        rows[str(bench.relative_to(CRITERION))] = estimate
    return rows


def measure_cuda(quick):
    command = [sys.executable, str(ROOT / "scripts" / "cuda_feature_cost.py"), "--json"]
    if quick:
        command += ["--runs", "2", "--steps", "60"]
    lines = [line for line in run(command).splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------------------------
# Rendering: BENCHMARKS.md from bench.json alone.


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


def ratio(value, base):
    if not value or not base:
        return "–"
    return f"{value / base:,.2f}×"


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def render_hot(rows, losses):
    by_key = {(r["name"], r["threads"]): r for r in rows if "fastest_ns" in r}
    threads = sorted({t for _, t in by_key})
    lines = [
        "Time per 64-byte `alloc` + `dealloc` pair per thread, all threads at once, in "
        "interleaved batches of about 2 ms (every allocator runs one batch per round, the order "
        "rotating); fastest batch, median batch in brackets. Ratios are fastest to fastest.",
        "",
        "| allocator | "
        + " | ".join(f"{t} thread{'s' if t > 1 else ''}: ns/pair, ×system, ×stats_alloc" for t in threads)
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
    for t in threads:
        ours = by_key.get(("highwater_recording", t), {}).get("fastest_ns")
        stats = by_key.get(("stats_alloc", t), {}).get("fastest_ns")
        if ours and stats and ours > stats:
            losses.append(
                f"The recording pair costs {ours / stats:.1f}× a counting allocator's on "
                f"{t} thread{'s' if t > 1 else ''} ({ns(ours)} against {ns(stats)}): it reads the "
                "clock and writes a 32-byte event where stats_alloc adds to two counters."
            )
    return lines


def render_workloads(data, losses):
    labels = ["highwater lossless", "highwater drop mode", "heaptrack"]
    lines = [
        "Each program is one release binary (`examples/workload.rs`), run unprofiled "
        "(`HIGHWATER=off`), under highwater lossless (the default) and in drop mode, under "
        "heaptrack and under `valgrind --tool=massif`, alternating; medians of three. *Work* is "
        "the time the program measures around its work; *added CPU per event* is (CPU profiled "
        "− CPU unprofiled) / the allocations, frees and reallocs it made, which is what "
        "recording costs a program that keeps every core busy.",
        "",
        "| workload | events | lossless: work ×, added CPU/event | drop mode: work ×, added "
        "CPU/event | heaptrack: work ×, added CPU/event | peak: highwater − massif |",
        "|---|---|---|---|---|---|",
    ]
    for kind, entry in data["workloads"].items():
        runs = dict(entry["runs"])
        if any(r.get("failed") for r in runs.get("heaptrack", [])):
            runs["heaptrack"] = []
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
            if label == "highwater lossless" and work / base >= SLOW_WORK_RATIO and (
                cpu is None or cpu <= CPU_PER_EVENT_TARGET_NS
            ):
                losses.append(
                    f"{kind}: the work takes {ratio(work, base)} its unprofiled time: it allocates "
                    "faster than the collector replays, and lossless capture waits for the "
                    "collector rather than drop events (drop mode is in the table)."
                )
            if label == "highwater lossless" and cpu is not None and cpu > CPU_PER_EVENT_TARGET_NS:
                losses.append(
                    f"{kind}: recording adds {cpu:.0f} ns of CPU per event (target "
                    f"{CPU_PER_EVENT_TARGET_NS} ns); the work takes {ratio(work, base)} its "
                    "unprofiled time."
                )
        peak = median([r["result"]["peak_bytes"] for r in runs.get("highwater lossless", [])])
        massif = median([r["peak"] for r in runs.get("massif", [])])
        diff = f"{peak - massif:+,} B" if peak is not None and massif else "–"
        lines.append(f"| {kind} | {events:,.0f} | " + " | ".join(cells) + f" | {diff} |")
    lines += ["", "Programs:", ""]
    for kind, entry in data["workloads"].items():
        lines.append(f"- **{kind}**: {entry['description']}.")
    lines += [
        "",
        "massif counts requested bytes from the first allocation of the process; highwater from "
        "the session's start, so the few hundred bytes a program allocates before `main` are "
        "the usual difference. heaptrack's figure includes a block its own preload library "
        "brings in.",
    ]
    return lines


# The workload whose collector the "where" section names function by function (issue 36).
WHERE_DETAIL = "rayon"
STAGE_WORDS = {
    "program threads/hook": "the hook on the program's threads",
    "program threads/kernel": "the kernel on the program's threads",
    "program threads/program": "the program's own code running slower",
    "collector/drain": "the collector's drain",
    "collector/merge": "the collector's merge",
    "collector/live map": "the collector's live map",
    "collector/growth": "the live map's table growth",
    "collector/timeline": "the collector's timeline",
    "collector/kernel": "the kernel on the collector's thread",
    "collector/other": "the collector's other code",
}


def render_where(data):
    columns = [f"{g}/{s}" for g, stages in STAGES for s in stages]
    rows_table, rows = table(data)
    runs = len(next(iter(data["workloads"].values()))["runs"]["recorded"]) if data["workloads"] else 0
    lines = [
        "Each program run under `perf record -e cpu-clock` (a sample every "
        f"{data['period_ns'] / 1e3:.0f} µs of CPU), unprofiled and recorded lossless, "
        f"alternating, {runs} runs each; every sample is put in a stage by the thread it was "
        "taken on and the source file of the code it landed in (its first frame outside the "
        "standard library, inlined frames included, from `addr2line -i`). ns per event, medians. "
        "On the program's threads, *hook* is highwater's code in the allocator less what the "
        "unprofiled run spent passing calls through, *kernel* and *program* are what the "
        "recorded run spent there beyond the unprofiled run. On the collector's thread, *drain* "
        "copies events out of the rings, *merge* orders and decodes them, *live map* finds and "
        "stores blocks by address, *growth* is the live map building its table anew, twice as "
        "large, as the live set outgrows it, *timeline* keeps counters, peaks, spans and the "
        "series. The samples span the whole process but the stop (symbolizing, writing the "
        "profile), which is left out, so the totals run above the work-time figures of the "
        "table before.",
        "",
    ] + rows_table + [""]
    for kind, row in rows.items():
        stages = sorted(((row[c], c) for c in columns), reverse=True)
        named = ", ".join(f"{STAGE_WORDS[c]} {v:.0f} ns" for v, c in stages[:2])
        lines.append(f"- **{kind}**: {row['total']:.0f} ns an event; most in {named}.")
    detail = data["workloads"].get(WHERE_DETAIL)
    if detail and WHERE_DETAIL in rows:
        lines += [
            "",
            f"The functions that took the most of {WHERE_DETAIL}'s collector thread, ns per "
            "event (a function inlined into another is named where its code came from):",
            "",
            "| stage | function | ns/event |",
            "|---|---|---|",
        ]
        for stage, function, value in busiest(detail, "collector", 12):
            lines.append(f"| {stage} | `{function}` | {value:.1f} |")
    return lines


def render_memory(data, losses):
    lines = [
        "The most resident memory each run reached (`wait4`'s max RSS) less the unprofiled "
        "run's, and the most blocks the program held at once (from heaptrack's records).",
        "",
        "| workload | blocks live at most | highwater lossless | highwater drop mode | heaptrack |",
        "|---|---|---|---|---|",
    ]
    for kind, entry in data["workloads"].items():
        runs = entry["runs"]
        base = median([r["max_rss"] for r in runs.get("unprofiled", [])])
        blocks = median([r.get("most_blocks") for r in runs.get("heaptrack", [])])
        cells = []
        for label in ("highwater lossless", "highwater drop mode", "heaptrack"):
            if label == "heaptrack" and any(r.get("failed") for r in runs.get(label, [])):
                cells.append("– (failed)")
                continue
            rss = median([r["max_rss"] for r in runs.get(label, [])])
            cells.append(size(rss - base) if rss and base else "–")
        lines.append(f"| {kind} | {f'{blocks:,.0f}' if blocks else '–'} | " + " | ".join(cells) + " |")
    return lines


def render_candle(data, cuda, losses):
    lines = [
        "`examples/train_mlp.rs` trains a three-layer MLP with candle on the CPU. `--ab` "
        f"alternates blocks of steps with recording on and off in one process "
        f"({data['steps']} steps); the median of the pairs' ratios resists bursts of load.",
        "",
        "| clock | recorded ms/step | unrecorded ms/step | median pair ratio | pairs |",
        "|---|---|---|---|---|",
    ]
    for what in ("wall", "cpu"):
        row = data.get(what)
        if row:
            lines.append(
                f"| {what} | {row['recorded_ms']:.2f} | {row['unrecorded_ms']:.2f} | "
                f"{row['median_pair_ratio']:.3f} | {row['pairs']} |"
            )
    if cuda:
        lines += [
            "",
            f"Built with the `cuda` feature on a machine without a GPU, the same example's median "
            f"step takes {cuda['ratio']:.3f}× the time of the build without it ({cuda['runs']} "
            f"alternating runs of {cuda['steps']} steps each): the feature only looks for a "
            "driver when a session starts.",
        ]
    return lines


def render_analysis(data):
    stream = data["stream"]
    ours_prefix, ours_full, base = data["replay"]
    out_prefix, out_full, out_base = data["output"]
    lines = [
        f"A synthetic, seeded stream of {stream['events']:,} events ({stream['threads']} threads, "
        f"{stream['training_steps']:,} training steps, at most {stream['most_live_blocks']:,} "
        "blocks live at once) replayed through highwater's `Timeline`, against the candle "
        "profiler's `analyze_memory` (the seed this project grew from) on the first "
        f"{stream['prefix']:,} events.",
        "",
        "| analysis | events | events/s | × baseline | heap held after |",
        "|---|---|---|---|---|",
        f"| candle-graph `analyze_memory` (baseline) | {base['events']:,} | "
        f"{base['events_per_s']:,.0f} | 1× | {size(base['retained_heap_bytes'])} |",
    ]
    for row in (ours_prefix, ours_full):
        lines.append(
            f"| highwater `Timeline` | {row['events']:,} | {row['events_per_s']:,.0f} | "
            f"{ratio(row['events_per_s'], base['events_per_s'])} | "
            f"{size(row['retained_heap_bytes'])} |"
        )
    lines += [
        "",
        "| profile of | JSON | write | read | HTML report | Chrome trace |",
        "|---|---|---|---|---|---|",
        f"| the baseline's {out_base['events']:,} events (its own document) | "
        f"{size(out_base['json_bytes'])} | {seconds(out_base['write_s'])} | "
        f"{seconds(out_base['load_s'])} | – | – |",
    ]
    for row in (out_prefix, out_full):
        lines.append(
            f"| {row['events']:,} events | {size(row['json_bytes'])} | {seconds(row['write_s'])} | "
            f"{seconds(row['load_s'])} | {size(row['html_bytes'])} | {size(row['chrome_bytes'])} |"
        )
    return lines


def render_pools(rows):
    lines = ["| benchmark | mean |", "|---|---|"]
    for name, value in sorted(rows.items()):
        lines.append(f"| {name} | {ns(value)} |")
    return lines


def render_layers(data, losses):
    kinds = list(data["workloads"])
    offs = list(data["workloads"][kinds[0]]["medians"])

    def ratios(off, field):
        return [
            data["workloads"][kind]["medians"][off][field]
            / data["workloads"][kind]["medians"]["none"][field]
            for kind in kinds
        ]

    # Work time, and since issue 36 made the CPU recording adds the target, the collector's
    # CPU too: a layer that spares the collector's core earns even where the program does not
    # wait for it.
    earns = {
        off: max(ratios(off, "work_s") + ratios(off, "collector_cpu_s")) >= LAYER_KEEP_RATIO
        for off in offs
        if off != "none"
    }
    lines = [
        f"Measured at commit {data['commit']}, {data['when']}: medians of {data['rounds']} "
        "alternating rounds; each cell is the work time with the layer off against all on, "
        "then the collector's CPU time likewise. A layer stays while one workload's work or "
        f"collector CPU is at least {LAYER_KEEP_RATIO:.2f}× without it. Peaks seen, every run of every "
        "build: "
        + "; ".join(
            f"{kind} {', '.join(f'{p:,} B' for p in data['workloads'][kind]['peaks'])}"
            for kind in kinds
        )
        + ".",
        "",
        "| turned off | " + " | ".join(f"{k} work" for k in kinds) + " | "
        + " | ".join(f"{k} collector CPU" for k in kinds) + " | verdict |",
        "|---|" + "---|" * (2 * len(kinds) + 1),
    ]
    for off in offs:
        if off == "none":
            continue
        works, cpus = ratios(off, "work_s"), ratios(off, "collector_cpu_s")
        together = [o for o in offs if "+" in o and off in o.split("+") and earns[o]]
        if earns[off]:
            verdict = "stays"
        elif together:
            verdict = f"stays: earns with {together[0]}"
        else:
            verdict = "goes"
        if earns[off] or together:
            for kind, work in zip(kinds, works):
                if work < 2 - LAYER_KEEP_RATIO:
                    losses.append(
                        f"The live map's {off} layer, kept for what it earns elsewhere, costs "
                        f"{kind}: its work is {work:.3f}× without it."
                    )
        lines.append(
            f"| {off} | " + " | ".join(f"{w:.3f}×" for w in works) + " | "
            + " | ".join(f"{c:.3f}×" for c in cpus) + f" | {verdict} |"
        )
    return lines


def render(bundle):
    m = bundle["machine"]
    losses = []
    sections = []
    if "hot" in bundle:
        sections.append(("What one allocation costs", render_hot(bundle["hot"], losses)))
    if "workloads" in bundle:
        sections.append(("What recording costs real programs", render_workloads(bundle["workloads"], losses)))
        sections.append(("How much memory recording adds", render_memory(bundle["workloads"], losses)))
    if "where" in bundle:
        sections.append(("Where the added CPU goes", render_where(bundle["where"])))
    if "candle" in bundle:
        sections.append(("A training step", render_candle(bundle["candle"], bundle.get("cuda"), losses)))
    if "analysis" in bundle:
        sections.append(("Analysis and profile size", render_analysis(bundle["analysis"])))
    if "pools" in bundle:
        sections.append(("Device pools", render_pools(bundle["pools"])))
    if "layers" in bundle:
        sections.append(("What the live map's layers earn", render_layers(bundle["layers"], losses)))
    head = [
        "# highwater benchmarks",
        "",
        "<!-- Generated by scripts/bench.py from target/highwater-bench/bench.json; do not edit. -->",
        "",
        f"Machine: {m['line']}. Commit {m['commit']}, {m['when']}, load average {m['load']:.2f} "
        "at the start.",
        "",
        "**Method.** Every ratio compares contenders measured in the same run, alternating, so "
        "they share the machine's load; nothing else ran. Timings are medians unless a table "
        "says otherwise. Exactness is not measured here: the tests hold it (README, "
        "Guarantees).",
        "",
        "**Commands.** `scripts/bench.py --out BENCHMARKS.md` measures everything and writes "
        "this file; `--only hot,workloads,where,candle,analysis,pools,cuda,layers` measures some parts and "
        "keeps the others' last results; `scripts/compare_profilers.py` alone gives each "
        "program's full table; `cargo bench --bench NAME` runs one benchmark.",
    ]
    body = []
    for title, lines in sections:
        body += ["", f"## {title}", ""] + lines
    tail = ["", "## Where we lose", ""]
    tail += [f"- {line}" for line in losses] or ["- Nowhere in this run."]
    return "\n".join(head + body + tail) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller inputs, for a smoke test")
    parser.add_argument("--only", default=",".join(PARTS), help="parts to measure")
    parser.add_argument("--out", type=Path, help="write the Markdown there")
    parser.add_argument("--report-only", action="store_true", help="render the last results")
    parser.add_argument("--candle-steps", type=int, default=240)
    args = parser.parse_args()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    bundle = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if not args.report_only:
        bundle["machine"] = machine()
        log(f"machine: {bundle['machine']}")
        for part in args.only.split(","):
            if part not in PARTS:
                sys.exit(f"unknown part {part!r}: choose from {', '.join(PARTS)}")
            bundle[part] = {
                "hot": measure_hot,
                "workloads": lambda: measure_workloads(args.quick),
                "candle": lambda: measure_candle(60 if args.quick else args.candle_steps),
                "analysis": lambda: measure_analysis(args.quick),
                "pools": measure_pools,
                "cuda": lambda: measure_cuda(args.quick),
                "layers": lambda: measure_layers(args.quick),
                "where": lambda: measure_where(args.quick),
            }[part]()
            # After every part, so a run stopped later keeps what it measured.
            RESULTS.write_text(json.dumps(bundle, indent=1))
    if "machine" not in bundle:
        sys.exit(f"no results in {RESULTS}: run without --report-only first")
    text = render(bundle)
    if args.out:
        args.out.write_text(text)
        log(f"wrote {args.out} ({len(text.splitlines())} lines)")
    else:
        print(text)


if __name__ == "__main__":
    main()
