#!/usr/bin/env python3
"""What each layer of the live map earns: the real workloads with that layer turned off alone.

    scripts/live_map_layers.py              # 9 alternating rounds of json, syn and maps
    scripts/live_map_layers.py --rounds 3   # a quicker look

The layers are the live map's choices beyond a plain hash table of slab indexes: the index
hash that keeps neighbouring addresses in neighbouring buckets (`hash`), the address
fingerprints packed beside each slab index (`packing`), the choice of a likely-cached free slab
slot (`freeslots`), the memo of addresses known not to be indexed (`memo`), the table rebuild
that fetches its slab reads ahead (`rebuild`), asking for a block a few events before its free
(`prefetch`), applying a short-lived block's alloc and free without entering the map
(`pairroute`), and keeping small blocks in leaves by address region once the live set is
large (`regions`).
`scripts/live_map_layers.patch` gives each an `off-NAME` feature of
`highwater-profile`; this script applies it to a scratch checkout of HEAD, builds the
`workload` example once per layer (and once for the small layers together) and once with none
off, and runs them in rotating order, so every build sees the same load.

A layer stays while turning it off makes at least one workload's work time (issue 31) or its
collector's CPU time (issue 36 makes the CPU recording adds the target) 3 % higher; layers that
earn less alone are also tried together, since they can stand in for each other. Writes $CARGO_TARGET_DIR/highwater-bench/live_map_layers.json; `scripts/bench.py`
renders it. Do not run it while anything else builds.
"""

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
OUT_DIR = TARGET / "highwater-bench"
SCRATCH = OUT_DIR / "layers"
SCRATCH_TARGET = SCRATCH / "target"
PATCH = ROOT / "scripts" / "live_map_layers.patch"
LAYERS = ["hash", "packing", "freeslots", "memo", "rebuild", "prefetch", "pairroute", "regions",
          "memo+rebuild"]
# The crates whose sources the syn workload parses, as `scripts/compare_profilers.py` has them.
SYN_CRATES = ["syn", "serde_json", "clap_builder", "proptest", "regex-syntax"]


def log(message):
    print(f"[layers] {message}", file=sys.stderr, flush=True)


def check(args, cwd, env=None):
    done = subprocess.run(args, cwd=cwd, env=env, text=True, capture_output=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(map(str, args))} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout


def workloads():
    metadata = json.loads(check(["cargo", "metadata", "--format-version", "1"], ROOT))
    syn = ["--kind", "syn", "--copies", "1"]
    seen = set()
    for package in metadata["packages"]:
        if package["name"] in SYN_CRATES and package["name"] not in seen:
            seen.add(package["name"])
            syn += ["--sources", str(Path(package["manifest_path"]).parent / "src")]
    return {
        "json": ["--kind", "json", "--json-mib", "25"],
        "syn": syn,
        "maps": ["--kind", "maps", "--threads", "4", "--rounds", "10"],
    }


def build():
    """The workload binary with nothing off and with each layer off, by name."""
    source = SCRATCH / "src"
    if source.exists():
        subprocess.run(["git", "worktree", "remove", "--force", str(source)], cwd=ROOT)
        shutil.rmtree(source, ignore_errors=True)
    SCRATCH.mkdir(parents=True, exist_ok=True)
    check(["git", "worktree", "add", "--detach", str(source), "HEAD"], ROOT)
    try:
        check(["git", "apply", str(PATCH)], source)
        # A target directory of the scratch checkout's own: sharing the caller's would leave
        # the caller's `workload` binary (and the libraries it links) built from the patched
        # checkout with a layer off, which a later `cargo build` there can take as up to date
        # and other benchmarks would then measure. Its dependencies build once and are kept.
        env = dict(os.environ, CARGO_TARGET_DIR=str(SCRATCH_TARGET))
        binaries = {}
        for name in ["none"] + LAYERS:
            features = [] if name == "none" else [
                "--features",
                ",".join(f"highwater-profile/off-{layer}" for layer in name.split("+")),
            ]
            log(f"building with {name} off")
            check(["cargo", "build", "--release", "--example", "workload"] + features, source, env)
            binary = SCRATCH / f"workload-{name}"
            shutil.copy(SCRATCH_TARGET / "release" / "examples" / "workload", binary)
            binaries[name] = binary
        return binaries
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(source)], cwd=ROOT)


def measure(binaries, rounds):
    runs = []
    names = list(binaries)
    for kind, args in workloads().items():
        for r in range(rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                env = dict(os.environ, HIGHWATER_OUT=str(SCRATCH / "profile.json"))
                out = check([str(binaries[name])] + args, ROOT, env)
                result = json.loads(out.strip().splitlines()[-1])
                runs.append({"kind": kind, "off": name, **{
                    key: result.get(key)
                    for key in ("work_s", "collector_cpu_s", "events", "peak_bytes")
                }})
                log(f"{kind} {name}: work {result['work_s']:.3f} s")
    return runs


def summarise(runs):
    """Medians per workload and layer, and each as a ratio to nothing off."""
    table = {}
    for kind in dict.fromkeys(run["kind"] for run in runs):
        mine = [run for run in runs if run["kind"] == kind]
        peaks = sorted({run["peak_bytes"] for run in mine})
        medians = {}
        for off in dict.fromkeys(run["off"] for run in mine):
            these = [run for run in mine if run["off"] == off]
            medians[off] = {
                "work_s": statistics.median(run["work_s"] for run in these),
                "collector_cpu_s": statistics.median(run["collector_cpu_s"] or 0 for run in these),
                "runs": len(these),
            }
        table[kind] = {"medians": medians, "peaks": peaks}
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    commit = check(["git", "rev-parse", "--short", "HEAD"], ROOT).strip()
    binaries = build()
    runs = measure(binaries, args.rounds)
    result = {
        "commit": commit,
        "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "rounds": args.rounds,
        "workloads": summarise(runs),
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "live_map_layers.json").write_text(json.dumps(result, indent=1))
    log(f"wrote {OUT_DIR / 'live_map_layers.json'}")


if __name__ == "__main__":
    main()
