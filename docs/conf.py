"""Sphinx configuration: MyST Markdown pages, the API reference from the docstrings, the notebooks rendered."""

from __future__ import annotations

import os

import lightning_fastdata

project = "lightning-fastdata"
author = "the lightning-fastdata authors"
release = lightning_fastdata.__version__
version = release

extensions = [
    "myst_nb",  # Markdown pages (MyST) and the notebooks, executed at build time
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # Google-style docstrings
    "sphinx.ext.viewcode",
]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
myst_heading_anchors = 4  # GitHub-style anchors for links such as resume.md#exact-mid-epoch-resume
myst_enable_extensions = ["colon_fence"]

# Notebooks: executed on every build (in a temporary folder, so their generated data lands nowhere here); a cell
# that fails fails the build. scripts/test.sh builds without running them (FASTDATA_DOCS_RUN_NOTEBOOKS=0), since
# its tests/test_notebooks.py runs each one anyway, with more checks: once per CI run instead of twice.
nb_execution_mode = "off" if os.environ.get("FASTDATA_DOCS_RUN_NOTEBOOKS") == "0" else "force"
nb_execution_in_temp = True
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_output_stderr = "remove"  # progress bars (tqdm writes to stderr): one box per refresh otherwise

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# A broken reference fails the build (scripts/docs.sh runs with -W). References to other projects' objects are
# printed as text: the site is built offline, without their inventories.
nitpicky = True
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(torch|torchvision|torchdata|lightning|numpy|np|nn|h5py|PIL|obstore|typing|collections|pathlib|os|pickle|io|abc|tarfile)\b.*",
    ),
    (r"py:.*", r"(Any|Callable|Iterator|Iterable|Sequence|Mapping|Literal|Path|PathLike|Tensor|Generator)"),
    (r"py:class", r"(int|float|str|bool|bytes|dict|list|tuple|None|optional|callable|type|object)"),
    # type aliases and torch's Dataset as written in signatures; private helpers and type variables
    (r"py:class", r"(Layout|HDF5Layout|BatchTransport|Dataset|Box|Source|SampleKey|ScoreKind|Limit|DeviceAugment|DetectionLayoutName|DetectionRecipe)"),
    (r"py:.*", r".*\._\w+.*|_\w+|.*\.T"),
    # a class's own attributes named in its docstring (not documented as separate entries)
    (r"py:attr", r"\w+"),
]

html_theme = "pydata_sphinx_theme"
html_title = "lightning-fastdata"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "show_nav_level": 2,
    "secondary_sidebar_items": [],  # no right-hand column: the article gets its width (code lines unclipped)
}
html_static_path = ["_static"]
html_css_files = ["wide.css"]  # the article as wide as the window allows: code lines are not clipped
