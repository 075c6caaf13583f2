#!/usr/bin/env python3
"""Checks that imports point down the layers docs/ARCHITECTURE.md draws, inside each crate and
inside the library's capture module: a module may name (`crate::x`, `super::x`) only modules
listed before it. Crates cannot import upward at all (cargo refuses cycles), so within-crate
order is what this guards. Test code (after `#[cfg(test)]`) is not checked.

    scripts/check_layers.py        # exit 1, naming each upward import, if there is one
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Bottom first. A module may import only from modules earlier in its list.
LAYERS = {
    # The library a training binary links.
    ("src", "crate::"): [
        "sys",
        "fork_lock",
        "capture",
        "error",
        "rank",
        "symbolize",
        "checkpoint",
        "outputs",
        "device",
        "signal",
        "config",
        "ops",
        "cuda",
        "measure",
        "collector",
        "span",
        "alloc",
        "candle",
        "tracing_layer",
        "session",
        "lib",
    ],
    # Inside capture: the hot path's own order.
    ("src/capture", "crate::capture::"): [
        "sync",
        "wake",
        "raw",
        "gate",
        "clock",
        "sample",
        "frames",
        "unwind",
        "unwind_unsupported",
        "stack",
        "recent",
        "ring",
        "registry",
        "lifecycle",
        "hook",
        "oom",
        "names",
        "mod",
    ],
    # The profile document and the analysis.
    ("crates/highwater-profile/src", "crate::"): [
        "model",
        "units",
        "fileio",
        "alloc_log",
        "profile",
        "analysis",
        "ranks",
        "lib",
    ],
}

# Modules only test builds contain; they may reach anything.
EXEMPT = {"loom_models"}


def module_of(path, base):
    parts = path.relative_to(base).parts
    return parts[0].removesuffix(".rs")


def imports(text, prefix, nested):
    """Names the code outside `#[cfg(test)]` imports through `prefix` (and `super::` for a
    module nested one level under `base`)."""
    code = text.split("#[cfg(test)]")[0]
    code = re.sub(r"//[^\n]*", "", code)
    found = set()
    for group in re.finditer(re.escape(prefix) + r"\{([^}]*)\}", code):
        for part in re.split(r"[,\s]+", group.group(1)):
            if part.strip():
                found.add(part.strip().split("::")[0])
    found.update(re.findall(re.escape(prefix) + r"([a-z_]+)", code))
    if nested:
        found.update(re.findall(r"\bsuper::([a-z_]+)", code))
    return found


def main():
    problems = []
    for (base, prefix), order in LAYERS.items():
        base = ROOT / base
        rank = {name: index for index, name in enumerate(order)}
        for path in sorted(base.rglob("*.rs")):
            module = module_of(path, base)
            if module in EXEMPT:
                continue
            if module not in rank:
                problems.append(f"{path.relative_to(ROOT)}: module {module} has no layer")
                continue
            nested = prefix != "crate::" and len(path.relative_to(base).parts) == 1
            for name in imports(path.read_text(), prefix, nested):
                if name in rank and name != module and rank[name] > rank[module]:
                    problems.append(
                        f"{path.relative_to(ROOT)}: {module} imports {name}, a layer above it"
                    )
    for problem in problems:
        print(problem)
    if problems:
        sys.exit(1)
    print("imports point down the layers")


if __name__ == "__main__":
    main()
