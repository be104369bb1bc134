"""The runtime's layout rules, read off the code: which process each subpackage runs in decides what it
may import.

- `ddpw_runtime.procs` holds one module per kind of process (its entry point at its top); only those modules,
  and `launch/signals.py` that they call, change how a process handles a signal.
- The controller library (`ddpw_runtime.launch`, `.nodes`), which every supervising process uses, imports no
  Hydra, OmegaConf or submitit, no SLURM module, no Hydra job module and no process module (but the rank
  starter's handle, which forks into the starter's entry point).
- The controller side (every module but those a rank runs), `ddpw_conf` and the Hydra plugin never import torch
  at import time (the controller of a sweep stays light; Hydra imports the plugin at every start-up).
- Rank code (`ddpw_runtime.rank` and the rank's process module) imports only the data modules of the
  controller side.
- Only the Hydra plugin and the SLURM node's process import `ddpw_runtime.slurm`.
- No import circle among the package's modules, imports inside functions (lazy ones) and `if TYPE_CHECKING:` ones
  (which only type checkers read) included.
- A handful of modules at the top of `ddpw_runtime`.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "ddpw_runtime"

DATA_MODULES = {
    "ddpw_runtime.launch.bounds",
    "ddpw_runtime.launch.plan",
    "ddpw_runtime.launch.payload",
    "ddpw_runtime.launch.pickling",
    "ddpw_runtime.launch.process_state",
    "ddpw_runtime.launch.records",
}
"""The controller-side modules that hold only data (what goes to a rank and comes back from it)."""

TOP_LEVEL = {"__init__.py", "_compat.py", "errors.py", "wrapper.py"}

RANK_CODE = ("ddpw_runtime.rank", "ddpw_runtime.procs.rank")
"""What runs in a rank: the helpers a task calls, and the rank's process."""

LIBRARY = ("ddpw_runtime.launch", "ddpw_runtime.nodes")
"""The controller library every supervising process uses."""

PROCESS_STARTERS = {"ddpw_runtime.launch.starter": "ddpw_runtime.procs.starter"}
"""The one library module that imports a process module: the rank starter's handle forks into its entry point."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def python_files(*folders: Path) -> list[Path]:
    return sorted(p for folder in folders for p in folder.rglob("*.py"))


def imported(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it (at the top or inside a function)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


CONTROLLER = [
    module_name(p) for p in python_files(RUNTIME, ROOT / "ddpw_conf", ROOT / "hydra_plugins")
    if not module_name(p).startswith(RANK_CODE)
]


@pytest.mark.subprocess
def test_the_controller_side_never_imports_torch_at_import_time() -> None:
    code = (
        "import importlib, json, sys\n"
        f"for name in {CONTROLLER!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'count': len(" + repr(CONTROLLER) + ")}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.splitlines()[-1])
    assert report == {"torch": False, "count": len(CONTROLLER)}
    assert "ddpw_runtime.launch.supervisor" in CONTROLLER and "ddpw_runtime.procs.slurm_node" in CONTROLLER


def test_rank_code_imports_only_the_data_modules_of_the_controller_side() -> None:
    controller = ("ddpw_runtime.launch", "ddpw_runtime.hydra_jobs", "ddpw_runtime.slurm", "ddpw_runtime.nodes",
                  "ddpw_runtime.procs")
    paths = [*python_files(RUNTIME / "rank"), RUNTIME / "procs" / "rank.py"]
    for path in paths:
        used = {name for name in imported(path) if name.startswith(controller)}
        modules = {name for name in used if name in DATA_MODULES or not any(name.startswith(d) for d in DATA_MODULES)}
        modules -= {"ddpw_runtime.procs"}  # (the package of the rank's own module)
        assert modules <= DATA_MODULES, f"{module_name(path)} imports {sorted(modules - DATA_MODULES)}"


def test_only_the_hydra_plugin_and_the_slurm_node_import_the_slurm_runtime() -> None:
    for path in python_files(RUNTIME, ROOT / "ddpw_conf"):
        name = module_name(path)
        if name.startswith("ddpw_runtime.slurm") or name == "ddpw_runtime.procs.slurm_node":
            continue
        assert not any(i.startswith("ddpw_runtime.slurm") for i in imported(path)), f"{name} imports slurm/"
    plugin = ROOT / "hydra_plugins" / "hydra_ddpw_launcher" / "slurm_launcher.py"
    assert "ddpw_runtime.slurm.submit" in imported(plugin)


def test_a_handful_of_modules_at_the_top() -> None:
    assert {p.name for p in RUNTIME.glob("*.py")} == TOP_LEVEL
    assert {p.name for p in RUNTIME.iterdir() if p.is_dir() and not p.name.startswith("__")} == {
        "launch", "rank", "hydra_jobs", "slurm", "nodes", "procs"
    }


def test_the_controller_library_imports_no_hydra_no_slurm_and_no_process() -> None:
    for path in python_files(*(RUNTIME / name.rpartition(".")[2] for name in LIBRARY)):
        name = module_name(path)
        outside = {i for i in _run_time_imports(path) if i.split(".")[0] in ("hydra", "omegaconf", "submitit")
                   or i.startswith(("ddpw_runtime.slurm", "ddpw_runtime.hydra_jobs", "ddpw_runtime.procs"))}
        if name in PROCESS_STARTERS:  # `from ddpw_runtime.procs.starter import serve` counts as all three names
            started = PROCESS_STARTERS[name]
            outside = {i for i in outside
                       if i not in (started, "ddpw_runtime.procs") and not i.startswith(started + ".")}
        assert not outside, f"{name} imports {sorted(outside)}"
    assert "ddpw_runtime.procs.starter" in _run_time_imports(RUNTIME / "launch" / "starter.py")


SIGNAL_HANDLERS = ("signal.signal(", "faulthandler.register(", "signal.set_wakeup_fd(")


def test_only_the_process_modules_change_how_a_signal_is_handled() -> None:
    """A handler is a process's own: installed where that process's entry point is (or through the one helper
    module they call), never by library code that runs in whichever process calls it."""
    own = [p for p in python_files(RUNTIME / "procs") if p.name != "__init__.py"]
    assert {p.stem for p in own} >= {"sweep", "job", "run_supervisor", "starter", "rank", "slurm_node", "caller"}
    for path in python_files(RUNTIME, ROOT / "ddpw_conf", ROOT / "hydra_plugins"):
        if path in own or path == RUNTIME / "launch" / "signals.py":
            continue
        text = path.read_text()
        assert not any(call in text for call in SIGNAL_HANDLERS), f"{module_name(path)} installs a signal handler"


def test_the_schemas_never_import_the_runtime_nor_read_the_command_line() -> None:
    """`ddpw_conf` is the bottom layer: the runtime and the plugin import it, never the other way round,
    and importing it does nothing but define the schemas (no look at `sys.argv`)."""
    for path in python_files(ROOT / "ddpw_conf"):
        assert not any(i.startswith("ddpw_runtime") for i in imported(path)), f"{module_name(path)} imports the runtime"
        assert "sys.argv" not in path.read_text(), f"{module_name(path)} reads the command line"


def _run_time_imports(path: Path, type_checking: bool = False) -> set[str]:
    """The package modules `path` imports when it runs: at its top or inside a function (lazy imports), not in an
    `if TYPE_CHECKING:` block (read by type checkers only) unless `type_checking`. A name `from package import
    name` counts as the module `package.name` when there is one, else as `package`."""
    tree = ast.parse(path.read_text())
    hidden = set() if type_checking else {
        id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
        and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING" for node in ast.walk(block)}
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *filter(None, [base])])
            names.update(f"{base}.{alias.name}" for alias in node.names)
            names.add(base)
    return names


def test_no_import_circle_among_the_packages_modules_lazy_imports_included() -> None:
    """Each module's imports, those inside functions and those only type checkers read too, never lead back to it."""
    paths = {module_name(p): p for p in python_files(RUNTIME, ROOT / "ddpw_conf", ROOT / "hydra_plugins")}
    edges: dict[str, set[str]] = {}
    for name, path in paths.items():
        targets = set()
        for imported_name in _run_time_imports(path, type_checking=True):
            while imported_name and imported_name not in paths:
                imported_name = imported_name.rpartition(".")[0]
            # importing a module also imports its package's __init__, which is no edge back to a module below it
            if imported_name and imported_name != name and not name.startswith(imported_name + "."):
                targets.add(imported_name)
        edges[name] = targets

    def reaches(start: str, goal: str) -> list[str] | None:
        seen, todo = {start}, [[start]]
        while todo:
            route = todo.pop()
            for nxt in sorted(edges[route[-1]]):
                if nxt == goal:
                    return [*route, nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append([*route, nxt])
        return None

    circles = [route for name in sorted(edges) if (route := reaches(name, name))]
    assert not circles, "import circle: " + " -> ".join(circles[0])
