"""torchdata's contract on every train loader we hand out: ``state_dict()`` is its exact state, ``load_state_dict()``
resumes it (or refuses a state of other settings, naming them), outside a Trainer, through real workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_fastdata import (
    FastDataModule,
    HDF5DataModule,
    ImageFolderDataModule,
    MixedDataModule,
    TensorCacheDataModule,
    convert_folder_to_hdf5,
)
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.loading.transport.loaders import SETTINGS_KEY

KW: dict[str, Any] = dict(image_size=16, batch_size=4, val_fraction=0.0, seed=0)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("loader-state")
    root = make_image_folder(base / "train", num_classes=3, per_class=13, size=(40, 30))
    h5 = convert_folder_to_hdf5(root, base / "train.h5", mode="encoded", processes=1, progress=False)
    return {"folder": root, "hdf5": h5, "cache": base / "cache"}


def module(kind: str, sources: dict[str, Path], workers: int, **extra: Any) -> FastDataModule:
    kw = {**KW, "num_workers": workers, **extra}
    dm: FastDataModule
    if kind == "folder":
        dm = ImageFolderDataModule(str(sources["folder"]), **kw)
    elif kind == "hdf5":
        dm = HDF5DataModule(str(sources["hdf5"]), **kw)
    elif kind == "cache":
        dm = TensorCacheDataModule(str(sources["folder"]), str(sources["cache"]), build_processes=1, **kw)
        dm.prepare_data()
    else:  # a mix of a folder and an HDF5 file, the second drawn twice as often
        parts: dict[str, Any] = dict(image_size=16, val_fraction=0.0)
        folder, hdf5 = (
            ImageFolderDataModule(str(sources["folder"]), **parts),
            HDF5DataModule(str(sources["hdf5"]), **parts),
        )
        dm = MixedDataModule([folder, hdf5], weights=[1.0, 2.0], epoch_size=30, **kw)
    dm.setup("fit")
    return dm


def batches(loader: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images.clone(), labels.clone()) for images, labels in loader]


def same(a: list[tuple[torch.Tensor, torch.Tensor]], b: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        ("folder", {}),
        ("hdf5", {}),
        ("cache", {}),
        ("folder", {"sample_weights": "balanced", "epoch_size": 30}),
        ("mix", {}),
    ],
    ids=["folder", "hdf5", "cache", "folder-weights-epoch_size", "mix"],
)
def test_the_train_loaders_own_state_resumes_it_exactly(
    sources: dict[str, Path], kind: str, extra: dict[str, Any], workers: int
) -> None:
    whole = batches(module(kind, sources, workers, **extra).train_dataloader())
    loader = module(kind, sources, workers, **extra).train_dataloader()
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    state = loader.state_dict()
    assert state and state[SETTINGS_KEY]["batch_size"] == 4  # not empty: torchdata's state, and its settings
    del it
    resumed = module(kind, sources, workers, **extra).train_dataloader()
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state  # loaded, not yet iterated: still that state
    rest = batches(resumed)
    assert len(whole) >= 6 and same(first + rest, whole)
    # the next epoch of the resumed loader is the next epoch's permutation, as the uninterrupted loader's
    plain = module(kind, sources, workers, **extra).train_dataloader()
    batches(plain)
    plain.sampler.set_epoch(1)
    resumed.sampler.set_epoch(1)
    assert same(batches(resumed), batches(plain))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"batch_size": 8}, "batch_size=4 -> 8"),
        ({"num_workers": 2}, "num_workers=0 -> 2"),
        ({"seed": 1}, "seed=0"),
        ({"sample_weights": "balanced"}, "sample_weights"),
    ],
)
def test_a_state_of_other_settings_is_refused_naming_the_change(
    sources: dict[str, Path], change: dict[str, Any], named: str
) -> None:
    loader = module("folder", sources, 0).train_dataloader()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    kw = {"num_workers": 0, **change}
    other = module("folder", sources, kw.pop("num_workers"), **kw).train_dataloader()
    with pytest.raises(ValueError, match=named):
        other.load_state_dict(state)


def test_an_empty_state_loads_nothing_as_torchdatas(sources: dict[str, Path]) -> None:
    loader = module("folder", sources, 0).train_dataloader()
    loader.load_state_dict({})
    assert same(batches(loader), batches(module("folder", sources, 0).train_dataloader()))


@pytest.mark.timeout(300)
def test_lightnings_own_save_of_the_loader_is_the_datamodules_and_a_resume_restores_once(
    sources: dict[str, Path], tmp_path: Path
) -> None:
    """The fit loop saves the loader's ``state_dict`` (rank 0's): the same state the DataModule gathered. On resume
    the DataModule restores it and the fit loop's load that follows is ignored: the run continues at the next batch
    (a second restore of the same state would be harmless here; one of another rank's would not)."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_fastdata.testing import cpu_trainer

    seen: list[torch.Tensor] = []

    class Sums(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            seen.append(batch[0].double().flatten(1).sum(1))
            return self.w.sum() * 0.0

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    def fit(steps: int, ckpt: str | None = None) -> None:
        every = ModelCheckpoint(dirpath=tmp_path / str(steps), every_n_train_steps=3, save_last=True)
        trainer = cpu_trainer(every, epochs=-1, max_steps=steps, enable_checkpointing=True)
        trainer.fit(Sums(), module("folder", sources, 2), ckpt_path=ckpt)

    fit(7)
    whole = torch.cat(seen)
    seen.clear()
    fit(3)
    checkpoint = torch.load(tmp_path / "3" / "last.ckpt", weights_only=False)
    lightnings = checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    ours = checkpoint["ImageFolderDataModule"]["loader_states"]
    assert lightnings == ours and lightnings[0]  # one rank: the same state, not empty
    fit(7, ckpt=str(tmp_path / "3" / "last.ckpt"))
    got = torch.cat(seen)
    assert got.shape == whole.shape and torch.equal(got, whole)


def test_the_loader_arguments_are_attributes_of_the_module_and_of_its_parts(sources: dict[str, Path]) -> None:
    """``dm.batch_size`` is the loader settings' (Lightning's batch-size finder sets it); ``num_workers`` the
    transfer's: one value each, read and set through either."""
    dm = module("folder", sources, 0)
    assert dm.batch_size == dm.loading.batch_size == 4 and dm.num_workers == dm.transfer.num_workers == 0
    dm.batch_size = 8
    assert dm.loading.batch_size == 8 and next(iter(dm.train_dataloader()))[0].shape[0] == 8
    assert dm.seed == 0 and dm.normalizer is dm.transfer.normalizer
