"""The notebook route (course.ipynb): stored without outputs, and every cell runs on a CPU from outside the kit,
cloning a fresh handout as a hosted runtime clones the course's repository, so it cannot rot."""

import json
import subprocess
import sys

import nbformat
import torch
from nbclient import NotebookClient

from tests.conftest import REPO, needs_solution

NOTEBOOK = REPO / "course.ipynb"


def parameters(notebook) -> dict:
    """The first cell's settings (tagged `parameters`, as papermill expects), as the notebook runs them."""
    cell = notebook.cells[1]
    assert "parameters" in cell.metadata.get("tags", []), "the settings cell lost its tag"
    values = {}
    exec(cell.source, {}, values)
    return values


def test_the_notebook_is_stored_without_outputs_and_with_empty_settings():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    run = [i for i, c in enumerate(notebook.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not run, f"cells {run} of course.ipynb keep outputs: clear them before committing (outputs stay out of the repo)"
    settings = parameters(notebook)
    assert isinstance(settings["KIT_URL"], str) and settings["FLAGS"] == "", settings  # KIT_URL: the instructor's


def with_settings(notebook, **values):
    """The notebook with its settings cell set as papermill would set it."""
    cell = notebook.cells[1]
    cell.source += "".join(f"\n{name} = {value!r}" for name, value in values.items())
    return notebook


@needs_solution(1)
def test_the_notebook_clones_a_fresh_handout_and_runs_every_cell_without_a_gpu(tmp_path):
    """As on a hosted runtime: the notebook starts outside the kit and clones it from KIT_URL (here a handout made
    into a git repository); the kit's packages are installed already, so the pip cell is the one not run."""
    handout = tmp_path / "handout"
    subprocess.run([sys.executable, "-m", "grader.handout", str(handout)], cwd=REPO, check=True, capture_output=True)
    git = ["git", "-c", "user.name=kit", "-c", "user.email=kit@example.org"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "handout"]):
        subprocess.run([*git, *command], cwd=handout, check=True, capture_output=True)
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    notebook = with_settings(nbformat.read(handout / "course.ipynb", as_version=4), KIT_URL=str(handout))
    # Raises CellExecutionError, with the cell and its traceback, if any cell fails.
    NotebookClient(notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(runtime)}}).execute()
    dest = runtime / "kit"
    said = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs)
    assert f"the kit: {dest}" in said, said[:2000]
    for words in ("not implemented yet: see README, Task 1, step 1", "not implemented yet: see README, Task 3, step 1",
                  "$ python -m task6.test", "$ python -m grader", "$ python -m harness.compare"):
        assert words in said, f"{words!r} not in the notebook's output:\n{said[-3000:]}"
    if not torch.cuda.is_available():
        assert "skipped: tasks 2, 4 and 5 need a CUDA GPU" in said
    results = json.loads((dest / "results.json").read_text())  # the grader's cell wrote the student's results
    assert results["score"] == 0, results["score"]
    assert (dest / "compare.csv").is_file(), "the comparison's cell wrote no table"
    shown = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "display_data"]
    assert any("# Results" in o["data"].get("text/markdown", "") for o in shown), "Results.md was not shown"
