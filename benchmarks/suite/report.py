"""Turns the suite's data into results.md (tables, targets) and the PNG plots."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from suite.harness import Stats

Data = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("torch", "hydra-core", "omegaconf", "submitit", "cloudpickle", "ddpw", "hydra-submitit-launcher",
            "hydra-ddpw")


# Environment -----------------------------------------------------------------------------------------

def environment() -> Data:
    """The machine and the versions of everything measured."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {
        "date": datetime.now().strftime("%Y-%m-%d %H:%M"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(_memory_kib() / 2**20, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "commit": _git_commit(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_kib() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(  # the results folder itself does not count: the run rewrites it
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results"],
            cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" with uncommitted changes" if dirty else "")


# Targets ---------------------------------------------------------------------------------------------

def _median(cell: Data | None, metric: str) -> float | None:
    if not cell or "error" in cell or metric not in cell:
        return None
    return float(cell[metric]["median"])


def _launch_cell(data: Data, tool: str, n: int) -> Data | None:
    return data.get("launch", {}).get("rows", {}).get(tool, {}).get(str(n))


def _floor_note(data: Data) -> list[str]:
    """What the plain single-process Hydra run (no launcher can beat it) is worth against torchrun."""
    plain = _median(_launch_cell(data, "hydra_plain", 1), "wall")
    torchrun = _median(_launch_cell(data, "torchrun", 2), "wall")
    if plain is None or torchrun is None:
        return []
    return [f"The floor: a plain single-process run of the same Hydra app (start Python, import torch, compose "
            f"the config, run the task as a world of one, exit) took {plain:.2f} s, {plain / torchrun:.2f}x "
            f"torchrun's 2-rank command. A 2-rank launch of that app does all of this and also starts, connects "
            f"and stops the ranks, so it cannot come in under that ratio.", ""]


def _own_process_note(data: Data) -> list[str]:
    """What a one-rank job costs when its rank has a process of its own, against ddpw's, which has none."""
    metrics = ("wall", "cpu", "faults")
    ddpw = [_median(_launch_cell(data, "ddpw", 1), m) for m in metrics]
    parts = []
    for key, label in (("ddpw_fork", "ddpw's command with one fork of a child that exits at once"),
                       ("wrapper", "the Wrapper's default (the rank in a process of its own)"),
                       ("wrapper_caller", "the Wrapper with caller_rank=True (no process, as ddpw)")):
        ours = [_median(_launch_cell(data, key, 1), m) for m in metrics]
        pairs = [(a, b) for a, b in zip(ours, ddpw, strict=True) if a is not None and b is not None]
        if len(pairs) < len(metrics):
            return []
        (wall, wall0), (cpu, cpu0), (faults, faults0) = pairs
        parts.append(f"{label} took {wall / wall0:.3f}x its wall time, {cpu / cpu0:.3f}x its CPU time and "
                     f"{(faults - faults0) / 1e3:+.1f}k page faults")
    return ["A rank in a process of its own, at 1 rank: ddpw runs a one-rank job in the calling process. Against "
            "ddpw's command, " + "; ".join(parts) + ". A fork leaves the calling process's memory copy-on-write, "
            "so its exit then faults on every page it writes; page faults are counts, not times, and do not "
            "drift with the machine's speed.", ""]


STEADY_LABELS = {"hydra_ddpw": "plain run", "hydra_ddpw_multirun": "multirun", "wrapper": "Wrapper"}
"""The ways hydra-ddpw starts ranks that the steady-state sections compare with torchrun."""


def _steady_row(rows: list[tuple[str, str, bool | None]], text: str, ours: float | None, other: float | None,
                limit: float) -> None:
    if ours is None or other is None:
        rows.append((text, "not measured", None))
    else:
        rows.append((text, f"{ours / other:.3f}x ({ours * 1e3:.2f} ms vs {other * 1e3:.2f} ms)",
                     ours <= limit * other))


def targets(data: Data) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met) for each target of issues 6 and 13 that the data can judge."""
    rows: list[tuple[str, str, bool | None]] = []

    def ratio_row(text: str, ours: float | None, other: float | None, limit: float, other_name: str) -> None:
        if ours is None or other is None:
            rows.append((text, "not measured", None))
            return
        ratio = ours / other
        rows.append((text, f"{ratio:.3f}x ({ours:.2f} s vs {other_name} {other:.2f} s)", ratio <= limit))

    ours2 = _median(_launch_cell(data, "hydra_ddpw", 2), "wall")
    ratio_row("2 ranks: whole command <= 0.6x torchrun", ours2, _median(_launch_cell(data, "torchrun", 2), "wall"),
              0.6, "torchrun")
    ratio_row("2 ranks: whole command <= 1.3x plain single-process Hydra run", ours2,
              _median(_launch_cell(data, "hydra_plain", 1), "wall"), 1.3, "plain Hydra")
    ratio_row("4 ranks: whole command <= 0.5x torchrun", _median(_launch_cell(data, "hydra_ddpw", 4), "wall"),
              _median(_launch_cell(data, "torchrun", 4), "wall"), 0.5, "torchrun")

    plain = _median(_launch_cell(data, "hydra_plain", 1), "wall")
    ratio_row("2 ranks: whole command <= 1.05x plain single-process Hydra run (issue 22)", ours2, plain, 1.05,
              "plain Hydra")
    for key, label in (("wrapper", "Wrapper"), ("wrapper_caller", "Wrapper(caller_rank=True)")):
        for n in (1, 2, 4):
            for metric, what in (("wall", "whole command"), ("cpu", "CPU time")):
                ratio_row(f"{label}, {n} rank(s): {what} <= 1.0x the ddpw package's Wrapper (issue 22)",
                          _median(_launch_cell(data, key, n), metric), _median(_launch_cell(data, "ddpw", n), metric),
                          1.0, "ddpw")

    fit = data.get("scale", {}).get("slope_s_per_rank", {}).get("wall", {}).get("up_to_8")
    rows.append(("8 ranks: growth per extra rank < 0.15 s (slope of whole command, 1-8 ranks)",
                 "not measured" if fit is None else f"{fit:.3f} s per rank", None if fit is None else fit < 0.15))

    sweep = data.get("sweep", {})
    per_job = _median(sweep.get("rows", {}).get("hydra_ddpw"), "per_job")
    rows.append((f"Sweep: per-job overhead after the first job <= 0.4 s ((total - first job) / "
                 f"{sweep.get('n_jobs', 8) - 1})",
                 "not measured" if per_job is None else f"{per_job:.2f} s",
                 None if per_job is None else per_job <= 0.4))

    lazy2 = _median(_launch_cell(data, "hydra_ddpw_lazy", 2), "wall")
    ratio_row("Torch imported in the task, 2 ranks: whole command <= 0.6x torchrun (issue 13)", lazy2,
              _median(_launch_cell(data, "torchrun", 2), "wall"), 0.6, "torchrun")
    ratio_row("Torch imported in the task, 2 ranks: whole command <= 1.3x plain single-process Hydra run "
              "(issue 13)", lazy2, _median(_launch_cell(data, "hydra_plain", 1), "wall"), 1.3, "plain Hydra")
    packing_rows = data.get("packing", {}).get("rows", {})
    ratio_row("Sweep of DDP jobs: per job after the first <= 2x a trivial sweep's (issue 13)",
              _median(packing_rows.get("ddp"), "per_job"), _median(packing_rows.get("trivial"), "per_job"), 2.0,
              "trivial")
    extra = _ddp_extra(data.get("packing", {}))
    rows.append(("Sweep of DDP jobs: what a DDP job costs more than a trivial one is the task's own work, no more "
                 "than the same DDP construction costs in a fresh process (issue 22)",
                 "not measured" if extra is None else
                 f"{extra[0]:.2f} s more per job ({extra[1]:.2f} s in the median interval), {extra[2]:.2f} s of "
                 f"it the task's work; fresh process {extra[3]:.2f} s",
                 None if extra is None else extra[0] <= extra[3]))

    exit_s = _median(data.get("failure", {}).get("rows", {}).get("hydra_ddpw"), "exit_after_raise")
    rows.append(("Failure: command exits <= 0.5 s after the rank raised (median)",
                 "not measured" if exit_s is None else f"{exit_s:.2f} s", None if exit_s is None else exit_s <= 0.5))

    steady_rows = data.get("steady", {}).get("rows", {})
    training_rows = data.get("training", {}).get("rows", {})
    for key, label in STEADY_LABELS.items():
        for mb in ("1", "64") if key == "hydra_ddpw" else ("1",):
            _steady_row(rows, f"Steady state, {label}: all_reduce {mb} MB within 5% of torchrun",
                        _median(steady_rows.get(key), mb), _median(steady_rows.get("torchrun"), mb), 1.05)
        _steady_row(rows, f"Steady state, {label}: DDP training step <= 1.02x torchrun's (issue 22)",
                    _median(training_rows.get(key), "median"), _median(training_rows.get("torchrun"), "median"),
                    1.02)

    extra = data.get("discovery", {}).get("paired", {}).get("discovery_wall")
    rows.append(("Plugin discovery in an app that does not use hydra-ddpw: <= 10 ms more with hydra-ddpw "
                 "installed than without (issue 22; median over interleaved pairs)",
                 "not measured" if extra is None else f"{extra['median'] * 1e3:+.1f} ms",
                 None if extra is None else extra["median"] <= 0.010))

    lazy = data.get("footprint", {}).get("rows", {}).get("hydra_ddpw_lazy_multirun")
    if lazy and "error" not in lazy:
        rss = lazy["peak_rss_mb"]["median"]
        rows.append(("Controller does not import torch (multirun of an app importing torch in the task)",
                     "imports torch" if lazy["imported_torch"] else "torch not imported", not lazy["imported_torch"]))
        rows.append(("Controller peak RSS <= 120 MB (multirun of an app importing torch in the task)",
                     f"{rss:.0f} MB", rss <= 120))
    else:
        rows.append(("Controller does not import torch; peak RSS <= 120 MB", "not measured", None))
    return rows


# Markdown --------------------------------------------------------------------------------------------

def _fmt(cell: Data | None, metric: str, scale: float = 1.0, digits: int = 2) -> str:
    if cell is None:
        return ""
    if "error" in cell:
        return "failed"
    return Stats.from_dict(cell[metric]).fmt(scale, digits)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines + [""]


def _errors(rows: Data, labels: dict[str, str]) -> list[str]:
    """A line per row that failed (a whole row, or any of its cells), with the reason."""
    lines = []
    for key, row in rows.items():
        if "error" in row:
            reasons = [row["error"]]
        else:
            reasons = [cell["error"] for cell in row.values() if isinstance(cell, dict) and "error" in cell]
        if reasons:
            lines.append(f"- {labels.get(key, key)} failed: `{reasons[0]}`")
    return lines + ([""] if lines else [])


def markdown(data: Data, reps: int, quick: bool) -> str:
    """results.md."""
    env = data["environment"]
    v = env["versions"]
    out = [
        "# hydra-ddpw benchmarks",
        "",
        f"Written by `python benchmarks/run.py{' --quick' if quick else ''}` on {env['date']}"
        f" (hydra-ddpw at {env['commit']}).",
        "",
        f"- Machine: {env['cpu']}, {env['cores']} cores, {env['memory_gib']} GiB, {env['os']}, no GPU used",
        f"- Python {env['python']}, torch {v['torch']}, hydra-core {v['hydra-core']}, omegaconf {v['omegaconf']}, "
        f"submitit {v['submitit']}, cloudpickle {v['cloudpickle']}, ddpw {v['ddpw']}, "
        f"hydra-submitit-launcher {v['hydra-submitit-launcher']}",
        f"- Each figure: median (min–max) of {reps} runs, in seconds unless said otherwise; runs interleaved "
        "across commands" + (", after one unmeasured warm-up run of each." if data.get("warm_up", True)
                             else " (no warm-up runs: the caches were warm from an earlier run)."),
        "- The job everywhere: a gloo process group (made by hydra-ddpw before the task; by the task "
        "elsewhere), one all_reduce, a barrier. CPU ranks, gloo.",
        "",
    ]
    quiet = data.get("quiet")
    if quiet:
        out.insert(-1, f"- CPU idle just before each run: median {quiet['median_idle']:.0%}, lowest "
                       f"{quiet['min_idle']:.0%}; {quiet['busy_runs']} of {quiet['runs']} runs started on a busy "
                       f"machine (below {quiet['threshold']:.0%} idle after waiting).")
    kept = [f"{name} ({section['measured_in']['date']}, {section['measured_in']['commit']})"
            for name, section in data.items() if isinstance(section, dict) and "measured_in" in section]
    if kept:
        out.insert(-1, "- Sections kept from an earlier run (each table is still one run's): " + ", ".join(kept))
    if quick:
        out += ["**Quick smoke run: too few repetitions to judge the targets.**", ""]
    out += ["## Targets (issues 6 and 13)", ""]
    marks = {True: "met", False: "**not met**", None: "-"}
    out += _table(["target", "measured (same run)", ""], [(t, m, marks[ok]) for t, m, ok in targets(data)])
    out += _floor_note(data)
    out += _own_process_note(data)
    if "launch" in data:
        out += _launch_md(data["launch"])
    if "sweep" in data:
        out += _sweep_md(data["sweep"])
    if "packing" in data:
        out += _packing_md(data["packing"])
    if "failure" in data:
        out += _failure_md(data["failure"])
    if "steady" in data:
        out += _steady_md(data["steady"])
    if "training" in data:
        out += _training_md(data["training"])
    if "footprint" in data:
        out += _footprint_md(data["footprint"])
    if "scale" in data:
        out += _scale_md(data["scale"])
    if "discovery" in data:
        out += _discovery_md(data["discovery"])
    return "\n".join(out)


def _launch_md(launch: Data) -> list[str]:
    sizes = launch["sizes"]
    tools = launch["tools"]
    out = ["## 1. Launch", "",
           "Whole command: from the command's start to its exit. In the task: until the last rank entered the "
           "task function. Ready: until the last rank has its process group (for hydra-ddpw the same moment as "
           "in the task, since it makes the group before the task; elsewhere the task makes it).", "",
           "![launch](launch.png)", ""]
    for metric, title, scale, digits in (
            ("wall", "Whole command (s)", 1.0, 2),
            ("cpu", "CPU time of the command and its processes (s)", 1.0, 2),
            ("faults", "Minor page faults of the command and its processes (thousands)", 1e-3, 1),
            ("entry", "All ranks in the task (s)", 1.0, 2),
            ("ready", "All ranks ready (process group made) (s)", 1.0, 2)):
        out += [f"**{title}**", ""]
        rows = []
        for key, row in launch["rows"].items():
            if any(metric in (cell or {}) or "error" in (cell or {}) for cell in row.values()):
                rows.append([tools[key]["label"], *[_fmt(row.get(str(n)), metric, scale, digits) for n in sizes]])
        out += _table(["ranks", *[str(n) for n in sizes]], rows)
    out += _errors(launch["rows"], {k: t["label"] for k, t in tools.items()})
    out += ["Commands:", ""] + [f"- {t['label']}: {t['note']}" for t in tools.values()] + [""]
    return out


def _sweep_md(sweep: Data) -> list[str]:
    n = sweep["n_jobs"]
    out = [f"## 2. Sweep: {n} jobs x {sweep['n_ranks']} ranks", "",
           f"Per job: (total - first job) / {n - 1}, the first job ending when its last rank finished. "
           "Interval: median time between the ends of consecutive jobs.", ""]
    rows = [[sweep["labels"][k], _fmt(r, "total"), _fmt(r, "first"), _fmt(r, "per_job"), _fmt(r, "interval")]
            for k, r in sweep["rows"].items()]
    out += _table(["", "total", "first job", "per job after the first", "interval"], rows)
    out += _errors(sweep["rows"], sweep["labels"])
    out += [f"hydra-submitit-launcher's local executor starts every job of the sweep at once ({n} jobs x "
            f"{sweep['n_ranks']} tasks on this machine's {os.cpu_count()} cores); torchrun runs one command per "
            "job (no Hydra).", ""]
    return out


def _packing_md(packing: Data) -> list[str]:
    n = packing["n_jobs"]
    out = [f"## 2b. Sweeps of real jobs, one after another and side by side: {n} one-rank jobs", "",
           f"hydra-ddpw multiruns (`-m job=range(0,{n}) platform.n_procs_per_node=1`). Per job: (total - first "
           f"job) / {n - 1}. Side by side, each job takes one core of its own (`platform.n_cpus_per_node=1`), "
           f"so this machine's {os.cpu_count()} cores run {os.cpu_count()} jobs at once; one after another, "
           "each job has every core (its torch threads too).", ""]
    rows = [[packing["labels"][k], _fmt(r, "total"), _fmt(r, "first"), _fmt(r, "per_job"),
             *(_fmt(r, metric) if metric in r or "error" in r else "" for metric in ("interval", "task_work"))]
            for k, r in packing["rows"].items()]
    out += _table(["", "total", "first job", "per job after the first", "interval", "the task's own work (jobs "
                   "after the first)"], rows)
    out += _errors(packing["rows"], packing["labels"])
    fresh = packing.get("fresh")
    if fresh:
        out += ["The same tasks each in a fresh single process, no launcher (`python plain_script.py MODE`, torch "
                "imported at the top, a world of one): the whole command, and the task's own work once its "
                "process group is up (DDP's construction imports what it needs then).", ""]
        out += _table(["", "whole command", "the task's own work"],
                      [[packing["fresh_labels"][k], _fmt(r, "wall"), _fmt(r, "task_work")] for k, r in fresh.items()])
        out += _errors(fresh, packing["fresh_labels"])
        out += _ddp_share(packing)
    return out


def _ddp_extra(packing: Data) -> tuple[float, float, float, float] | None:
    """What a DDP job of the sweep costs more than a trivial one: per job after the first, and in the
    median interval between jobs; the task's own work in the sweep; and the task's work in a fresh process."""
    rows, fresh = packing.get("rows", {}), packing.get("fresh", {})
    pairs = [(rows, "per_job"), (rows, "interval"), (rows, "task_work"), (fresh, "task_work")]
    extra = []
    for where, metric in pairs:
        ddp, trivial = _median(where.get("ddp"), metric), _median(where.get("trivial"), metric)
        if ddp is None or trivial is None:
            return None
        extra.append(ddp - trivial)
    return extra[0], extra[1], extra[2], extra[3]


def _ddp_share(packing: Data) -> list[str]:
    extra = _ddp_extra(packing)
    if extra is None:
        return []
    per_job, interval, in_sweep, fresh = extra
    return [f"A DDP job after the first took {per_job:.2f} s more than a trivial one on average, and "
            f"{interval:.2f} s more in the median interval between jobs (the average also holds the rank "
            f"starter's one-time import of what the first DDP job imported, so that later jobs' ranks start "
            f"with it); its task's own work took {in_sweep:.2f} s more. In a fresh process the same DDP "
            f"construction takes {fresh:.2f} s more than the trivial task.", ""]


def _failure_md(failure: Data) -> list[str]:
    out = [f"## 3. Failure ({failure['n_ranks']} ranks)", "",
           "Rank 1 writes the time and raises just after its process group is made; rank 0 goes on to an "
           "all_reduce. Measured: from rank 1's raise to the command's exit.", ""]
    rows = [[failure["labels"][k], _fmt(r, "exit_after_raise"), _fmt(r, "wall"),
             ", ".join(str(c) for c in r.get("exit_codes", []))] for k, r in failure["rows"].items()]
    out += _table(["", "raise -> exit", "whole command", "exit code"], rows)
    return out + _errors(failure["rows"], failure["labels"])


def _steady_md(steady: Data) -> list[str]:
    iters = steady.get("iters", {})
    out = [f"## 4. Steady state ({steady['n_ranks']} ranks)", "",
           f"Rank 0's median time of one all_reduce of a float32 tensor ({steady.get('warmup', '?')} warm-up "
           f"calls, then {iters.get('1', '?')} timed calls for 1 MB and {iters.get('64', '?')} for 64 MB, each "
           "after a barrier), in milliseconds.", ""]
    rows = [[steady["labels"][k], _fmt(r, "1", 1e3), _fmt(r, "64", 1e3)] for k, r in steady["rows"].items()]
    out += _table(["", "1 MB", "64 MB"], rows)
    return out + _errors(steady["rows"], steady["labels"])


def _training_md(training: Data) -> list[str]:
    out = [f"## 4b. Steady state: a DDP training loop ({training['n_ranks']} ranks)", "",
           f"{training.get('model', '?')} per rank in DistributedDataParallel, SGD; {training.get('warmup', '?')} "
           f"untimed steps, then {training.get('steps', '?')} steps each timed on its own (forward, backward "
           "with DDP's gradient all_reduce, optimizer step). Per run: rank 0's median, 10th and 90th percentile "
           "step time; each cell: the median (min–max) of that over the interleaved runs, in milliseconds.", ""]
    torchrun = _median(training["rows"].get("torchrun"), "median")
    rows = []
    for key, r in training["rows"].items():
        ours = _median(r, "median")
        ratio = f"{ours / torchrun:.3f}x" if ours is not None and torchrun else ""
        threads = "" if "error" in r else ", ".join(str(t) for t in r["threads"])
        rows.append([training["labels"][key], _fmt(r, "median", 1e3), _fmt(r, "p10", 1e3), _fmt(r, "p90", 1e3),
                     ratio, threads])
    out += _table(["", "median step", "10th percentile", "90th percentile", "vs torchrun", "torch threads"], rows)
    return out + _errors(training["rows"], training["labels"])


def _footprint_md(fp: Data) -> list[str]:
    out = [f"## 5. Controller footprint ({fp['n_ranks']} ranks)", "",
           "Peak RSS (VmHWM) of the command's own process, the one the user started (for hydra-ddpw the Hydra "
           "process; for torchrun its agent; for mp.spawn the parent), polled every 20 ms while the ranks run "
           "and hold for a second; torch imported: libtorch mapped in that process while the ranks ran.", ""]
    rows = []
    for key, r in fp["rows"].items():
        torch_text = "" if "error" in r else {True: "yes", False: "no", None: "varied"}[r["imported_torch"]]
        rows.append([fp["labels"][key], _fmt(r, "peak_rss_mb", digits=0), torch_text])
    out += _table(["", "peak RSS (MB)", "torch imported"], rows)
    out += ["An app that imports torch at the top makes its Hydra process import torch before any launcher runs. "
            "In a plain run (no `-m`) the Hydra process is rank 0 (it runs the task, as Hydra's own run mode "
            "does), so it holds torch like any rank; in a multirun it only supervises, and the app importing "
            "torch inside the task shows what the launcher itself costs that controller.", ""]
    return out + _errors(fp["rows"], fp["labels"])


def _scale_md(scale: Data) -> list[str]:
    row = scale["row"]
    fits = scale["slope_s_per_rank"]
    out = [f"## 6. Scale: {scale['label']}", "", "![scale](scale.png)", ""]
    out += _table(["ranks", "whole command", "all ranks ready"],
                  [[str(n), _fmt(row.get(str(n)), "wall"), _fmt(row.get(str(n)), "ready")] for n in scale["sizes"]])

    def s(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f} s"

    out += [f"Growth per extra rank (least-squares slope of the medians): whole command {s(fits['wall']['up_to_8'])} "
            f"over 1-8 ranks, {s(fits['wall']['all'])} over all; ranks ready {s(fits['ready']['up_to_8'])} over "
            f"1-8 ranks, {s(fits['ready']['all'])} over all.", ""]
    return out + _errors({"scale": row}, {"scale": scale["label"]})


def _discovery_md(disc: Data) -> list[str]:
    out = [f"## 7. Hydra's plugin discovery, with and without hydra-ddpw ({disc['reps']} interleaved pairs)", "",
           "A fresh process per run (`apps/discovery.py`): after `import hydra`, `Plugins.instance()` (the scan "
           "of every module under `hydra_plugins` that every Hydra app runs at start-up), then composing a "
           "config that knows nothing of hydra-ddpw (`apps/conf_plain/plain.yaml`, Hydra's own config "
           "included). Without hydra-ddpw: the scan is given a `hydra_plugins` package linking to every "
           "installed plugin but hydra-ddpw's; with it: to every one (see `sections.discovery`). Milliseconds, "
           "median (min–max).", ""]
    rows = []
    for key, r in disc["rows"].items():
        if "error" in r:
            rows.append([disc["labels"][key], "failed", "", "", "", ""])
            continue
        rows.append([disc["labels"][key], _fmt(r, "discovery_wall", 1e3, 1), _fmt(r, "discovery_cpu", 1e3, 1),
                     _fmt(r, "compose_wall", 1e3, 1), _fmt(r, "compose_cpu", 1e3, 1),
                     f"{r['modules_imported']}{' (ddpw_conf too)' if r['ddpw_conf_imported'] else ''}"])
    paired = disc.get("paired") or {}
    if paired:
        rows.append(["more with hydra-ddpw (per pair)", *[Stats.from_dict(paired[m]).fmt(1e3, 1) for m in (
            "discovery_wall", "discovery_cpu", "compose_wall", "compose_cpu")], ""])
    out += _table(["plugins scanned", "discovery", "discovery, CPU", "compose", "compose, CPU",
                   "modules the scan imported"], rows)
    return out + _errors(disc["rows"], disc["labels"])


# Plots -----------------------------------------------------------------------------------------------

def plots(data: Data, folder: Path) -> list[Path]:
    """launch.png (and scale.png, sweep.png when there is data for them); the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    if "launch" in data:
        written.append(_plot_launch(plt, data["launch"], folder / "launch.png"))
    if "scale" in data:
        written.append(_plot_scale(plt, data["scale"], folder / "scale.png"))
    if "sweep" in data or "failure" in data:
        written.append(_plot_sweep_failure(plt, data, folder / "sweep_failure.png"))
    return written


def _series(row: Data, sizes: Sequence[int], metric: str) -> tuple[list[int], list[float], list[list[float]]]:
    xs, ys, err_lo, err_hi = [], [], [], []
    for n in sizes:
        cell = row.get(str(n))
        if cell and "error" not in cell:
            st = cell[metric]
            xs.append(n)
            ys.append(st["median"])
            err_lo.append(st["median"] - st["min"])
            err_hi.append(st["max"] - st["median"])
    return xs, ys, [err_lo, err_hi]


def _plot_launch(plt: Any, launch: Data, path: Path) -> Path:
    sizes = launch["sizes"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 6.2), sharey=True)
    for ax, metric, title in ((axes[0], "wall", "Whole command"), (axes[1], "ready", "Until every rank is ready")):
        for key, row in launch["rows"].items():
            label = launch["tools"][key]["label"]
            xs, ys, err = _series(row, sizes, metric)
            if not xs:
                continue
            if key == "hydra_plain":
                ax.axhline(ys[0], color="grey", linestyle="--", label=label)
                continue
            bold = key.startswith("hydra_ddpw") or key == "wrapper"
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label, linewidth=2.5 if bold else 1.2)
        ax.set_title(f"{title} (median, min-max)")
        ax.set_xlabel("ranks")
        ax.set_xticks(sizes)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("seconds")
    axes[0].set_ylim(bottom=0)
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.suptitle("Launching a trivial distributed job (gloo init + all_reduce + barrier), CPU ranks")
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_scale(plt: Any, scale: Data, path: Path) -> Path:
    sizes = scale["sizes"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for metric, label in (("wall", "whole command"), ("ready", "every rank ready")):
        xs, ys, err = _series(scale["row"], sizes, metric)
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
    ax.set_xlabel("ranks")
    ax.set_ylabel("seconds")
    ax.set_xticks(sizes)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"{scale['label']}: launch time by number of ranks")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_sweep_failure(plt: Any, data: Data, path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    panels = (("sweep", "per_job", "Sweep: overhead per job after the first", 0.4),
              ("failure", "exit_after_raise", "Failure: rank raises -> command exits", 0.5))
    for ax, (section, metric, title, target) in zip(axes, panels, strict=True):
        part = data.get(section)
        if not part:
            ax.set_visible(False)
            continue
        names: list[str] = []
        ys: list[float] = []
        err: list[list[float]] = [[], []]
        for key, row in part["rows"].items():
            if "error" in row:
                continue
            st = row[metric]
            names.append(part["labels"][key])
            ys.append(st["median"])
            err[0].append(st["median"] - st["min"])
            err[1].append(st["max"] - st["median"])
        ax.barh(names, ys, xerr=err, capsize=3, color="tab:blue")
        ax.axvline(target, color="tab:red", linestyle="--", label=f"issue 6 target for hydra-ddpw ({target} s)")
        ax.legend(fontsize=8, loc="lower right")
        ax.set_xlabel("seconds (median, min-max)")
        ax.set_title(title)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def quiet_summary(idle: Sequence[float], threshold: float) -> Data:
    """How quiet the machine was before the runs."""
    if not idle:
        return {}
    ordered = sorted(idle)
    return {"runs": len(idle), "median_idle": ordered[len(ordered) // 2], "min_idle": ordered[0],
            "busy_runs": sum(1 for x in idle if x < threshold), "threshold": threshold}


def console_summary(data: Data) -> str:
    """The targets as lines of text, for the end of a run."""
    marks = {True: "met", False: "NOT MET", None: "-"}
    return "\n".join(f"{marks[ok]:8} {t}: {m}" for t, m, ok in targets(data))


if __name__ == "__main__":  # pragma: no cover - run.py is the entry point
    sys.exit("run `python benchmarks/run.py`")
