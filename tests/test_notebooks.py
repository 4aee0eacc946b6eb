"""Both notebooks run top to bottom (on small generated data); a cell that errors fails the test."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

# the notebook runner is a dev extra; the GPU machine's image (scripts/gpu-check.sh runs `pytest -m cuda` there)
# lacks it, and a collection error there would stop the CUDA tests
nbformat = pytest.importorskip("nbformat")
NotebookClient = pytest.importorskip("nbclient").NotebookClient

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))

pytestmark = pytest.mark.slow  # executes every notebook: minutes


def test_both_notebooks_exist() -> None:
    assert {p.name for p in NOTEBOOKS} == {"quickstart.ipynb", "convert_and_cache.ipynb"}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notebook = nbformat.read(path, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), "commit cleared outputs"
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the kernel (and what it starts) makes its temporary files here
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    # a notebook run by users in a loop must not fill their /tmp: it removes what it wrote
    # (torch's own compile cache, torchinductor_<user>, is made on import and meant to be kept and reused)
    left = [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_")]
    deadline = time.monotonic() + 20
    while left and all(name.startswith("pymp-") for name in left) and time.monotonic() < deadline:
        # multiprocessing's own folder, removed by its process's exit handler: the kernel may still be exiting
        time.sleep(0.5)
        left = [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_")]
    assert not left, "the notebook left files in the temporary folder"
    images = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert images, "the notebook should draw its figures"
