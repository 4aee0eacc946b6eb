"""The GPU check's op recorder, on a CPU with the ``meta`` device standing in for the GPU."""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.recorder import GRAIN, OpRecorder, format_rows, waits_for_device


def _host_then_device(x: torch.Tensor) -> torch.Tensor:
    big = torch.ones(GRAIN * 2)  # batch-sized work on the host
    small = torch.arange(8.0).mul(2)  # a few host numbers
    return x.mul(2).add_(big.sum()) + small.sum().to(x.device)


def test_the_recorder_tells_host_ops_from_device_ops_with_their_size_and_caller() -> None:
    x = torch.empty(4, 3, 64, 64, device="meta")
    with OpRecorder() as rec:
        y = _host_then_device(x)
    assert y.device.type == "meta" and y.shape == x.shape  # the ops ran as usual under the recorder
    by_device = rec.calls_by_device()
    assert by_device["cpu"] >= 4 and by_device["meta"] >= 2
    host = rec.host_work(GRAIN)
    assert sorted((r.op, r.max_elements) for r in host) == [("ones", GRAIN * 2), ("sum", GRAIN * 2)]
    assert all(r.frame.endswith("(_host_then_device)") and "test_recorder.py:" in r.frame for r in host)
    mul = next(r for r in rec.rows.values() if r.op == "mul" and r.device == "meta")
    assert mul.calls == 1 and mul.max_elements == x.numel()
    table = rec.table(GRAIN, top=50)
    assert [r["batch_sized_on_host"] for r in table[:2]] == [True, True] and not table[2]["batch_sized_on_host"]
    text = format_rows(table)
    assert text.splitlines()[1].startswith("*") and "test_recorder.py" in text


def test_the_recipes_device_half_does_no_batch_sized_work_on_the_host(image_folder: Path) -> None:
    """The recipe's augmentation hook on a batch that stands on another device (``meta``): every op with an image's
    worth of elements runs there; the host only draws parameters (a few numbers per sample)."""
    from lightning_fastdata import ImageFolderDataModule
    from lightning_fastdata.recipe import load_recipe

    made, _ = load_recipe("recipe_torchvision")
    made.pop("image_size")
    size = 64
    dm = ImageFolderDataModule(str(image_folder), image_size=size, batch_size=32, num_workers=0, val_fraction=0, **made)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch.keys is not None  # a DeviceBatch: images, labels, keys
    moved = dm.transfer_batch_to_device(dm.on_before_batch_transfer(batch, 0), torch.device("meta"), 0)
    with OpRecorder() as rec:
        images, targets = dm.on_after_batch_transfer(moved, 0)
    assert images.device.type == "meta" and images.shape == (32, 3, size, size) and targets.shape == (32, 3)
    assert rec.calls_by_device()["meta"] > 20  # policy, normalisation, erasing and mixing ran on the batch's device
    image = 3 * size * size
    assert rec.host_work(image) == [], format_rows(rec.table(image))


def test_the_recorder_names_the_calls_that_make_the_host_wait_for_the_device() -> None:
    """A number read from a device tensor, or a blocking copy to the host: the GPU check lists them per frame
    (a ``meta`` tensor stands for a GPU one here; the function is given the op's arguments as dispatch gives them)."""
    gpu, host = torch.empty(3, device="meta"), torch.empty(3)
    assert waits_for_device("_local_scalar_dense", (gpu[:1],), {}, None)
    assert not waits_for_device("_local_scalar_dense", (host[:1],), {}, None)
    assert waits_for_device("nonzero", (gpu,), {}, None)
    assert waits_for_device("_to_copy", (gpu,), {"device": torch.device("cpu")}, host)
    assert not waits_for_device("_to_copy", (gpu,), {"device": torch.device("cpu"), "non_blocking": True}, host)
    assert not waits_for_device("_to_copy", (host,), {"device": torch.device("meta")}, gpu)  # to the device
    assert waits_for_device("copy_", (host, gpu), {}, host)
    assert not waits_for_device("copy_", (host, gpu, True), {}, host)  # non_blocking into (pinned) host memory
    assert not waits_for_device("copy_", (gpu, host), {}, gpu)
    assert not waits_for_device("mul", (gpu, gpu), {}, gpu)
    with OpRecorder() as rec:
        torch.arange(4.0).sum().item()  # a number from a host tensor: no wait
    assert rec.waits == {}
