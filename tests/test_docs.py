"""Every code block of the documentation runs: the docs pages (``docs/*.md``) and the README.

- Python blocks run, page by page in one namespace (a page's blocks build on each other), in a fresh folder that
  holds the data the pages name: ``data/train`` and ``data/val`` (tiny generated JPEG folders) and ``mine.h5``
  (an HDF5 file with keys ``x``/``y``). The Trainer they build is capped at 2 steps (the examples say
  ``max_epochs=90``: the point here is that they run as written, not that they train). A block preceded by
  ``<!-- not run: REASON -->`` is skipped, and must give a reason. A page whose blocks to run are, all of them and
  in order, an earlier page's (the README's quickstart is get-started's) is not run twice: a ResNet-50 step at
  224 px is most of such a run.
- YAML blocks parse; a LightningCLI config among them (``model``/``data`` with ``class_path``) is checked by
  ``fastdata fit --print_config`` with it.
- Shell blocks: every command of ours they show exists (``fastdata COMMAND``, ``bash scripts/X.sh``,
  ``python -m MODULE``, ``.venv/bin/TOOL``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import yaml

from lightning_fastdata.demos import make_image_folder

REPO = Path(__file__).parents[1]
PAGES = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
FENCE = re.compile(r"(?:<!-- not run: (?P<reason>[^>]*?) -->\s*\n)?```(?P<lang>\w+)[^\n]*\n(?P<code>.*?)\n```", re.S)
COMMANDS = {"fit", "validate", "test", "predict", "bench", "demo", "config", "make-data", "convert", "doctor"}


def blocks(page: Path, lang: str) -> list[tuple[str, str | None]]:
    """``(code, reason-not-run)`` of each ``lang`` block of ``page``, in order."""
    return [(m["code"], m["reason"]) for m in FENCE.finditer(page.read_text()) if m["lang"] == lang]


def _run_blocks(page: Path) -> list[str]:
    return [code for code, reason in blocks(page, "python") if reason is None]


def _pages_to_run() -> list[Path]:
    """The pages with Python blocks to run, less those whose blocks are an earlier page's (run once)."""
    seen: set[tuple[str, ...]] = set()
    pages = []
    for page in PAGES:
        run = tuple(_run_blocks(page))
        if run and run not in seen:
            seen.add(run)
            pages.append(page)
    return pages


def test_the_pages_have_code_to_run() -> None:
    assert len(PAGES) > 10
    assert sum(reason is None for p in PAGES for _, reason in blocks(p, "python")) >= 6  # run, not skipped
    # a page left out as a duplicate runs exactly the blocks of one that is run
    run = {tuple(_run_blocks(p)) for p in _pages_to_run()}
    assert all(tuple(_run_blocks(p)) in run for p in PAGES if _run_blocks(p))
    for page in PAGES:
        for _, reason in blocks(page, "python"):
            assert reason is None or reason.strip(), f"{page.name}: a block marked not run must say why"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    make_image_folder(tmp_path / "data" / "train", num_classes=3, per_class=6, size=(96, 72))
    make_image_folder(tmp_path / "data" / "val", num_classes=3, per_class=2, size=(96, 72), seed=1)
    with h5py.File(tmp_path / "mine.h5", "w") as f:
        f["x"] = np.random.default_rng(0).integers(0, 255, (12, 3, 40, 40), dtype=np.uint8)
        f["y"] = np.arange(12) % 3
    monkeypatch.chdir(tmp_path)
    import lightning.pytorch as pl

    init = pl.Trainer.__init__

    def capped(self: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        kwargs.update(max_epochs=1, max_steps=2, limit_val_batches=1, logger=False, enable_progress_bar=False)
        init(self, *args, **kwargs)

    monkeypatch.setattr(pl.Trainer, "__init__", capped)
    return tmp_path


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", _pages_to_run(), ids=lambda p: p.name)
@pytest.mark.slow
def test_python_blocks_run(page: Path, workdir: Path) -> None:
    import lightning.pytorch as pl

    namespace: dict[str, Any] = {"__name__": "__docs__", "pl": pl}
    for code, reason in blocks(page, "python"):
        if reason is None:
            exec(compile(code, f"{page.name} block", "exec"), namespace)  # noqa: S102 - the page's own example


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "yaml")], ids=lambda p: p.name)
@pytest.mark.slow
def test_yaml_blocks_parse_and_configs_load(page: Path, workdir: Path) -> None:
    for k, (code, _) in enumerate(blocks(page, "yaml")):
        config = yaml.safe_load(code)
        if isinstance(config, dict) and "data" in config and "class_path" in config["data"]:
            path = workdir / f"config{k}.yaml"
            path.write_text(code)
            out = subprocess.run(
                [str(REPO / ".venv/bin/fastdata"), "fit", "--config", str(path), "--print_config"],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr[-2000:]
            assert config["data"]["class_path"] in out.stdout


def _check_command(line: str) -> str | None:
    """Why ``line`` names a command of ours that does not exist, or ``None``."""
    words = shlex.split(line, comments=True)
    while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value prefixes
        words = words[1:]
    if not words:
        return None
    tool = words[0]
    if tool.endswith("fastdata"):
        if len(words) > 1 and not words[1].startswith("-") and words[1] not in COMMANDS:
            return f"no command fastdata {words[1]}"
    elif tool == "bash" and len(words) > 1 and words[1].endswith(".sh"):
        if not (REPO / words[1]).is_file():
            return f"no script {words[1]}"
    elif tool.endswith("python") and words[1:2] == ["-m"]:
        module = words[2]
        if module.startswith(("lightning_fastdata", "benchmarks")) and importlib.util.find_spec(module) is None:
            return f"no module {module}"
    elif tool.startswith(".venv/bin/"):
        # the docs' .venv is setup.sh's; the tests run from whatever environment runs pytest: its own bin folder
        name = tool.removeprefix(".venv/bin/")
        if shutil.which(name, path=str(Path(sys.executable).parent)) is None:
            return f"no tool {name} beside this environment's Python ({sys.executable})"
    return None


def test_shell_commands_exist() -> None:
    sys.path.insert(0, str(REPO))  # benchmarks/ is a package of the checkout
    missing = []
    for page in PAGES:
        for code, _ in blocks(page, "bash"):
            for line in code.replace("\\\n", " ").splitlines():
                for part in re.split(r"&&|\|\||;|\|", line):
                    why = _check_command(part.strip())
                    if why:
                        missing.append(f"{page.name}: {part.strip()!r}: {why}")
    assert not missing, "\n".join(missing)
    assert _check_command("fastdata nosuch") and _check_command("bash scripts/nosuch.sh")  # the check can fail
    assert _check_command(".venv/bin/nosuch-tool --version")


#: The longest code line the site shows whole at a 1280 px window (scripts/docs_clipping.py measured it in Chromium).
CODE_WIDTH = 100


def test_code_blocks_fit_the_page() -> None:
    """No code line longer than the site shows without a scroll bar (its end would be hidden)."""
    long = [
        f"{page.name}: {line[:60]!r}... ({len(line)} characters)"
        for page in PAGES
        for m in re.finditer(r"```[^\n]*\n(.*?)\n```", page.read_text(), re.S)
        for line in m.group(1).splitlines()
        if len(line) > CODE_WIDTH
    ]
    assert not long, f"code lines over {CODE_WIDTH} characters (wrap them):\n" + "\n".join(long)


def test_readme_is_short_and_points_to_the_site() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "bash scripts/docs.sh" in readme and "docs/_build/html/index.html" in readme
    assert not re.search(r"\d+ passed", readme)  # no test counts that go stale
    assert os.path.exists(REPO / "docs" / "benchmark.png")


def test_published_figures_are_the_latest_results(tmp_path: Path) -> None:
    """The README's and the guides' figures are the results files' (benchmarks/figures.py), and a page whose figure
    is not is caught; the pages type no measured ratio by hand."""
    from benchmarks import figures

    assert figures.check() == [], "run: python -m benchmarks.figures --write"
    stale = tmp_path / "page.md"
    stale.write_text(
        "x <!--fig:folder.vs_baseline-->9.9x<!--/fig--> y\n<!--figures:s3-table-->\nold\n<!--/figures-->\n"
    )
    found = figures.check([str(stale)])
    assert len(found) == 2 and "folder.vs_baseline is '9.9x'" in found[0] and "s3-table" in found[1]
    with pytest.raises(KeyError, match="no figure 'nosuch'"):
        figures.render("<!--fig:nosuch-->1x<!--/fig-->")
    # check() above also found no ratio typed by hand in any page; the rule itself:
    typed = figures.hand_typed(
        "3.1x faster, <!--fig:a-->2.5x<!--/fig-->, 0.94x\n<!--figures:t-->\n| 18x |\n<!--/figures-->\n```\n2.8x\n```"
    )
    assert typed == ["3.1x", "0.94x"], typed


def test_every_public_name_documents_its_arguments() -> None:
    import dataclasses
    import inspect

    import lightning_fastdata

    missing = {}
    for name in lightning_fastdata.__all__:
        obj = getattr(lightning_fastdata, name)
        # a dataclass's fields may be documented by the class it extends
        doc = "\n".join(inspect.getdoc(c) or "" for c in getattr(obj, "__mro__", [obj])[:2])
        assert doc, f"{name} has no docstring"
        params = inspect.signature(obj.__init__ if isinstance(obj, type) else obj).parameters.values()
        names = [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if dataclasses.is_dataclass(obj):
            names = [f.name for f in dataclasses.fields(obj)]
        undocumented = [n for n in names if not re.search(rf"^\s*{n}\b[^:\n]*:", doc, re.M)]
        if undocumented:
            missing[name] = undocumented
    assert not missing, missing


def test_the_api_page_has_every_public_name() -> None:
    """docs/api.md says it holds every name of ``__all__`` (three exported classes were once missing from it)."""
    import lightning_fastdata

    api = (REPO / "docs" / "api.md").read_text()
    missing = [n for n in lightning_fastdata.__all__ if not re.search(rf"lightning_fastdata\.{n}\b", api)]
    assert not missing, f"add to docs/api.md: {missing}"
