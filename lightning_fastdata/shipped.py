"""The configs shipped with the package, and how a ``--config`` value finds one.

No heavy imports: the CLI's help and its config errors answer without loading torch.
"""

from __future__ import annotations

from pathlib import Path

from lightning_fastdata.errors import PathNotFoundError

__all__ = ["CONFIG_DIR", "ConfigNotFoundError", "config_summary", "find_config", "shipped_configs"]

#: The configs shipped with the package: their one copy (``fastdata config NAME`` prints one).
CONFIG_DIR = Path(__file__).parent / "configs"


def shipped_configs() -> list[str]:
    """Names of the configs that ship with the package (``demo``, ``imagefolder``, ...)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def config_summary(name: str) -> str:
    """A shipped config's one-sentence summary: its first comment line, up to the end of its first sentence."""
    first = (CONFIG_DIR / f"{name}.yaml").read_text().splitlines()[0].lstrip("# ").strip()
    end = first.find(". ")
    return first if end < 0 else first[: end + 1]


class ConfigNotFoundError(PathNotFoundError):
    """A ``--config`` that is neither a file nor a shipped config's name."""


def find_config(value: str) -> Path:
    """``value`` as a config file: an existing path as it is, else a shipped config's name (``.yaml`` optional).

    Raises:
        ConfigNotFoundError: If it is neither (the message names the shipped configs).
    """
    path = Path(value)
    if path.is_file():
        return path
    shipped = CONFIG_DIR / (path.name if path.suffix == ".yaml" else f"{path.name}.yaml")
    if path.parent == Path(".") and shipped.is_file():
        return shipped
    raise ConfigNotFoundError(
        f"config {value!r} is not a file, nor one of the configs shipped with lightning_fastdata "
        f"({', '.join(shipped_configs())}). Pass a YAML path or one of those names."
    )
