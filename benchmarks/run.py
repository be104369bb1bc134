"""The hydra-ddpw benchmark suite (issue 6): this launcher side by side with the tools users would pick.

    pip install -c constraints.txt -e ".[bench]"
    python benchmarks/run.py            # the full suite (about 45 minutes on 2 cores)
    python benchmarks/run.py --quick    # a smoke run: 1 repetition, fewer rank counts, a shorter sweep

Writes benchmarks/results/results.md (tables, the issue's targets, machine and versions),
launch.png, scale.png, sweep_failure.png and raw.json (every figure, to redraw with --report-only).
Not part of the tests: it measures, it does not pass or fail.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from suite import harness, report, sections

RESULTS = Path(__file__).resolve().parent / "results"
SECTIONS = ("launch", "sweep", "packing", "failure", "steady", "training", "footprint", "scale", "discovery")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 repetition, fewer sizes")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per figure (default 5; 1 with --quick)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                        help="sections to run; the others are kept from the last raw.json, marked as such")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for results.md, the plots and raw.json")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="skip the unmeasured first run of each command (caches already warm)")
    parser.add_argument("--report-only", action="store_true", help="redraw results.md and plots from raw.json")
    return parser.parse_args(argv)


def plan(quick: bool, reps: int) -> dict[str, Callable[[], Any]]:
    """What each section runs, with the sizes of a full or a quick run."""
    launch_sizes = (1, 2, 4) if quick else (1, 2, 4, 8)
    scale_sizes = (1, 2, 4, 8) if quick else (1, 2, 4, 8, 12, 16)
    return {
        "launch": lambda: sections.launch(launch_sizes, reps),
        "sweep": lambda: sections.sweep(n_jobs=4 if quick else 8, n_ranks=2, reps=reps),
        "packing": lambda: sections.packing(n_jobs=4 if quick else 6, reps=reps),
        "failure": lambda: sections.failure(n_ranks=2, reps=reps),
        "steady": lambda: sections.steady(n_ranks=2, reps=reps),
        "training": lambda: sections.training(n_ranks=2, reps=2 * reps),  # a spread worth reporting
        "footprint": lambda: sections.footprint(n_ranks=2, reps=reps),
        "scale": lambda: sections.scale(scale_sizes, reps),
        "discovery": lambda: sections.discovery(4 * reps),  # fresh processes of a second each: more pairs
    }


def main(argv: list[str]) -> int:
    """Run the chosen sections, then write the report."""
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        data = json.loads((args.out / "raw.json").read_text())
    else:
        reps = args.reps or (1 if args.quick else 5)
        data = {"environment": report.environment(), "reps": reps, "quick": args.quick, "warm_up": not args.no_warm_up}
        data.update(earlier_sections(args.out, set(SECTIONS) - set(args.only)))
        sections.WARM_UP = not args.no_warm_up
        steps = plan(args.quick, reps)
        for name in args.only:
            began = time.monotonic()
            data[name] = steps[name]()
            data["quiet"] = report.quiet_summary(harness.quiet_log, harness.QUIET_IDLE)
            print(f"[{name}] done in {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
            write(data, args.out)  # after every section, so a long run leaves what it has measured
    write(data, args.out)
    print(f"wrote results.md, raw.json and the plots in {args.out}\n{report.console_summary(data)}")
    return 0


def earlier_sections(out: Path, names: set[str]) -> dict[str, Any]:
    """The sections `names` of the last run's raw.json, each marked with that run's date and commit (a
    partial run keeps the figures it did not measure; ratios are only ever taken within one section)."""
    try:
        earlier = json.loads((out / "raw.json").read_text())
    except (OSError, ValueError):
        return {}
    kept = {name: earlier[name] for name in names if name in earlier}
    for section in kept.values():
        section.setdefault("measured_in", {key: earlier["environment"][key] for key in ("date", "commit")})
    return kept


def write(data: dict[str, Any], out: Path) -> None:
    """raw.json, results.md and the plots of `data`."""
    (out / "raw.json").write_text(json.dumps(data, indent=1))
    (out / "results.md").write_text(report.markdown(data, data["reps"], data["quick"]))
    report.plots(data, out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
