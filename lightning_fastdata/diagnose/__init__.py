"""``fastdata doctor``: measure a user's own data and machine, and say (and write) the fastest setup.

One module per job: :mod:`.probe` (the data and the storage), :mod:`.options` (build each option for a sample),
:mod:`.timing` (the time budget, one rank's CPUs), :mod:`.verdict` (which option, how many workers, why),
:mod:`.report` (the report, its text, the config), :mod:`.run` (``doctor()``), :mod:`.main` (the command line).
"""

from lightning_fastdata.diagnose.main import main
from lightning_fastdata.diagnose.report import DoctorReport, Option, as_dict, write_config
from lightning_fastdata.diagnose.run import doctor

__all__ = ["DoctorReport", "Option", "as_dict", "doctor", "main", "write_config"]
