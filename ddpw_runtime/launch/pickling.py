"""How everything that travels between hydra-ddpw's processes is pickled (a task and its arguments, a job's config, a
rank's value or error): cloudpickle, with two differences that keep the user's script the user's.

- **The script's own functions and classes travel by reference** (cloudpickle copies all of `__main__`): in every rank
  they are the script's own, as under torchrun or multiprocessing. A process not running the script yet
  (`spawn_method=spawn`, a SLURM node, a CUDA build's starter) imports it as `__mp_main__` first, as multiprocessing's
  spawn does, so its `if __name__ == "__main__":` block does not run again. Functions of a script without that block
  (importing it would run Hydra again), of a notebook or `python -c`, and those defined in the block travel by value.
- **What travels by value keeps its file and line**: code objects go as `marshal` writes them (every process runs the
  same Python), so tracebacks, stack dumps, pdb and profilers name the user's file (not cloudpickle's `<dynamic-code>`).

Data only (no torch): rank processes import it too."""

from __future__ import annotations

import ast
import functools
import io
import marshal
import os
import pickle
import runpy
import sys
import types
from collections import ChainMap
from dataclasses import dataclass
from typing import Any

import cloudpickle

_MAIN_NAMES = ("__main__", "__mp_main__")  # the user's script as a module: where it runs, where another imported it


@dataclass(frozen=True)
class MainScript:
    """The user's script, as another process finds it: a file (`python train.py`) or module (`python -m pkg.train`)."""

    path: str | None = None
    module: str | None = None

    @staticmethod
    def of_this_process() -> MainScript | None:
        """This process's `__main__` (also as `__mp_main__`), when another process may import it (it guards its run
        with `if __name__ == "__main__":`); None for a notebook, `python -c`, or a script without that guard."""
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        path = getattr(main, "__file__", None)
        if not isinstance(path, str) or not _guarded_lines(os.path.abspath(path)):  # importing it would run it
            return None
        if spec is not None and spec.name not in _MAIN_NAMES:
            return MainScript(module=spec.name.removesuffix(".__main__"))
        return MainScript(path=os.path.abspath(path))

    def is_running(self, module: types.ModuleType | None) -> bool:
        """Whether `module` is this script."""
        spec = getattr(module, "__spec__", None)
        if self.module is not None:
            return spec is not None and spec.name.removesuffix(".__main__") == self.module
        path = getattr(module, "__file__", None)
        return isinstance(path, str) and os.path.abspath(path) == self.path

    def enter(self) -> types.ModuleType:
        """This process's `__main__`, made this script first if it is not (imported as `__mp_main__`, as
        multiprocessing's spawn does, its folder on `sys.path`)."""
        current = sys.modules.get("__main__")
        if current is not None and self.is_running(current):
            return current
        module = types.ModuleType("__mp_main__")
        if self.module is not None:
            content = runpy.run_module(self.module, run_name="__mp_main__", alter_sys=True)
        else:
            assert self.path is not None
            folder = os.path.dirname(self.path)
            if folder not in sys.path:
                sys.path.insert(0, folder)
            content = runpy.run_path(self.path, run_name="__mp_main__")
        module.__dict__.update(content)
        sys.modules["__main__"] = sys.modules["__mp_main__"] = module
        return module


@functools.cache
def _guarded_lines(path: str) -> tuple[tuple[int, int], ...]:
    """The first and last lines of each top-level `if __name__ == "__main__":` block of the script at `path`."""
    try:
        with open(path, "rb") as src:
            tree = ast.parse(src.read())
    except (OSError, SyntaxError, ValueError):
        return ()
    blocks = []
    for node in tree.body:
        test = node.test if isinstance(node, ast.If) else None
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            sides = {ast.dump(side) for side in (test.left, *test.comparators)}
            if sides == {ast.dump(ast.Name("__name__", ast.Load())), ast.dump(ast.Constant("__main__"))}:
                blocks.append((node.lineno, node.end_lineno or node.lineno))
    return tuple(blocks)


def _defined_in_the_guard(obj: Any) -> bool:
    """Whether function `obj` is defined inside its script's `if __name__ == "__main__":` block (which another
    process's import does not run)."""
    code = getattr(obj, "__code__", None)
    if not isinstance(code, types.CodeType):
        return False
    path = os.path.abspath(code.co_filename)
    return any(first <= code.co_firstlineno <= last for first, last in _guarded_lines(path))


def main_object(script: MainScript, qualname: str, unwrap: int) -> Any:
    """The object named `qualname` in `script` (made this process's `__main__` first), followed `unwrap` times through
    `__wrapped__` (a task function under `@hydra.main`)."""
    found: Any = script.enter()
    for part in qualname.split("."):
        found = getattr(found, part)
    for _ in range(unwrap):
        found = found.__wrapped__
    return found


def _where_in_main(obj: Any) -> tuple[str, int] | None:
    """`(qualname, unwrap)` that finds `obj` again in this process's `__main__` (see `main_object`), or None."""
    qualname = getattr(obj, "__qualname__", None)
    if not isinstance(qualname, str) or "<" in qualname:  # a lambda or a function's local
        return None
    found: Any = sys.modules.get("__main__")
    for part in qualname.split("."):
        found = getattr(found, part, None)
    for unwrap in range(4):  # a few decorators deep
        if found is obj:
            return qualname, unwrap
        found = getattr(found, "__wrapped__", None)
    return None


def _code(code: types.CodeType) -> tuple[Any, tuple[bytes]]:
    return marshal.loads, (marshal.dumps(code),)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle's pickler with the two differences of the module docstring."""

    dispatch_table = ChainMap({types.CodeType: _code}, cloudpickle.Pickler.dispatch_table)

    def __init__(self, file: io.BytesIO, script: MainScript | None) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.script = script

    def reducer_override(self, obj: Any) -> Any:
        """The script's functions and classes by reference; the rest as cloudpickle pickles it."""
        if self.script is not None and isinstance(obj, (type, types.FunctionType)) and \
                getattr(obj, "__module__", None) in _MAIN_NAMES:
            where = _where_in_main(obj)
            if where is not None and not _defined_in_the_guard(obj):
                return main_object, (self.script, *where)
        return super().reducer_override(obj)


def dumps(obj: Any) -> bytes:
    """`obj` pickled as the module docstring says; `pickle.loads` reads it in any process of the job."""
    out = io.BytesIO()
    _Pickler(out, MainScript.of_this_process()).dump(obj)
    return out.getvalue()
