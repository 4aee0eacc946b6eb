"""``fastdata doctor``: measure a user's own data and machine, and say (and write) the fastest setup.

One module per job: :mod:`.probe` (the data and the storage), :mod:`.options` (build each option for a sample),
:mod:`.timing` (the time budget, one rank's CPUs), :mod:`.verdict` (which option, how many workers, why),
:mod:`.report` (the report, its text, the config), :mod:`.run` (``doctor()``), :mod:`.main` (the command line).
"""

from typing import TYPE_CHECKING, Any

# main: eager (light: the measuring parts are imported when it runs), and a submodule's name too, which a lazy
# attribute could not keep once the submodule is imported
from lightning_fastdata.diagnose.main import main

if TYPE_CHECKING:
    from lightning_fastdata.diagnose.report import DoctorReport, Option, as_dict, write_config
    from lightning_fastdata.diagnose.run import doctor

_WHERE = {
    "DoctorReport": "lightning_fastdata.diagnose.report",
    "Option": "lightning_fastdata.diagnose.report",
    "as_dict": "lightning_fastdata.diagnose.report",
    "write_config": "lightning_fastdata.diagnose.report",
    "doctor": "lightning_fastdata.diagnose.run",
}


def __getattr__(name: str) -> Any:
    """Import the doctor's parts on first use (its argument parser alone loads no torch: ``--help`` is fast)."""
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'lightning_fastdata.diagnose' has no attribute {name!r}")


__all__ = ["DoctorReport", "Option", "as_dict", "doctor", "main", "write_config"]
