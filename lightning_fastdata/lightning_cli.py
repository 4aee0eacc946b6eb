"""LightningCLI for ``fastdata fit`` (``validate``, ``test``, ``predict``).

Our DataModules and model, secret-free configs, and our validation errors as one line. Imported only when such a
command runs (it loads torch and Lightning), so that ``fastdata --help`` and the other commands answer at once.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import warnings
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_fastdata.callbacks.mask_writer import MaskWriter
from lightning_fastdata.callbacks.predictions import PredictionWriter
from lightning_fastdata.cli_internals import short_error
from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.errors import UsageError
from lightning_fastdata.hparams import without_secrets
from lightning_fastdata.models import ImageClassifier
from lightning_fastdata.segmenter import ImageSegmenter
from lightning_fastdata.shipped import find_config

__all__ = ["FastDataCLI", "SecretFreeSaveConfigCallback", "run_cli"]


def _with_configs_found(argv: list[str]) -> list[str]:
    """``argv`` with each ``--config NAME`` (or ``--config=NAME``) replaced by the file it names."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--config" and i + 1 < len(out):
            out[i + 1] = str(find_config(out[i + 1]))
        elif arg.startswith("--config="):
            out[i] = "--config=" + str(find_config(arg.split("=", 1)[1]))
    return out


def _data_class_name(argv: list[str]) -> str | None:
    """The class name of the DataModule ``argv`` asks for (in a ``--config`` file or ``--data``), if it names one.

    A ``SegmentationDataModule``'s model is :class:`~lightning_fastdata.ImageSegmenter`, a ``DetectionDataModule``'s
    :class:`~lightning_fastdata.ObjectDetector`, an ``ImageTextDataModule``'s
    :class:`~lightning_fastdata.ContrastiveModel` (their configs' ``model:`` sections hold those models' arguments).
    """
    import yaml

    for i, arg in enumerate(argv):
        value = None
        if arg in ("--data", "--data.class_path") and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(("--data=", "--data.class_path=")):
            value = arg.split("=", 1)[1]
        elif arg == "--config" and i + 1 < len(argv) and os.path.isfile(argv[i + 1]):
            with open(argv[i + 1], encoding="utf-8") as f:
                data = (yaml.safe_load(f) or {}).get("data")
            value = data.get("class_path") if isinstance(data, dict) else None
        if isinstance(value, str):
            return value.rsplit(".", 1)[-1]
    return None


def _model_class(argv: list[str]) -> type:
    """The model class of the DataModule ``argv`` asks for (:func:`_data_class_name`): its task's."""
    name = _data_class_name(argv)
    if name == "SegmentationDataModule":
        return ImageSegmenter
    if name == "DetectionDataModule":
        from lightning_fastdata.detection.detector import ObjectDetector

        return ObjectDetector
    if name == "ImageTextDataModule":
        from lightning_fastdata.captions.model import ContrastiveModel

        return ContrastiveModel
    return ImageClassifier


def _usage_error(err: BaseException) -> UsageError | None:
    """The error our validation raised on purpose in ``err``'s cause chain, if any (see :mod:`..errors`)."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, UsageError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class SecretFreeSaveConfigCallback(SaveConfigCallback):
    """LightningCLI's ``config.yaml`` writer, with every ``storage_options`` stripped of its secrets first.

    The saved config is what a run leaves beside its logs and checkpoints; credentials come back from the
    environment (or the command line) when it is run again (:func:`~lightning_fastdata.hparams.without_secrets`).
    """

    def __init__(self, parser: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        config = config.clone()
        for key in list(config.keys()):
            if key.rsplit(".", 1)[-1] == "storage_options" and isinstance(config[key], dict):
                config[key] = without_secrets(config[key])
        super().__init__(parser, config, *args, **kwargs)


class FastDataCLI(LightningCLI):
    """LightningCLI with the model's ``num_classes``, ``class_names`` and ``multi_label`` linked from the DataModule.

    When a value fails the package's own validation (a :class:`~lightning_fastdata.errors.UsageError`: a missing
    folder, an impossible argument), the command exits with that message alone (``error: ...``), not jsonargparse's
    listing of every Union subtype and argument around it; any other error keeps its traceback.
    """

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Link the class count, names and kind so configs never repeat them (the names go into the checkpoint).

        A segmentation run (:class:`~lightning_fastdata.ImageSegmenter`) links the ignored mask value instead of the
        kind; a contrastive run (:class:`~lightning_fastdata.ContrastiveModel`: no classes) links nothing.
        """
        if getattr(self.model_class, "__name__", "") == "ContrastiveModel":
            return
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.classes", "model.class_names", compute_fn=list, apply_on="instantiate")
        if isinstance(self.model_class, type) and issubclass(self.model_class, ImageSegmenter):
            parser.link_arguments("data.ignore_index", "model.ignore_index", apply_on="instantiate")
        elif isinstance(self.model_class, type) and issubclass(self.model_class, ImageClassifier):
            parser.link_arguments("data.multi_label", "model.multi_label", apply_on="instantiate")

    @override
    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse ``args``: ``fastdata`` always passes them (its own parser split the command line first).

        A key the parser does not know (a typo in a YAML config or an option) ends the command with one line naming
        it and the closest valid keys, not the parser's usage of every option around it (exit status 2).
        """
        captured = io.StringIO()
        try:
            with contextlib.redirect_stderr(captured):
                self.config = parser.parse_args(args)
        except SystemExit as stop:
            text = captured.getvalue()
            if stop.code in (0, None) or "error:" not in text:
                sys.stderr.write(text)
                raise
            print(f"fastdata {args[0] if args else ''}: {short_error(text, parser)}", file=sys.stderr)
            raise SystemExit(2) from None  # as argparse's own errors
        sys.stderr.write(captured.getvalue())

    @override
    def instantiate_classes(self) -> None:
        """Build the classes; our validation errors become one clear message (exit status 1)."""
        try:
            super().instantiate_classes()
        except Exception as err:
            ours = _usage_error(err)
            if ours is None:
                raise
            raise SystemExit(f"fastdata {self.subcommand or ''}: error: {ours}".replace("  ", " ")) from ours

    def before_predict(self) -> None:
        """``fastdata predict`` writes the prediction table (a ``PredictionWriter``) unless the config has one.

        To ``<default_root_dir>/predictions.csv``; ``--trainer.callbacks+=lightning_fastdata.PredictionWriter
        --trainer.callbacks.output FILE`` chooses another file or ``top_k``. A segmentation run writes its masks with
        a :class:`~lightning_fastdata.MaskWriter` to ``<default_root_dir>/masks/`` instead.
        """
        trainer = self.trainer
        callbacks: list[Any] = trainer.callbacks  # type: ignore[attr-defined]  # (a Trainer property mypy misses)
        if isinstance(self.model, ImageSegmenter):
            if not any(isinstance(c, MaskWriter) for c in callbacks):
                output = os.path.join(trainer.default_root_dir, "masks")
                callbacks.append(MaskWriter(output))
                rank_zero_info(f"fastdata predict: writing the masks and their table to {output}")
        elif not any(isinstance(c, PredictionWriter) for c in callbacks):
            output = os.path.join(trainer.default_root_dir, "predictions.csv")
            callbacks.append(PredictionWriter(output))
            rank_zero_info(f"fastdata predict: writing the predictions to {output}")


def run_cli(args: list[str] | None = None) -> FastDataCLI:
    """Run LightningCLI over :class:`ImageClassifier` and any :class:`FastDataModule` subclass.

    With a ``SegmentationDataModule`` (``data.class_path``), the model is :class:`~lightning_fastdata.ImageSegmenter`;
    with a ``DetectionDataModule``, :class:`~lightning_fastdata.ObjectDetector`; with an ``ImageTextDataModule``,
    :class:`~lightning_fastdata.ContrastiveModel`.

    ``args``: ``[subcommand, options...]`` (default: the command line after the program name). ``--config`` may
    name a shipped config (``--config imagefolder``). ``sys.argv`` is never changed (a DDP launcher that
    re-runs it resolves the same names).

    Raises:
        ConfigNotFoundError: If a ``--config`` is neither a file nor a shipped config.
    """
    argv = _with_configs_found(sys.argv[1:] if args is None else args)
    with warnings.catch_warnings():
        # Lightning's CombinedLoader builds a torch pytree ``LeafSpec`` for every batch, which torch >= 2.10
        # deprecates: not the user's code nor ours, and nothing they could change. Only in our command.
        warnings.filterwarnings("ignore", message=r".*LeafSpec.* is deprecated", category=FutureWarning)
        return FastDataCLI(
            _model_class(argv),
            FastDataModule,
            subclass_mode_data=True,
            save_config_callback=SecretFreeSaveConfigCallback,
            save_config_kwargs={"overwrite": True},
            args=argv,
        )
