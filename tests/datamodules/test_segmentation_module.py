"""SegmentationDataModule (issue 63, first part): the folder source through this package's loaders: workers, a
loader state that resumes at the exact sample, the device side (normalised images, int64 masks), a Trainer fit."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.masks import agreement

from lightning_fastdata.augment.normalize import Normalizer
from lightning_fastdata.datamodules.segmentation import SegmentationDataModule
from lightning_fastdata.segmentation.demos import SEGMENTATION_CLASSES, classes_of_colours, make_segmentation_folder
from lightning_fastdata.segmentation.target import IGNORE_INDEX
from lightning_fastdata.testing import cpu_trainer

N = len(SEGMENTATION_CLASSES)


@pytest.fixture(scope="module")
def voc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_segmentation_folder(tmp_path_factory.mktemp("segdm") / "voc", count=20, size=(160, 120), seed=5)


def module(voc: Path, **kw: object) -> SegmentationDataModule:
    args: dict = dict(num_classes=N, class_names=list(SEGMENTATION_CLASSES), base_size=64, crop_size=48,
                      batch_size=4, num_workers=2, seed=2)  # fmt: skip
    args.update(kw)
    return SegmentationDataModule(str(voc), **args)


@pytest.mark.timeout(180)
def test_batches_resume_at_the_exact_sample_and_masks_follow_images_on_the_device(voc: Path) -> None:
    dm = module(voc)
    dm.setup("fit")
    assert len(dm.train_dataset) == 16 and len(dm.val_dataset) == 4  # type: ignore[arg-type]
    loader = dm.train_dataloader()
    it = iter(loader)
    first = [next(it) for _ in range(2)]
    state = loader.state_dict()
    del it
    again = module(voc)
    again.setup("fit")
    resumed = again.train_dataloader()
    resumed.load_state_dict(state)
    whole = list(dm.train_dataloader())
    rest = list(resumed)
    assert len(first) + len(rest) == len(whole) == 4
    for a, b in zip(first + rest, whole):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    images, masks = dm.on_after_batch_transfer(whole[0], 0)
    assert images.dtype == torch.float32 and masks.dtype == torch.int64 and masks.shape == (4, 48, 48)
    pixels = Normalizer().denormalize(images).numpy()
    target = masks.numpy()
    keep = (target != IGNORE_INDEX) & (target == np.roll(target, 3, axis=2)) & (target == np.roll(target, -3, axis=2))
    keep &= (target == np.roll(target, 3, axis=1)) & (target == np.roll(target, -3, axis=1))
    got = np.stack([classes_of_colours(p) for p in pixels])
    assert keep.sum() > 1000 and (got[keep] == target[keep]).mean() > 0.99


class TinySegmenter(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Conv2d(3, N, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, masks = batch
        loss = F.cross_entropy(self.head(images), masks, ignore_index=IGNORE_INDEX)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        images, masks = batch
        self.log("val_loss", F.cross_entropy(self.head(images), masks, ignore_index=IGNORE_INDEX))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)


@pytest.mark.timeout(180)
def test_a_trainer_fits_and_validates_from_the_module(voc: Path) -> None:
    """A colour-to-class head learns the scenes (their classes are their colours): the loss falls."""
    dm = module(voc, num_workers=0, batch_size=8)
    trainer = cpu_trainer(epochs=6)
    model = TinySegmenter()
    trainer.fit(model, datamodule=dm)
    assert trainer.state.finished and float(trainer.callback_metrics["val_loss"]) < 1.0
    with pytest.raises(ValueError, match="need one class per image"):
        module(voc, sample_weights="balanced")


@pytest.mark.timeout(180)
def test_an_hdf5_file_fits_validates_and_tests_through_the_module(tmp_path: Path) -> None:
    """Groups ``train``/``val`` of one file; the test split another file (a split may name one); a file without
    groups trains from its top level and says it has no validation split."""
    from lightning_fastdata.segmentation.demos import make_segmentation_hdf5

    grouped = make_segmentation_hdf5(tmp_path / "g.h5", count=20, size=(100, 80), seed=3)
    flat = make_segmentation_hdf5(tmp_path / "f.h5", count=8, size=(100, 80), seed=4, groups=False)
    dm = module(grouped, num_workers=0, batch_size=8, test_split=str(flat))
    trainer = cpu_trainer(epochs=6)
    trainer.fit(TinySegmenter(), datamodule=dm)
    assert len(dm.train_dataset) == 15 and len(dm.val_dataset) == 5  # type: ignore[arg-type]
    assert float(trainer.callback_metrics["val_loss"]) < 1.0
    dm.setup("test")
    assert len(dm.test_dataset) == 8  # type: ignore[arg-type]
    alone = module(flat, num_workers=0)
    with pytest.warns(UserWarning, match=r"No validation: .*f\.h5 has no group 'val'"):
        alone.setup("fit")
    assert len(alone.train_dataset) == 8 and alone.val_dataset is None  # type: ignore[arg-type]


@pytest.mark.timeout(180)
def test_classes_keep_the_images_holding_them_and_renumber_their_masks(voc: Path) -> None:
    """``classes=["blue", "red"]``: only images holding blue or red, blue pixels class 0, red class 1, every other
    class ignored, through 2 workers and in validation; weights by class draw images holding it more often."""
    dm = module(voc, classes=["blue", "red"])
    dm.setup("fit")
    assert dm.num_classes == 2 and dm.classes == ("blue", "red")
    presence = dm.train_dataset.targets  # type: ignore[union-attr]
    colours = [SEGMENTATION_CLASSES.index(c) for c in ("blue", "red")]
    holding = int(presence[:, colours].any(axis=1).sum())
    batches = list(dm.train_dataloader()) + list(dm.val_dataloader())
    assert sum(len(b[0]) for b in batches[: len(dm.train_dataloader())]) == holding < 16
    checked = 0
    for images, masks in batches:
        assert set(np.unique(masks.numpy())) <= {0, 1, IGNORE_INDEX}
        truth = np.stack([classes_of_colours(i) for i in images.numpy()])
        interior = masks.numpy() != IGNORE_INDEX
        for new, old in enumerate(colours):
            checked += int((masks.numpy() == new).sum())
            assert (truth[masks.numpy() == new] == old).mean() > 0.99
        assert np.isin(truth[interior], colours).mean() > 0.99  # no other class left unignored
    assert checked > 1000
    weighted = module(voc, sample_weights={"yellow": 20.0}, epoch_size=64, num_workers=0)
    weighted.setup("fit")
    loader = weighted.train_dataloader()
    drawn = np.array([key[1] for key in loader.sampler])  # the epoch's keys: (epoch, index, ...)
    holds = weighted.train_dataset.targets[:, SEGMENTATION_CLASSES.index("yellow")]  # type: ignore[index,union-attr]
    assert len(drawn) == 64 == sum(len(b[0]) for b in loader)
    assert holds[drawn].mean() > 0.9 > holds.mean()  # weight 20 for images holding yellow, 1 for the others
    with pytest.raises(ValueError, match="max_per_class and sample_weights='balanced' need one class per image"):
        module(voc, max_per_class=3)


@pytest.mark.timeout(180)
def test_a_mix_of_a_folder_and_an_hdf5_file_renumbers_masks_into_its_classes_by_name(voc: Path, tmp_path: Path) -> None:
    """A VOC folder (classes by colour name) and an HDF5 file whose classes are named in another order, one taking
    only two classes: the mix's masks are in the mix's class list (by name), the classes a source leaves out are
    ignored; draws follow the weights; a Trainer fits and validates each source apart."""
    from lightning_fastdata import MixedDataModule
    from lightning_fastdata.segmentation.demos import make_segmentation_hdf5

    h5 = make_segmentation_hdf5(tmp_path / "s.h5", count=12, size=(100, 80), seed=6)
    reordered = list(reversed(SEGMENTATION_CLASSES))  # the file's class k is the colour SEGMENTATION_CLASSES[k]...
    # ...named in reverse, so a label_map puts each value where its name is
    mapping = {k: reordered.index(name) for k, name in enumerate(SEGMENTATION_CLASSES)} | {255: 255}
    folder = module(voc)
    file = module(h5, class_names=reordered, label_map=mapping, classes=["red", "blue"])
    mix = MixedDataModule([folder, file], weights=[1.0, 3.0], epoch_size=40, batch_size=8, num_workers=2, seed=3)
    assert mix.classes == SEGMENTATION_CLASSES and mix.num_classes == N and mix.ignore_index == IGNORE_INDEX
    mix.setup("fit")
    seen = 0
    from_file = 0
    for images, masks in mix.train_dataloader():
        truth = np.stack([classes_of_colours(i) for i in images.numpy()])
        m = masks.numpy()
        counted = m != IGNORE_INDEX
        assert (truth[counted] == m[counted]).mean() > 0.98  # every class in the mix's list, by name
        seen += len(images)
        from_file += int(sum(1 for k in range(len(m)) if not np.isin(m[k], [0, 2, 4, 5]).any()))
    assert seen == 40 and from_file > 15  # the file's share (3 of 4), whose masks hold red and blue only
    images, masks = mix.on_after_batch_transfer(next(iter(mix.train_dataloader())), 0)
    assert masks.dtype == torch.int64
    from lightning_fastdata import ImageSegmenter

    trainer = cpu_trainer(epochs=2)
    trainer.fit(ImageSegmenter(N, model=torch.nn.Conv2d(3, N, 1)), datamodule=mix)
    assert {"val_miou/dataloader_idx_0", "val_miou/dataloader_idx_1"} <= trainer.callback_metrics.keys()


@pytest.mark.timeout(180)
def test_a_cache_decodes_once_then_trains_with_masks_that_follow_and_evaluates_as_the_source(
    voc: Path, tmp_path: Path
) -> None:
    """``cache_dir``: each split decoded once at the base size (prepare_data); training batches from it hold masks
    that are their images' colours (2 workers); evaluation equals the source's bit for bit; a second module reuses
    the cache; an image rewritten makes another cache, never a stale one."""
    import os
    import shutil

    root = tmp_path / "voc"
    shutil.copytree(voc, root)
    cached = module(root, cache_dir=str(tmp_path / "cache"))
    cached.prepare_data()
    folders = sorted((tmp_path / "cache").iterdir())
    assert len(folders) == 2 and all((f / "manifest.json").is_file() for f in folders)  # train and val
    cached.setup("fit")
    counts = [agreement(images, masks) for images, masks in cached.train_dataloader()]
    agree, total = (sum(c) for c in zip(*counts))
    assert total > 5000 and agree / total > 0.99
    plain = module(root)
    plain.setup("fit")
    for a, b in zip(cached.val_dataloader(), plain.val_dataloader(), strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    again = module(root, cache_dir=str(tmp_path / "cache"))
    again.prepare_data()
    assert sorted((tmp_path / "cache").iterdir()) == folders  # reused, not rebuilt
    image = next((root / "JPEGImages").iterdir())
    os.utime(image, ns=(image.stat().st_atime_ns, image.stat().st_mtime_ns + 10**9))
    again.prepare_data()
    assert len(list((tmp_path / "cache").iterdir())) == 3  # the changed split's new cache beside the old


def test_arguments_the_masks_cannot_follow_are_not_in_the_signature(voc: Path) -> None:
    """What an image and its mask cannot follow is absent (LightningCLI and help() show what works); every loader and
    sampling argument it takes has FastDataModule's default."""
    import inspect

    from torchvision.transforms import v2

    from lightning_fastdata import FastDataModule, SegmentationDataModule

    ours = inspect.signature(SegmentationDataModule.__init__).parameters
    base = inspect.signature(FastDataModule.__init__).parameters
    absent = {"train_transforms", "val_transforms", "batch_transforms", "crop_fraction", "on_corrupt", "exact_decode",
              "max_corrupt_fraction", "val_resize_size", "val_crop_size", "image_size", "val_fraction"}  # fmt: skip
    assert not absent & set(ours) and not any(p.kind == p.VAR_KEYWORD for p in ours.values())
    shared = (set(ours) & set(base)) - {"self", "device_transforms"}
    assert len(shared) > 20 and all(ours[n].default == base[n].default for n in shared), shared
    for bad in (dict(train_transforms=v2.ColorJitter(0.2)), dict(batch_transforms=v2.MixUp(num_classes=N)),
                dict(on_corrupt="skip"), dict(image_size=64), dict(val_fraction=0.2)):  # fmt: skip
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{next(iter(bad))}'"):
            module(voc, **bad)
    module(voc, scale=(0.08, 1.0))  # the defaults, as LightningCLI passes them: fine


@pytest.mark.timeout(180)
def test_device_policies_warp_masks_with_their_images_and_leave_them_to_colour_ops(voc: Path) -> None:
    """A policy of the geometric ops alone: after it every interior mask pixel is still its image's colour, and the
    masks moved (the warps did something); a policy of the colour ops alone leaves the masks exactly as they were.
    torchvision's own object is taken (turned into ours); a transform that does not know masks is refused."""
    from torchvision.transforms import v2

    from lightning_fastdata.augment import TrivialAugmentWide
    from lightning_fastdata.augment.batched import _WARPS

    class Warps(TrivialAugmentWide):
        space = {k: v for k, v in TrivialAugmentWide.space.items() if k in _WARPS}

    class Colours(TrivialAugmentWide):
        space = {k: v for k, v in TrivialAugmentWide.space.items() if k not in _WARPS and k != "Identity"}

    plain = module(voc, num_workers=0, batch_size=16)
    plain.setup("fit")
    base = [plain.on_after_batch_transfer(b, 0) for b in plain.train_dataloader()]
    for policy, moves in ((Warps(), True), (Colours(), False)):
        dm = module(voc, num_workers=0, batch_size=16, device_transforms=policy)
        dm.setup("fit")
        batches = [dm.on_after_batch_transfer(b, 0) for b in dm.train_dataloader()]
        moved = 0
        for (images, masks), (_, before) in zip(batches, base, strict=True):
            assert masks.dtype == torch.int64
            moved += int((masks != before).any(dim=(1, 2)).sum())
            if not moves:
                assert torch.equal(masks, before)
                continue
            pixels = Normalizer().denormalize(images).numpy()
            target = masks.numpy()
            keep = (target != IGNORE_INDEX) & (target == np.roll(target, 3, 2)) & (target == np.roll(target, -3, 2))
            keep &= (target == np.roll(target, 3, 1)) & (target == np.roll(target, -3, 1))
            got = np.stack([classes_of_colours(p) for p in pixels])
            assert keep.sum() > 1000 and (got[keep] == target[keep]).mean() > 0.99
        assert (moved > 4) == moves
    module(voc, device_transforms=v2.TrivialAugmentWide())
    with pytest.raises(TypeError, match="takes lightning_fastdata.augment's TrivialAugmentWide, RandAugment"):
        module(voc, device_transforms=v2.RandomRotation(10))


@pytest.mark.timeout(180)
def test_random_resized_crop_moves_masks_with_their_images(voc: Path) -> None:
    """``train_crop="random_resized"`` with ``scale``/``ratio``: square crops, never padded, torchvision's box for
    the image and its mask alike (every interior mask pixel its image's colour, through 2 workers); ``scale`` without
    it is refused."""
    dm = module(voc, train_crop="random_resized", scale=(0.3, 1.0), ratio=(0.75, 1.33))
    dm.setup("fit")
    counts = []
    for images, masks in dm.train_dataloader():
        assert images.shape[1:] == (3, 48, 48)
        counts.append(agreement(images, masks))
    agree, total = (sum(c) for c in zip(*counts))
    assert total > 5000 and agree / total > 0.99
    reference = module(voc)
    reference.setup("fit")
    rrc, ref = dm.train_dataset, reference.train_dataset
    places = {rrc.window((0, i, 0), 160, 120).place for i in range(16)}  # type: ignore[union-attr]
    assert places == {(0, 0, 48, 48)}  # never padded
    assert any(ref.window((0, i, 0), 160, 120).place != (0, 0, 48, 48) for i in range(16))  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="shape train_crop='random_resized'"):  # never ignored
        module(voc, scale=(0.3, 1.0))


@pytest.mark.timeout(240)
def test_the_entropy_index_gives_the_same_training_batches_and_is_built_once(
    voc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``entropy_index=True``: prepare_data indexes the training images once (kept in index_dir, reused), and each
    crop decoded with its entry gives the batches decoded without, through 2 workers, over two epochs. A source of
    no image files, or a cache, is refused by name."""
    from lightning_fastdata.loading.jpeg.entropy_index import entropy_index_folder
    from lightning_fastdata.segmentation.convert import convert_segmentation

    def epochs(dm: SegmentationDataModule) -> list:
        dm.prepare_data()
        dm.setup("fit")
        loader, out = dm.train_dataloader(), []
        for epoch in range(2):
            loader.sampler.set_epoch(epoch)
            out += list(loader)
        return out

    # crops of a fifth of the image and up (base 120 of 160x120 photos, crop 40): rows above and beside them skipped
    kw = dict(base_size=120, crop_size=40, index_dir=str(tmp_path / "idx"))
    plain = epochs(module(voc, **kw))
    indexed = module(voc, entropy_index=True, **kw)
    assert len(epochs(indexed)) == len(plain)
    source = indexed.train_dataset
    assert source.entropy_indexes is not None and len(source.entropy_indexes) == 16
    assert sum(source.entropy_indexes.get(i) is not None for i in range(16)) == 16
    folder = entropy_index_folder(tmp_path / "idx", source.image_files())
    built = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    again = epochs(module(voc, entropy_index=True, **kw))  # prepare_data again: the index is reused, not rebuilt
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == built
    for a, b, c in zip(plain, epochs(indexed), again, strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[0], c[0])
    # in this process (no workers): the crops that pay for it are decoded from their MCUs alone, with the entries
    from lightning_fastdata.loading.jpeg import decode

    used: list[int] = []
    real = decode._jpegroi.crop_jpeg

    def counted(*args: object) -> object:
        used.append(1)
        return real(*args)

    monkeypatch.setattr(decode._jpegroi, "crop_jpeg", counted)
    alone = epochs(module(voc, entropy_index=True, num_workers=0, **kw))
    assert len(used) > 8
    for a, b in zip(plain, alone, strict=True):
        assert torch.equal(a[0], b[0])
    with pytest.raises(ValueError, match="entropy_index=True with cache_dir"):
        module(voc, entropy_index=True, cache_dir=str(tmp_path / "cache"))
    convert_segmentation(voc, tmp_path / "shards", progress=False)
    with pytest.raises(ValueError, match=r"entropy_index=True indexes image files .* PairedTarDataset"):
        module(tmp_path / "shards", entropy_index=True, **kw).prepare_data()
