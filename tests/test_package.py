"""The package's structure: no import cycles, no function-level imports of private names, ``__all__`` everywhere."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "lightning_fastdata"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text()) for p in PACKAGE.rglob("*.py")}


def imported(tree: ast.Module, top_level_only: bool) -> set[str]:
    """Package modules a module imports (``from pkg import name`` counts ``pkg.name`` when that is a module)."""
    names = set(modules_cache)
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_fastdata"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("lightning_fastdata"))
    return found


modules_cache = modules()


def test_no_import_cycles() -> None:
    """Counting imports inside functions too: a lazy import that closes a loop is still a tangle."""
    graph = {name: imported(tree, top_level_only=False) & set(modules_cache) for name, tree in modules_cache.items()}
    graph = {name: {m for m in deps if m != name} for name, deps in graph.items()}
    done: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in done:
                visit(nxt, [*path, nxt])
        done.add(node)

    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles[:5])


def test_top_level_parts_import_each_other_in_one_direction_only() -> None:
    """``loading``, ``datasets``, ``datamodules``, ``measure``, ``diagnose``, ``bench``...: no two import each other.

    Before: ``diagnose`` imported ``bench`` and ``bench.scale`` imported ``diagnose``; ``datasets.cache`` imported
    ``convert``, which imported ``datasets``. Names taken from the package root count as their modules'.
    """
    import lightning_fastdata

    def part(module: str) -> str | None:
        pieces = module.split(".")
        return pieces[1] if len(pieces) > 1 and pieces[1] != "__init__" else None

    edges: set[tuple[str, str]] = set()
    for name, tree in modules_cache.items():
        source = part(name)
        if source is None:
            continue
        targets = set(imported(tree, top_level_only=False))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "lightning_fastdata":
                targets.update(lightning_fastdata._EXPORTS.get(a.name, "") for a in node.names)
        edges.update((source, t) for t in map(part, targets) if t is not None and t != source)
    both_ways = sorted((a, b) for a, b in edges if (b, a) in edges and a < b)
    assert not both_ways, f"top-level parts that import each other: {both_ways}"
    assert ("bench", "measure") in edges and ("diagnose", "measure") in edges  # the tool tier's one direction


def test_no_python_source_in_strings_run_by_a_subprocess() -> None:
    """No ``python -c CODE`` in the package: code in strings is invisible to ruff and mypy (``python -m`` instead)."""
    offenders = []
    for name, tree in modules_cache.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.List, ast.Tuple)) and any(
                isinstance(e, ast.Constant) and e.value == "-c" for e in node.elts
            ):
                offenders.append(f"{name}:{node.lineno}")
    assert not offenders, offenders


def test_no_package_module_is_over_500_lines() -> None:
    sizes = {module_name(p): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    big = {name: n for name, n in sizes.items() if n > 500}
    assert not big, f"split these by job: {big}"


def test_no_function_level_imports_of_private_names() -> None:
    offenders = []
    for name, tree in modules_cache.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("lightning_fastdata"):
                        private = [a.name for a in inner.names if a.name.startswith("_")]
                        if private:
                            offenders.append(f"{name}.{node.name}: {private}")
    assert not offenders, offenders


def test_every_public_module_has_all() -> None:
    missing = [
        name
        for name, tree in modules_cache.items()
        if not name.rsplit(".", 1)[-1].startswith("_")
        and not (PACKAGE.parent / name.replace(".", "/")).is_dir()  # a sub-package's __init__
        and not any(
            isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets) for n in tree.body
        )
    ]
    assert not missing, missing


def test_importing_a_submodule_does_not_import_lightning() -> None:
    """The package's names load on first use: a scan in a fresh process or a spawn worker skips Lightning."""
    code = (
        "import sys; import lightning_fastdata.loading.index.store; import lightning_fastdata as lf; "
        "assert 'lightning' not in sys.modules, 'lightning imported'; "
        "assert lf.ImageFolderDataModule.__name__ == 'ImageFolderDataModule' and 'lightning' in sys.modules; "
        "assert set(lf.__all__) <= set(dir(lf))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


ROOMS = ("index", "storage", "jpeg", "transport", "augment")
#: Which rooms of ``loading/`` a room may import (a room may always import ``loading``'s loose modules).
ROOM_MAY_IMPORT = {
    "index": set(),
    "storage": {"index"},
    "jpeg": {"index", "storage"},
    "transport": set(),
    "augment": set(),
}


def room(module: str) -> str | None:
    pieces = module.split(".")
    if len(pieces) > 3 and pieces[1] == "loading" and pieces[2] in ROOMS:
        return pieces[2]
    return None


def test_the_rooms_of_loading_import_each_other_in_one_direction_only() -> None:
    """``index`` <- ``storage`` <- ``jpeg``; ``transport`` and ``augment`` alone; the loose modules import no room."""
    wrong = []
    for name, tree in modules_cache.items():
        source = room(name)
        for target in imported(tree, top_level_only=False):
            to = room(target)
            if to is None or to == source:
                continue
            loose = source is None and name.startswith("lightning_fastdata.loading.")
            if loose or (source is not None and to not in ROOM_MAY_IMPORT[source]):
                wrong.append(f"{name} -> {target}")
    assert not wrong, wrong


def test_the_training_path_never_imports_the_testing_package() -> None:
    training = ("loading", "datasets", "datamodules", "callbacks", "models", "hparams", "errors")
    wrong = [
        f"{name} -> {target}"
        for name, tree in modules_cache.items()
        if name.split(".")[1:2] and name.split(".")[1] in training
        for target in imported(tree, top_level_only=False)
        if target.startswith("lightning_fastdata.testing")
    ]
    assert not wrong, wrong


def test_no_caller_asks_which_storage_backend_it_has() -> None:
    """``isinstance(x, ObjectStorage)`` outside ``loading/storage/`` means the contract lacks a method."""
    offenders = []
    for name, tree in modules_cache.items():
        if name.startswith("lightning_fastdata.loading.storage."):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance" and len(node.args) == 2:
                kinds = ast.dump(node.args[1])
                if "ObjectStorage" in kinds or "LocalStorage" in kinds:
                    offenders.append(f"{name}:{node.lineno}")
    assert not offenders, offenders


def test_every_module_is_on_the_architecture_page() -> None:
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    missing = [
        str(p.relative_to(PACKAGE))
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "__init__.py" and f"`{p.relative_to(PACKAGE)}`" not in page
    ]
    assert not missing, f"add these to docs/architecture.md, a line each: {missing}"


def _writes(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, what)`` of each class swap (``x.__class__ = ...``), write to ``os.environ``, attribute set on a built
    dataset (``dataset.x = ...``) or on a caught exception (``err.x = ...``) in ``tree``."""
    found = []
    caught = {node.name for node in ast.walk(tree) if isinstance(node, ast.ExceptHandler) and node.name}
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for t in targets:
            if isinstance(t, ast.Attribute) and t.attr == "__class__":
                found.append((node.lineno, "__class__ assignment"))
            if isinstance(t, ast.Subscript) and ast.unparse(t.value) == "os.environ":
                found.append((node.lineno, "os.environ write"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = ast.unparse(node.func.value)
            if owner == "os.environ" and node.func.attr in ("update", "pop", "setdefault", "clear", "popitem"):
                found.append((node.lineno, "os.environ write"))
            if owner == "os" and node.func.attr in ("putenv", "unsetenv"):
                found.append((node.lineno, "os.environ write"))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr" and len(node.args) >= 2:
            if isinstance(node.args[1], ast.Constant) and node.args[1].value == "__class__":
                found.append((node.lineno, "__class__ assignment"))
        for t in targets:  # another object's attributes: a dataset's after it was built, a caught exception's
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                if t.value.id == "dataset" or t.value.id.endswith("_dataset"):
                    found.append((node.lineno, "dataset attribute write"))
                if t.value.id in caught:
                    found.append((node.lineno, "caught exception attribute write"))
    return found


def test_no_class_swaps_and_no_environment_writes_in_the_package() -> None:
    """The package builds objects of the class it wants (no ``__class__`` swap on a user's object) and leaves the
    process environment alone (object storage hands obstore its configuration)."""
    found = {name: _writes(tree) for name, tree in modules_cache.items()}
    swaps = {name: rows for name, rows in found.items() if any(w == "__class__ assignment" for _, w in rows)}
    environ = {name for name, rows in found.items() if any(w == "os.environ write" for _, w in rows)}
    assert not swaps, swaps
    assert not environ, environ
    others = {name: rows for name, rows in found.items() if any(w.endswith("attribute write") for _, w in rows)}
    assert not others, others
    # the check itself finds every kind
    probe = ast.parse("import os\nx.__class__ = int\nsetattr(y, '__class__', str)\nos.environ['A'] = '1'\n"
                      "del os.environ['B']\nos.environ.update({})\ntrain_dataset.lookahead = 1\n"
                      "try:\n    pass\nexcept OSError as err:\n    err.retries = 3\n")  # fmt: skip
    assert sorted(line for line, _ in _writes(probe)) == [2, 3, 4, 5, 6, 7, 11]


def test_the_package_is_the_product_and_never_imports_the_lab() -> None:
    """The wheel keeps what a user runs on their own data and machine; the lab (``benchmarks/``: the GPU check,
    the scale, matrix, peers and S3 suites, the local S3 server and its fault proxy) stays in the repository, and no
    package module imports it (an installed package has no ``benchmarks``)."""
    bench = sorted(p.stem for p in (PACKAGE / "bench").glob("*.py"))
    assert bench == [
        "__init__",
        "cache",
        "callback",
        "captions",
        "detection",
        "hdf5",
        "loaders",
        "predict",
        "recipe",
        "scratch",
        "segmentation",
        "shards",
    ]
    assert sorted(p.stem for p in (PACKAGE / "testing").glob("*.py")) == ["__init__", "trainer"]
    lab = {
        name
        for name, tree in modules_cache.items()
        for node in ast.walk(tree)
        if (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "benchmarks")
        or (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "benchmarks" for a in node.names))
    }
    assert not lab, f"package modules importing the lab: {sorted(lab)}"
    assert (PACKAGE.parent / "benchmarks" / "gpu.py").is_file() and (PACKAGE.parent / "benchmarks" / "s3.py").is_file()


def test_augmentation_lives_in_one_room() -> None:
    """``augment/`` holds every augmentation module and imports only ``errors``, ``_ext.native`` (the compiled
    kernels) and itself; no module elsewhere is about augmentation, and torchvision's private names are reached
    through its one adapter."""
    outside = [
        name
        for name in modules_cache
        if "augment" in name.split(".")[-1] and not name.startswith(f"{PACKAGE.name}.augment")
    ]
    assert not outside, outside
    allowed = {"lightning_fastdata.errors", "lightning_fastdata._ext", "lightning_fastdata._ext.native"}
    for name, tree in modules_cache.items():
        if name.startswith("lightning_fastdata.augment"):
            stray = {m for m in imported(tree, top_level_only=False) if not m.startswith("lightning_fastdata.augment")}
            assert stray <= allowed, (name, stray - allowed)
            private = [
                node.module
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("torchvision")
                and any(part.startswith("_") for part in (node.module or "").split("."))
            ]
            assert not private or name.endswith("torchvision_internals"), (name, private)


_LIBRARIES = ("torch", "torchvision", "torchdata", "lightning")
#: The one adapter per library through which its private names are reached (Lightning's: its pinned behaviours).
_INTERNALS_ADAPTERS = {
    "lightning_fastdata.loading.transport.torch_internals",
    "lightning_fastdata.loading.transport.torchdata_internals",
    "lightning_fastdata.augment.torchvision_internals",
    "lightning_fastdata.datamodules.lightning_compat",
}


def _private_uses(tree: ast.Module) -> list[str]:
    """Private names of torch, torchvision, torchdata or Lightning a module imports or reads as attributes."""
    aliases: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in _LIBRARIES:
                    aliases.add((a.asname or a.name).split(".")[0])
                    if any(p.startswith("_") for p in a.name.split(".")):
                        found.append(a.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _LIBRARIES:
            module = node.module or ""
            private_module = any(p.startswith("_") for p in module.split("."))
            for a in node.names:
                if private_module or (a.name.startswith("_") and not a.name.startswith("__")):
                    found.append(f"{module}.{a.name}")
                else:
                    aliases.add(a.asname or a.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            root: ast.expr = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in aliases:
                found.append(f"{root.id}...{node.attr}")
    return found


def test_private_names_of_the_libraries_are_reached_through_their_one_adapter() -> None:
    """torch's, torchvision's, torchdata's and Lightning's private names (imported, or read off a module) appear
    only in the adapter modules the architecture page's internals table lists."""
    outside = {
        name: uses
        for name, tree in modules_cache.items()
        if name not in _INTERNALS_ADAPTERS and (uses := _private_uses(tree))
    }
    assert not outside, outside
    probe = ast.parse("import torch\nfrom torchvision.transforms.v2 import _utils\nx = torch._C._storage_Use_Count\n")
    assert _private_uses(probe) == ["torchvision.transforms.v2._utils", "torch..._storage_Use_Count", "torch..._C"]
    table = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    for adapter in _INTERNALS_ADAPTERS:
        assert adapter.removeprefix("lightning_fastdata.").replace(".", "/") + ".py" in table, adapter


def test_the_sources_know_no_target() -> None:
    """``sources/`` reads images and payloads for any target: it imports no target room, nor a DataModule.

    So a new target kind (boxes) is its own room and touches no source. What a source may import: the loading rooms,
    the geometry, the shared dataset pieces, the errors, and itself.
    """
    allowed = ("sources", "loading", "augment", "datasets", "errors")
    wrong = []
    for name, tree in modules_cache.items():
        if not name.startswith("lightning_fastdata.sources"):
            continue
        for target in imported(tree, top_level_only=False):
            part = target.split(".")[1] if "." in target else ""
            if part not in allowed:
                wrong.append(f"{name} -> {target}")
    assert not wrong, wrong


def test_no_room_holds_more_than_12_modules() -> None:
    """A room (a package folder) of at most 12 modules, its ``__init__`` not counted: one can find one's way in it."""
    rooms: dict[Path, int] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            rooms[path.parent] = rooms.get(path.parent, 0) + 1
    crowded = {str(r.relative_to(PACKAGE.parent)): n for r, n in rooms.items() if n > 12}
    assert not crowded, f"rooms over 12 modules: {crowded}"
