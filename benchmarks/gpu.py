"""GPU figures, on a machine with a CUDA GPU: hydra-ddpw (plain run, multirun) beside torchrun on the same
GPU, one rank, nccl. Whole command (start-up to exit), time to the task's first line, and the steady
state of a DDP training loop (median milliseconds per step). Runs interleaved; median (min-max).

    python benchmarks/gpu.py [--reps 5] [--out results.md]

Not part of the tests: it measures, it does not pass or fail.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

APP = Path(__file__).parent / "apps" / "gpu_app.py"
COMMANDS = {
    "hydra-ddpw, plain run": [sys.executable, str(APP)],
    "hydra-ddpw, multirun": [sys.executable, str(APP), "-m"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", str(APP), "hydra/launcher=basic"],
}


def once(command: list[str]) -> dict[str, float]:
    """Run `command` once in a fresh folder; its figures."""
    with tempfile.TemporaryDirectory() as folder:
        start = time.time()
        proc = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "BENCH_T0": str(start)})
        wall = time.time() - start
    found = re.search(r"step_ms=([\d.]+) ready_s=([\d.]+) backend=(\w+)", proc.stdout + proc.stderr)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"{command} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    assert found.group(3) == "nccl"
    return {"wall_s": wall, "ready_s": float(found.group(2)), "step_ms": float(found.group(1))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu.md")
    args = parser.parse_args()
    import torch

    for command in COMMANDS.values():  # warm-up: caches, CUDA's first start
        once(command)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in COMMANDS}
    for _ in range(args.reps):
        for name, command in COMMANDS.items():
            runs[name].append(once(command))

    def cell(name: str, key: str) -> str:
        values = [run[key] for run in runs[name]]
        return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"

    def ratio(name: str, key: str) -> str:
        ours = statistics.median(run[key] for run in runs[name])
        theirs = statistics.median(run[key] for run in runs["torchrun"])
        return f"{ours / theirs:.2f}x"

    lines = [
        "# GPU figures",
        "",
        f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, {os.cpu_count()} CPU cores; one rank, nccl; "
        f"{args.reps} interleaved runs after a warm-up; median (min-max). `python benchmarks/gpu.py`.",
        "",
        "| command | whole command (s) | to the task's first line (s) | DDP step (ms) | vs torchrun: command | step |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name in COMMANDS:
        lines.append(f"| {name} | {cell(name, 'wall_s')} | {cell(name, 'ready_s')} | {cell(name, 'step_ms')} | "
                     f"{ratio(name, 'wall_s')} | {ratio(name, 'step_ms')} |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
