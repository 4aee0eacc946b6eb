"""What the doctor reports: the measured options, the report itself, its text, and the config it writes."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lightning_fastdata._ext import native
from lightning_fastdata.diagnose.probe import PERCENTILES, DataProbe
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.hparams import without_secrets
from lightning_fastdata.loading.atomic import atomic_write_text
from lightning_fastdata.loading.index.files import contains_path, find_classes

__all__ = [
    "DoctorReport",
    "Option",
    "as_dict",
    "check_config_path",
    "duration",
    "format_report",
    "sibling_validation",
    "write_config",
]

#: The doctor's line when the compiled decoder is missing: what it costs and the fix (as the training warning says).
_NO_DECODER = f"NO: {native.MISSING_DECODER}"


@dataclass
class Option:
    """One way to load the data, measured on the sample.

    ``images_per_s`` is the warm rate measured per rank; ``expected_per_s`` is what a rank can expect on the whole
    data set (the same, unless the option's data do not fit in RAM: then at most what the storage reads cold,
    shared by the node's ranks). ``steps``: 0 uses the data as it is, 1 builds itself on the first run, 2 needs
    ``prepare`` (a command) run once before training.
    """

    name: str
    images_per_s: float
    vs_baseline: float
    kb_per_image: float
    dataset_gb: float
    build_s: float
    config: dict[str, Any] = field(default_factory=dict)
    expected_per_s: float = 0.0
    prepare: str = ""
    key: str = ""
    steps: int = 0


@dataclass(kw_only=True)
class DoctorReport(DataProbe):
    """What ``fastdata doctor`` found and recommends (``lightning_fastdata.doctor(...)`` returns it).

    The data's fields are :class:`~lightning_fastdata.diagnose.probe.DataProbe`'s; ``worker_sweep`` maps a worker
    count to the recommended option's images/s per rank.

    Attributes:
        path: The data examined.
        usable_cpus: CPUs this process may use (affinity capped by the cgroup quota).
        gpus: CUDA devices seen.
        devices: Ranks per node the report is for.
        workers_per_rank: Loader workers each rank gets (``num_workers="auto"``).
        ram_gb: This machine's memory.
        scratch_free_gb: Free space where the doctor built its samples.
        shm_gb: Size of ``/dev/shm``.
        roi_decoder: Whether the compiled ROI JPEG decoder is in use.
        pillow_simd: Whether pillow-simd is installed.
        options: Every option timed, simplest first.
        worker_sweep: Worker count -> the recommended option's images/s per rank.
        recommendation: The recommended option's name.
        reason: Why it was chosen.
        expected_wait_fraction: The share of a step spent waiting for data with it, given ``--step-ms``.
        seconds: How long the doctor ran.
    """

    path: str
    usable_cpus: int
    gpus: int
    devices: int
    workers_per_rank: int
    ram_gb: float
    scratch_free_gb: float
    shm_gb: float
    roi_decoder: bool
    pillow_simd: bool
    options: list[Option]
    worker_sweep: dict[int, float]
    recommendation: str
    reason: str
    expected_wait_fraction: float | None
    seconds: float

    @property
    def chosen(self) -> Option:
        """The recommended option."""
        return next(o for o in self.options if o.name == self.recommendation)

    def table(self) -> str:
        """The options as a Markdown table."""
        lines = [
            "| option | images/s per rank | vs baseline | whole set, per rank | KB per image | size | build |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for o in self.options:
            build = duration(o.build_s) if o.build_s else "-"
            lines.append(
                f"| {o.name} | {o.images_per_s:.0f} | {o.vs_baseline:.2f}x | {o.expected_per_s:.0f} | "
                f"{o.kb_per_image:.0f} | {o.dataset_gb:.1f} GB | {build} |"
            )
        return "\n".join(lines)

    def commands(self, config: str | None) -> list[str]:
        """Every command to run, in order, to train with the recommendation (``config``: the written YAML)."""
        steps = [self.chosen.prepare] if self.chosen.prepare else []
        if config is None:
            config = "fastdata-doctor.yaml"
            steps.append(f"fastdata doctor {self.path} --devices {self.devices} --write-config {config}")
        return [*steps, f"fastdata fit --config {config}"]


def duration(seconds: float) -> str:
    """``42 s``, ``12 min`` or ``3.5 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _dist(d: dict[str, float], unit: str) -> str:
    return "/".join(f"{v:.0f}" for v in d.values()) + f" {unit} (p{'/p'.join(str(q) for q in PERCENTILES)})"


def format_report(r: DoctorReport, image_size: int, step_ms: float | None, config: str | None) -> str:
    """The report as ``fastdata doctor`` prints it, ending with every command to run, in order."""
    share = max(1, r.usable_cpus // r.devices)
    indexed = "index_dir" in r.chosen.config.get("init_args", {})
    lines = [
        f"\nfastdata doctor: {r.path} ({r.kind})",
        f"  data: {r.files:,} images, {r.classes} classes, formats {r.formats} (sample of {r.sampled}), "
        f"~{r.data_gb:.1f} GB; listed in {r.scan_s:.1f} s"
        + (" (per rank and run: the written config keeps the list in index_dir, once per node)" if indexed else ""),
        f"    file size {_dist(r.size_kb, 'KB')}, mean {r.mean_kb:.0f} KB",
        f"    shorter side {_dist(r.shorter_side, 'px')}, median {r.median_resolution[0]}x{r.median_resolution[1]}"
        + (
            f"; {r.smaller_than_crop} sampled images are smaller than the {image_size} px crop (upscaled in training)"
            if r.smaller_than_crop
            else ""
        ),
        f"    corrupt in the sample: {len(r.corrupt)}",
        *(f"    corrupt: {p}" for p in r.corrupt[:10]),
    ]
    if r.unreadable:
        lines.append(
            f"    unreadable (permission denied) in the sample: {len(r.unreadable)}; training would fail on them: "
            "make the data readable by the user that trains"
        )
        lines += [f"    unreadable: {p}" for p in r.unreadable[:10]]
    lines += [
        f"  machine: {r.usable_cpus} usable CPUs, {r.gpus} GPU(s); {r.devices} device(s): {share} CPU(s) per rank",
        f"    num_workers='auto' = {r.workers_per_rank} (timed on the rank's share); ROI JPEG decoder "
        f"{'yes' if r.roi_decoder else _NO_DECODER}; pillow-simd {'yes' if r.pillow_simd else 'no'}",
        f"    RAM {r.ram_gb:.0f} GB; free disk for a cache {r.scratch_free_gb:.0f} GB; /dev/shm {r.shm_gb:.1f} GB",
        (
            f"  bucket: one process fetched the sample at {r.read_mb_s_warm:.0f} MB/s (concurrent requests); one "
            f"request at a time {r.request_ms:.0f} ms each; the node's {r.devices * max(1, r.workers_per_rank)} loader "
            f"process(es) estimated at {r.read_mb_s_cold:.0f} MB/s (streaming is capped there; the caches are built "
            "from the sample's copy in the scratch directory)"
            if r.kind == "bucket"
            else f"  storage: {r.read_mb_s_warm:.0f} MB/s warm, {r.read_mb_s_cold:.0f} MB/s after eviction"
        )
        + f"\n    ceilings (1 core): decode {r.decode_ceiling_1core:.0f} img/s, "
        f"memcpy {r.memcpy_ceiling_1core:.0f} img/s\n",
        r.table(),
        f"\nWorkers per rank, {r.recommendation}: "
        + ", ".join(f"{w}: {rate:.0f} img/s" for w, rate in r.worker_sweep.items())
        + (" (0: loads in the training process, not overlapped with the step)" if 0 in r.worker_sweep else "")
        + (
            f" ({share}: every CPU of the rank, none left for the training step)"
            if share > 1 and share in r.worker_sweep
            else ""
        ),
    ]
    wait = r.expected_wait_fraction
    lines.append(
        f"\nRecommendation: {r.recommendation}: {r.reason}."
        + (f" Expected data wait at {step_ms:g} ms per step: {100 * wait:.0f}%." if wait is not None else "")
    )
    lines.append(f"(measured in {r.seconds:.0f} s; nothing was written to {r.path})")
    lines.append("\nThen run, in order:")
    lines += [f"  {k}. {cmd}" for k, cmd in enumerate(r.commands(config), start=1)]
    return "\n".join(lines)


def check_config_path(data: str, config: str) -> None:
    """Refuse a config path inside the data folder, or on the HDF5 file itself: the doctor never writes there.

    Raises:
        ValueError: Naming both paths.
    """
    real, out = os.path.realpath(data), os.path.realpath(config)
    if (os.path.isdir(real) and contains_path(real, out)) or out == real:
        raise InvalidValueError(
            f"Refusing to write the config {config!r} into the data {data!r}: the doctor never writes into your "
            "data. Pass --write-config a path outside it."
        )


def sibling_validation(path: str) -> str | None:
    """A ``val``, ``valid`` or ``validation`` folder beside the local folder ``path`` with the same class folders."""

    def classes(folder: str) -> tuple[str, ...] | None:
        try:
            return find_classes(folder)  # the classes the DataModule will see
        except FileNotFoundError:
            return None

    mine = classes(path)
    parent = os.path.dirname(os.path.abspath(path))
    for name in ("val", "valid", "validation"):
        candidate = os.path.join(parent, name)
        if mine and os.path.abspath(candidate) != os.path.abspath(path) and classes(candidate) == mine:
            return os.path.join(os.path.dirname(path.rstrip(os.sep)) or ".", name)
    return None


def write_config(
    report: DoctorReport,
    path: str,
    val_root: str | None = None,
    index_dir: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Path:
    """A LightningCLI YAML with the recommended DataModule, runnable with ``fastdata fit --config PATH``.

    ``val_root`` (the user's validation folder, URL or HDF5 file) and ``index_dir`` (their folder for file lists
    and entropy indexes) are kept in it: the recommended option reads the same validation data as the user's run
    (an HDF5 option converts it too, in its first-once command) and keeps its indexes where the user said. For a
    bucket, ``storage_options`` (what the doctor was given) are kept without their secrets: the header names the
    keys left out and where they come from instead (the environment). The header says what was kept.

    Raises:
        ValueError: If ``path`` is inside the data.
    """
    import yaml

    option = report.chosen
    data = copy.deepcopy(option.config)
    init = data["init_args"]
    kept: list[str] = []
    prepare = option.prepare
    if val_root is not None:
        if data["class_path"].endswith("HDF5DataModule"):
            if prepare:  # the training file is converted from the folder: the validation one is, the same way
                train_h5 = str(init["root"])
                val_h5 = train_h5[: -len(".h5")] + "-val.h5" if train_h5.endswith(".h5") else train_h5 + "-val"
                init["val_root"] = val_h5
                prepare += " && " + prepare.replace(f"--src {report.path}", f"--src {val_root}").replace(
                    f"--dst {train_h5}", f"--dst {val_h5}"
                )
        init.setdefault("val_root", val_root)
        init.pop("val_fraction", None)
        kept.append(f"validation data {val_root}")
    if index_dir is not None:
        if "index_dir" in init or init.get("entropy_index"):
            init["index_dir"] = index_dir
        kept.append(f"index_dir {index_dir}")
    credentials = ""
    if report.kind == "bucket":
        given = dict(storage_options or {})
        public = without_secrets(given)
        if public:
            init["storage_options"] = public
            kept.append(f"storage_options {', '.join(sorted(public))}")
        secret = sorted(set(given) - set(public))
        credentials = (
            f"# Left out: {', '.join(secret)} (secrets are never written); give them through the environment "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) or an instance role.\n"
            if secret
            else "# The bucket's credentials (and endpoint, unless kept above) come from the environment "
            "(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...), as when this was measured.\n"
        )
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "auto",
            "devices": report.devices,
            "max_epochs": 90,
            "callbacks": [{"class_path": "lightning_fastdata.FastDataCallback"}],
        },
        "model": {"arch": "resnet50", "channels_last": True},
        "data": data,
    }
    header = (
        f"# Written by `fastdata doctor {report.path}`: {report.recommendation}, "
        f"{option.images_per_s:.0f} images/s per rank measured on a sample of {report.sampled}.\n"
        f"# Why: {report.reason}.\n"
    )
    if kept:
        header += f"# Kept from your setup: {'; '.join(kept)}.\n"
    header += credentials
    if prepare:
        header += f"# First, once: {prepare}\n"
    if init.get("verify_source") == "folders":
        header += (
            "# verify_source: folders checks the cache against the file list and its folders' mtimes at each run, "
            "not every file;\n# after rewriting images in place (same names), run once with verify_source: files.\n"
        )
    check_config_path(report.path, path)
    atomic_write_text(path, header + yaml.safe_dump(config, sort_keys=False))  # a reader never sees half a config
    return Path(path)


def as_dict(report: DoctorReport) -> dict[str, Any]:
    """The report as plain data (JSON-serialisable)."""
    return asdict(report)
