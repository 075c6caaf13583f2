#!/usr/bin/env python3
"""What the `cuda` feature costs a CPU-only run: the candle example built without it and with
it, run alternately on the same machine, and the ratio of their step times.

    scripts/cuda_feature_cost.py [--runs 6] [--steps 200] [--json]

Both builds record (the default session); on a machine without a CUDA driver the `cuda` build
looks for the driver at session start, says so in the profile, and records nothing more. Prints
each run's median step time, then the ratio of the medians of medians (with / without).
Do not run it while other builds use the cores.
"""

import argparse
import json
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


def build(features, into):
    subprocess.run(
        ["cargo", "build", "--release", "--example", "train_mlp", "--features", features],
        cwd=ROOT,
        check=True,
    )
    shutil.copy(ROOT / "target/release/examples/train_mlp", into)


def median_step_ms(binary, steps, out):
    run = subprocess.run(
        [str(binary), "--steps", str(steps), "--out", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    found = re.search(r"median ([0-9.]+) ms", run.stdout)
    if not found:
        sys.exit(f"no step time in the output of {binary}:\n{run.stdout}")
    return float(found.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="end with the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = pathlib.Path(scratch)
        without, with_cuda = scratch / "train_mlp", scratch / "train_mlp_cuda"
        build("candle", without)
        build("candle,cuda", with_cuda)
        times = {"without": [], "with": []}
        for run in range(args.runs):
            order = [("without", without), ("with", with_cuda)]
            if run % 2:
                order.reverse()
            for name, binary in order:
                ms = median_step_ms(binary, args.steps, scratch / f"{name}.json")
                times[name].append(ms)
                print(f"run {run}: {name:7} cuda feature: median step {ms:.2f} ms", flush=True)
        a, b = statistics.median(times["without"]), statistics.median(times["with"])
        print(f"median of medians: without {a:.2f} ms, with {b:.2f} ms; ratio {b / a:.3f}")
        if args.json:
            figures = {"runs": args.runs, "steps": args.steps, "ratio": b / a, "ms": times}
            print(json.dumps(figures))


if __name__ == "__main__":
    main()
