"""examples/wrapper_notebook.ipynb executed by a real Jupyter kernel (nbclient + ipykernel): functions
defined in cells run on the ranks, with caller_rank the kernel itself trains rank 0's model, and a
resolver registered in the notebook works in the ranks."""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.subprocess  # every test here starts programs or rank processes

NOTEBOOK = Path(__file__).parent.parent / "examples" / "wrapper_notebook.ipynb"


def outputs_of(cell: nbformat.NotebookNode) -> list[str]:
    """The text a code cell showed: its prints and its value."""
    texts = []
    for output in cell.outputs:
        if output.output_type == "stream" and output.name == "stdout":
            texts.append(output.text)
        elif output.output_type == "execute_result":
            texts.append(output.data["text/plain"])
    return texts


def _after(lines: list[str], label: str) -> str:
    """What follows `label` on the line that starts with it."""
    return next(line for line in lines if line.startswith(label))[len(label):]


def test_notebook_runs_wrapper_in_a_real_kernel(tmp_path: Path) -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]

    assert ast.literal_eval(outputs_of(code[1])[-1]) == ["hi from rank 0 of 2", "hi from rank 1 of 2"]
    assert ast.literal_eval(outputs_of(code[2])[-1]) == [0.5, 0.5]

    printed = "".join(outputs_of(code[3])).splitlines()
    losses = ast.literal_eval(_after(printed, "final losses by rank:"))
    weight = ast.literal_eval(_after(printed, "trained weight in this notebook:"))
    assert len(losses) == 2 and max(losses) < 1e-3
    assert abs(weight[0][0] - 2.0) < 0.01 and abs(weight[0][1] + 3.0) < 0.01  # the kernel's own model was trained
    assert ast.literal_eval(outputs_of(code[4])[-1]) == ["HELLO!", "HELLO!"]  # the notebook's own resolver
    assert len(list((tmp_path / "ddpw_logs").iterdir())) == 4  # a log folder per call


def test_hydra_jobs_run_from_a_notebook_with_hydra_zen(tmp_path: Path) -> None:
    # A plain run forks the program, which a kernel's own threads forbid: refused before anything starts, naming
    # what works in a notebook; the same job as a multirun runs.
    launch = ("from hydra_zen import launch, make_config\nimport torch.distributed as dist\n"
              "def task(cfg):\n    return dist.get_world_size() * cfg.a\n"
              "overrides = ['hydra/launcher=ddpw_cpu', 'platform.n_procs_per_node=2']\n")
    run = ("try:\n    launch(make_config(a=3), task, overrides=overrides, version_base='1.3')\n"
           "except SystemExit as error:\n    print('exit', error.code)\n")
    multirun = ("sweep = launch(make_config(a=3), task, overrides=[*overrides, 'a=1,2'], multirun=True, "
                "version_base='1.3')\n[job.return_value for job in sweep[0]]")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code) for code in (launch, run, multirun)])
    NotebookClient(notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                   ).execute()
    refused = "".join(output.get("text", "") for output in notebook.cells[1].outputs)
    assert "exit 1" in refused and "a plain run with a ddpw launcher goes on in a fork" in refused, refused
    assert "in a notebook, whose kernel runs them, run a multirun" in refused, refused
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("rank_*.log"))
    assert ast.literal_eval(outputs_of(notebook.cells[2])[-1]) == [2, 4]
