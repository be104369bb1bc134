"""The measurements of the suite. Each returns plain data (JSON-ready) that report.py renders.

Repetitions are interleaved (rep 1 of every command, then rep 2, ...) so that a slow spell of the
machine spreads over all commands instead of landing on one; each command runs once unmeasured first,
so every measured run finds the same warm file caches.
"""

from __future__ import annotations

import functools
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from suite.harness import CommandFailed, Run, Stats, python_argv, run_command
from suite.tools import (
    FAILURE_TOOLS,
    FOOTPRINT_TOOLS,
    HYDRA_DDPW,
    LAUNCH_TOOLS,
    PACKING_CASES,
    STEADY_TOOLS,
    SWEEP_TOOLS,
    Tool,
    packing_argv,
    sweep_argv,
)

Data = dict[str, Any]
Case = tuple[str, Callable[[], Any]]
WARM_UP = True
"""Run each command once unmeasured before the measured runs (run.py --no-warm-up turns it off)."""


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _measure(cases: Sequence[Case], reps: int, what: str, warm_up: bool = True) -> dict[str, list[Any] | str]:
    """Run every case once unmeasured (unless not `warm_up`), then `reps` times interleaved; per case
    its values, or the reason it failed. A failed run is tried once more (a busy machine can make a
    rendezvous time out); a case that fails twice in a row is dropped, keeping the reason."""
    out: dict[str, list[Any] | str] = {}
    for key, fn in cases:
        if not (warm_up and WARM_UP):
            out[key] = []
            continue
        _progress(f"[{what}] warm-up {key}")
        failure = _try_twice(fn, f"[{what}] {key}")
        out[key] = failure if isinstance(failure, str) else []
    for rep in range(reps):
        for key, fn in cases:
            values = out[key]
            if isinstance(values, str):
                continue
            _progress(f"[{what}] {rep + 1}/{reps} {key}")
            value = _try_twice(fn, f"[{what}] {key}")
            if isinstance(value, str):
                out[key] = value
            else:
                values.append(value)
    return out


def _try_twice(fn: Callable[[], Any], name: str) -> Any:
    """`fn()`, tried again once if it fails; the reason (a str) when both tries failed."""
    for attempt in (1, 2):
        try:
            return fn()
        except CommandFailed as exc:
            _progress(f"{name} failed (try {attempt} of 2):\n{exc}")
            reason = _reason(exc)
    return reason


def _reason(exc: Exception) -> str:
    """The most telling line of a failure's output."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line and "error_file" not in line]
    return (errors[-1] if errors else lines[-1] if lines else "failed")[:300]


def _stats(values: Iterable[float]) -> Data:
    return Stats.of(list(values)).to_dict()


def _summary_rows(measured: dict[str, list[Any] | str], metrics: Sequence[str]) -> Data:
    """Per case: the stats of each of `metrics` over its runs, or the reason it failed."""
    return {key: {"error": values} if isinstance(values, str) else
            {metric: _stats(v[metric] for v in values) for metric in metrics}
            for key, values in measured.items()}


# 1. Launch -------------------------------------------------------------------------------------------

def launch(sizes: Sequence[int], reps: int, tools: Sequence[Tool] = LAUNCH_TOOLS) -> Data:
    """Whole-command wall time, CPU time and minor page faults, and time until every rank is in the task
    (entry) and has its process group (ready), for each tool and rank count."""
    cases: list[Case] = []
    for tool in tools:
        for n in sizes:
            if tool.supports(n):
                cases.append((f"{tool.key}:{n}", functools.partial(_launch_once, tool, n)))
    measured = _measure(cases, reps, "launch")
    rows: Data = {}
    for key, values in measured.items():
        tool_key, size = key.split(":")
        row = rows.setdefault(tool_key, {})
        if isinstance(values, str):
            row[size] = {"error": values}
        else:
            row[size] = {metric: _stats(v[metric] for v in values)
                         for metric in ("wall", "cpu", "faults", "entry", "ready")}
    return {"sizes": list(sizes), "rows": rows,
            "tools": {t.key: {"label": t.label, "note": t.note} for t in tools}}


def _launch_once(tool: Tool, n: int) -> dict[str, float]:
    run = run_command(tool.argv(n, "trivial"))
    _expect_ranks(run, n)
    return {"wall": run.wall_s, "cpu": run.cpu_s, "faults": run.page_faults, "entry": run.since_start("entry"),
            "ready": run.since_start("ready")}


def _expect_ranks(run: Run, n: int, tags: int = 1) -> None:
    if len(run.marks) != n * tags:
        raise CommandFailed(f"expected {n * tags} rank records, found {len(run.marks)}:\n{run.output_tail}")


# 2. Sweep --------------------------------------------------------------------------------------------

def sweep(n_jobs: int, n_ranks: int, reps: int) -> Data:
    """A sweep of `n_jobs` jobs of `n_ranks` ranks: total time, the first job, and the overhead of each
    job after the first."""
    cases: list[Case] = [(key, functools.partial(_sweep_once, key, n_jobs, n_ranks)) for key in SWEEP_TOOLS]
    # No warm-up run: each sweep is long, and its first job already pays any cold start.
    measured = _measure(cases, reps, "sweep", warm_up=False)
    rows: Data = {}
    for key, values in measured.items():
        if isinstance(values, str):
            rows[key] = {"error": values}
        else:
            rows[key] = {metric: _stats(v[metric] for v in values) for metric in values[0]}
    return {"n_jobs": n_jobs, "n_ranks": n_ranks, "rows": rows, "labels": dict(SWEEP_TOOLS)}


def _sweep_once(tool_key: str, n_jobs: int, n_ranks: int) -> dict[str, float]:
    # Commands after the first follow at once: they are part of one measured sweep.
    return _sweep_figures(sweep_argv(tool_key, n_jobs, n_ranks), n_jobs, n_ranks)


def _sweep_figures(argvs: list[list[str]], n_jobs: int, n_ranks: int) -> dict[str, float]:
    runs = [run_command(argv, quiet_first=k == 0) for k, argv in enumerate(argvs)]
    start, end = runs[0].start, runs[-1].end
    marks = [m for run in runs for m in run.marks]
    combined = Run(start=start, end=end, returncode=0, marks=marks)
    _expect_ranks(combined, n_ranks, n_jobs)
    done = [combined.since_start("done", f"job{k}") for k in range(n_jobs)]
    total = end - start
    return {
        "total": total,
        "first": done[0],
        "per_job": (total - done[0]) / (n_jobs - 1),
        "interval": statistics.median(sorted(done)[k] - sorted(done)[k - 1] for k in range(1, n_jobs)),
        "task_work": statistics.median(_task_work(marks, f"job{k}") for k in range(1, n_jobs)),
    }


def _task_work(marks: list[dict], tag: str) -> float:
    """Seconds the ranks of job `tag` spent on the task's own work once their process group was up (the
    last rank's end of work less the last rank's ready: what the task itself costs, not the launcher)."""
    job = [m for m in marks if m["tag"] == tag]
    return max(m["done"] for m in job) - max(m["ready"] for m in job)


def packing(n_jobs: int, reps: int) -> Data:
    """hydra-ddpw sweeps of `n_jobs` one-rank jobs: a trivial task, a task that builds DDP, one that
    trains, one after another and side by side on this machine's cores. And the same trivial and DDP
    tasks each in a fresh single process without any launcher (`fresh`), to tell how much of what a DDP
    job costs more than a trivial one is the task's own work."""
    cases: list[Case] = [(key, functools.partial(_packing_once, key, n_jobs)) for key in PACKING_CASES]
    measured = _measure(cases, reps, "packing", warm_up=False)
    rows: Data = {}
    for key, values in measured.items():
        rows[key] = {"error": values} if isinstance(values, str) else {
            metric: _stats(v[metric] for v in values) for metric in values[0]}
    fresh_cases: list[Case] = [(mode, functools.partial(_fresh_once, mode)) for mode in FRESH_MODES]
    fresh = _summary_rows(_measure(fresh_cases, reps, "packing, fresh process"), ("wall", "task_work"))
    return {"n_jobs": n_jobs, "rows": rows, "labels": {key: label for key, (label, _) in PACKING_CASES.items()},
            "fresh": fresh, "fresh_labels": FRESH_MODES}


FRESH_MODES = {
    "trivial": "trivial task, fresh process",
    "ddp": "task building DDP (one step), fresh process",
}
"""The tasks of the packing sweeps timed alone: `python plain_script.py MODE`, a world of one, no launcher."""


def _fresh_once(mode: str) -> dict[str, float]:
    run = run_command(python_argv("plain_script.py", mode))
    _expect_ranks(run, 1)
    return {"wall": run.wall_s, "task_work": _task_work(run.marks, "job0")}

def _packing_once(case: str, n_jobs: int) -> dict[str, float]:
    return _sweep_figures([packing_argv(case, n_jobs)], n_jobs, 1)


# 3. Failure ------------------------------------------------------------------------------------------

def failure(n_ranks: int, reps: int, tools: Sequence[Tool] = FAILURE_TOOLS) -> Data:
    """Rank 1 raises right after its process group is up: seconds from its raise to the command's exit."""
    cases: list[Case] = [(t.key, functools.partial(_failure_once, t, n_ranks)) for t in tools]
    measured = _measure(cases, reps, "failure")
    rows: Data = {}
    for key, values in measured.items():
        if isinstance(values, str):
            rows[key] = {"error": values}
        else:
            rows[key] = {"exit_after_raise": _stats(v["exit_after_raise"] for v in values),
                         "wall": _stats(v["wall"] for v in values),
                         "exit_codes": sorted({v["rc"] for v in values})}
    return {"n_ranks": n_ranks, "rows": rows, "labels": {t.key: t.label for t in tools}}


def _failure_once(tool: Tool, n: int) -> dict[str, float]:
    run = run_command(tool.argv(n, "fail"), expect_ok=False)
    raised = [m["raise"] for m in run.marks if "raise" in m]
    if not raised:
        raise CommandFailed(f"no rank recorded its raise:\n{run.output_tail}")
    return {"exit_after_raise": run.end - raised[0], "wall": run.wall_s, "rc": run.returncode}


# 4. Steady state -------------------------------------------------------------------------------------

def steady(n_ranks: int, reps: int, tools: Sequence[Tool] = STEADY_TOOLS) -> Data:
    """Median all_reduce time per size (rank 0's median over the timed iterations), per tool."""
    settings: Data = {}
    cases: list[Case] = [(t.key, functools.partial(_steady_once, t, n_ranks, settings)) for t in tools]
    measured = _measure(cases, reps, "steady")
    rows: Data = {}
    for key, values in measured.items():
        if isinstance(values, str):
            rows[key] = {"error": values}
        else:
            rows[key] = {mb: _stats(v[mb] for v in values) for mb in values[0]}
    return {"n_ranks": n_ranks, "rows": rows, "labels": {t.key: t.label for t in tools}, **settings}


def _steady_once(tool: Tool, n: int, settings: Data) -> dict[str, float]:
    run = run_command(tool.argv(n, "allreduce"))
    _expect_ranks(run, n)
    rank0 = next(m for m in run.marks if m["rank"] == 0)
    settings.update(warmup=rank0["allreduce_warmup"], iters=rank0["allreduce_iters"])
    return {mb: float(seconds) for mb, seconds in rank0["allreduce_s"].items()}


def training(n_ranks: int, reps: int, tools: Sequence[Tool] = STEADY_TOOLS) -> Data:
    """A DDP training loop in steady state (rank_work mode `loop`): per run, rank 0's median, 10th and
    90th percentile step time; per tool, those over the interleaved runs, and the torch threads a rank had."""
    settings: Data = {}
    cases: list[Case] = [(t.key, functools.partial(_training_once, t, n_ranks, settings)) for t in tools]
    measured = _measure(cases, reps, "training")
    rows = _summary_rows(measured, ("median", "p10", "p90"))
    for key, values in measured.items():
        if not isinstance(values, str):
            rows[key]["threads"] = sorted({v["threads"] for v in values})
    return {"n_ranks": n_ranks, "rows": rows, "labels": {t.key: t.label for t in tools}, **settings}


def _training_once(tool: Tool, n: int, settings: Data) -> dict[str, float]:
    run = run_command(tool.argv(n, "loop"))
    _expect_ranks(run, n)
    rank0 = next(m for m in run.marks if m["rank"] == 0)
    settings.update({key: rank0["loop"][key] for key in ("warmup", "steps", "model")})
    steps = sorted(rank0["step_s"])
    return {"median": statistics.median(steps), "p10": steps[len(steps) // 10],
            "p90": steps[(9 * len(steps)) // 10], "threads": rank0["loop"]["threads"]}


# 5. Controller footprint -----------------------------------------------------------------------------

def footprint(n_ranks: int, reps: int, tools: Sequence[Tool] = FOOTPRINT_TOOLS) -> Data:
    """Peak RSS of the command's own process (the controller) while `n_ranks` ranks run (each holds
    for a second after its work), and whether it had imported torch."""
    cases: list[Case] = [(t.key, functools.partial(_footprint_once, t, n_ranks)) for t in tools]
    measured = _measure(cases, reps, "footprint")
    rows: Data = {}
    for key, values in measured.items():
        if isinstance(values, str):
            rows[key] = {"error": values}
        else:
            seen = {v["imported_torch"] for v in values}
            rows[key] = {"peak_rss_mb": _stats(v["peak_rss_mb"] for v in values),
                         "imported_torch": seen.pop() if len(seen) == 1 else None}
    return {"n_ranks": n_ranks, "rows": rows, "labels": {t.key: t.label for t in tools}}


def _footprint_once(tool: Tool, n: int) -> dict[str, Any]:
    run = run_command(tool.argv(n, "hold"), watch_controller=True, ranks_expected=n)
    if run.peak_rss_mb is None:
        raise CommandFailed("the controller's RSS could not be read")
    return {"peak_rss_mb": run.peak_rss_mb, "imported_torch": run.imported_torch}


# 6. Scale --------------------------------------------------------------------------------------------

def scale(sizes: Sequence[int], reps: int, tool: Tool = HYDRA_DDPW) -> Data:
    """Launch time of this launcher from 1 to many ranks, and its growth per extra rank."""
    data = launch(sizes, reps, tools=(tool,))
    row = data["rows"][tool.key]
    ok = [n for n in sizes if "error" not in row[str(n)]]
    fits = {}
    for metric in ("wall", "ready"):
        points = [(n, row[str(n)][metric]["median"]) for n in ok]
        fits[metric] = {
            "all": slope(points),
            "up_to_8": slope([(n, y) for n, y in points if n <= 8]),
        }
    return {"sizes": list(sizes), "row": row, "label": tool.label, "slope_s_per_rank": fits}


def slope(points: Sequence[tuple[int, float]]) -> float | None:
    """Least-squares slope of y over x (seconds per extra rank); None with fewer than two points."""
    if len(points) < 2:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else None


# 7. Plugin discovery ---------------------------------------------------------------------------------

DISCOVERY_FIGURES = ("discovery_wall", "discovery_cpu", "compose_wall", "compose_cpu")
"""What apps/discovery.py measures, in seconds."""
DISCOVERY_VARIANTS = {
    "without": "every plugin of this environment but hydra-ddpw's",
    "with": "every plugin of this environment, hydra-ddpw's too",
}


def discovery(reps: int) -> Data:
    """Hydra's plugin discovery (and then composing a config) in an app that does not use hydra-ddpw,
    with and without hydra-ddpw's plugin, in fresh processes, interleaved (`reps` pairs).

    How "without" is made: the scan imports every module of the `hydra_plugins` package, which is a
    namespace package spread over every installed plugin's folder. Each run is given a folder holding a
    regular `hydra_plugins` package (which Python takes instead of the namespace's portions) whose
    entries link to every entry of those portions (the first one of each name, as Python resolves them),
    all of them, or all but `hydra_ddpw_launcher`. Everything else (the interpreter, the installed
    packages, hydra-ddpw's own packages) is the same in both, so the difference is the plugin's."""
    with tempfile.TemporaryDirectory(prefix="ddpw-bench-plugins-") as folder:
        mirrors = {variant: _plugins_mirror(Path(folder) / variant, with_ddpw=variant == "with")
                   for variant in DISCOVERY_VARIANTS}
        cases: list[Case] = [(variant, functools.partial(_discovery_once, mirrors[variant]))
                             for variant in DISCOVERY_VARIANTS]
        measured = _measure(cases, reps, "discovery")
    rows = _summary_rows(measured, DISCOVERY_FIGURES)
    for key, values in measured.items():
        if isinstance(values, str):
            continue
        rows[key]["modules_imported"] = max(v["modules_imported"] for v in values)
        rows[key]["ddpw_plugin_scanned"] = all(v["ddpw_plugin_scanned"] for v in values)
        rows[key]["ddpw_conf_imported"] = any(v["ddpw_conf_imported"] for v in values)
        rows[key]["values"] = values
    return {"reps": reps, "rows": rows, "labels": DISCOVERY_VARIANTS, "paired": _paired_extra(rows)}


def _plugins_mirror(folder: Path, with_ddpw: bool) -> Path:
    """`folder`, holding a regular `hydra_plugins` package that links to this environment's plugins."""
    import hydra_plugins

    entries: dict[str, Path] = {}
    for portion in hydra_plugins.__path__:
        if Path(portion).is_dir():
            for entry in sorted(Path(portion).iterdir()):
                if entry.name not in ("__init__.py", "__pycache__"):
                    entries.setdefault(entry.name, entry)
    package = folder / "hydra_plugins"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name, target in entries.items():
        if with_ddpw or name != "hydra_ddpw_launcher":
            (package / name).symlink_to(target)
    return folder


def _discovery_once(mirror: Path) -> dict[str, Any]:
    run = run_command(python_argv("discovery.py", str(mirror)))
    if len(run.marks) != 1:
        raise CommandFailed(f"discovery.py wrote no figures:\n{run.output_tail}")
    return {key: value for key, value in run.marks[0].items() if key != "tag"}


def _paired_extra(rows: Data) -> Data:
    """Median and range, over the interleaved pairs, of what each figure takes more with hydra-ddpw."""
    if any("error" in rows.get(v, {"error": ""}) for v in DISCOVERY_VARIANTS):
        return {}
    pairs = list(zip(rows["with"]["values"], rows["without"]["values"], strict=True))
    return {metric: _stats(w[metric] - wo[metric] for w, wo in pairs) for metric in DISCOVERY_FIGURES}
