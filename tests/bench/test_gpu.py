"""``scripts/gpu-check.sh`` end to end at its ``--quick`` sizes: without a GPU it says so and runs every part."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
FED_FIELDS = {"loader", "img_s", "synthetic_img_s", "data_wait", "gpu_idle", "gpu_mem_mb", "host_rss_mb"}


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_gpu_check_script_runs_every_part_without_a_gpu(tmp_path: Path) -> None:
    out = subprocess.run(
        ["bash", "scripts/gpu-check.sh", "--quick", "--data", str(tmp_path), "--",
         "--folder-workers", "2", "--fed-loaders", "torchvision ImageFolder (baseline)"],
        cwd=ROOT, capture_output=True, text=True, timeout=580,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "GPU none: everything runs on the CPU" in out.stdout
    results = tmp_path / "results"
    assert "skipped" in (results / "cuda-tests.txt").read_text()  # the CUDA tests were collected, then skipped
    report = json.loads((results / "gpu.json").read_text())
    assert report["device"] == "cpu" and report["settings"]["arch"] == "resnet18"
    assert set(report["seconds"]) == {"fed", "mechanisms", "correctness", "decode", "recipe", "scale", "device-decode"}
    assert report["recipe"]["fed_ratio"] > 0 and report["recipe"]["device_augment_ms_per_batch"] > 0
    loaders = [row["loader"] for row in report["fed"]]
    # the arguments after --: one of the fed part's loaders (each is a DataModule trained end to end in
    # tests/datamodules), then the folder module with 2 workers
    assert loaders == [
        "synthetic (device-resident)",
        "torchvision ImageFolder (baseline)",
        "ImageFolderDataModule, 2 workers",
    ]
    for row in report["fed"][1:]:
        assert FED_FIELDS <= set(row) and row["img_s"] > 0 and 0 <= row["data_wait"] < 1
        assert row["steady_img_s"] is None and row["epoch_boundary_ms"] is None  # GPU time: none on a CPU
        assert len(row["host_rss_mb"]) == report["settings"]["epochs"] and row["gpu_mem_mb"] == []
    assert len(report["mechanisms"]) == 5 and report["mechanisms"][0]["vs_defaults"] == 1.0
    assert all(v["bit_identical"] and v["batches"] == 3 for k, v in report["correctness"].items() if k != "device")
    assert report["decode"]["cpu_path_img_s"] > 0 and report["decode"]["gpu"].startswith("skipped")
    assert [r["workers"] for r in report["scale"]] == [1] and report["scale"][0]["ours_img_s"] > 0
    planned = report["device-decode"]  # on the large q95 photos the script made; the GPU's rows skipped here
    assert planned["set"] == "large" and "large-q95" in planned["root"] and planned["gpu"].startswith("skipped")
    assert planned["loader_workers_img_s"] > 0 and planned["loader_device_img_s"] > 0
    assert report["scale"][0]["ours_counted"] == "uint8, leaving the loader"
    assert not (ROOT / "benchmarks" / "results" / "gpu-check.log").exists()  # --quick never writes into the repo


@pytest.mark.timeout(120)
def test_the_gpu_checks_fit_and_correctness_parts_on_a_cpu(image_folder: Path, tmp_path: Path) -> None:
    """The fast tier's touch of the GPU check (the slow test above runs the whole script): one timed fit on the
    device-resident stand-in data, and the prefetch-equals-plain check on the folder and cache modules."""
    from benchmarks import gpu
    from benchmarks.gpu_fit import Settings, SyntheticData, fit
    from lightning_fastdata import DataWaitMonitor

    s = Settings(str(image_folder), str(tmp_path), str(image_folder), arch="resnet18", image_size=16, batch_size=4)
    s = Settings(**{**s.__dict__, "workers": 0, "steps": 2, "epochs": 2, "cache_size": 20})
    row = fit(s, SyntheticData(s, num_classes=3), DataWaitMonitor())
    assert row["img_s"] > 0 and 0 <= row["data_wait"] < 1 and len(row["host_rss_mb"]) == 2
    checked = gpu.correctness(s)
    assert checked["device"] == "cpu"
    assert all(v == {"batches": 3, "bit_identical": True} for k, v in checked.items() if k != "device")


@pytest.mark.slow  # over 7 s on the 2-core VM (the project's rule: over ~4 s is the slow tier)
@pytest.mark.timeout(300)
def test_the_gpu_checks_recipe_part_on_a_cpu(image_folder: Path, tmp_path: Path) -> None:
    """The recipe part: the recipe's fed ratio, torchvision's reference loader's, the variants, the untimed diagnose
    fit (op recorder, profiler), the device augmentation's cost per batch and the summary table."""
    from benchmarks import gpu
    from benchmarks.gpu_recipe import summary

    s = gpu.Settings(str(image_folder), str(tmp_path), str(image_folder), arch="resnet18", image_size=32, batch_size=4)
    variants = ("crop-flip-only", "one-torch-thread", "all-torch-threads")
    s = gpu.Settings(**{**s.__dict__, "workers": 0, "steps": 3, "epochs": 2, "recipe_variants": variants})
    s.reference_epochs = 3
    threads = torch.get_num_threads()
    out = gpu.recipe(s)
    assert torch.get_num_threads() == threads  # the one-thread variant put the count back
    assert out["image_size"] == 32 and out["device_augment_device"] == "cpu"
    assert out["img_s"] > 0 and out["synthetic_img_s"] > 0 and out["device_augment_ms_per_batch"] > 0
    assert out["fed_ratio"] == pytest.approx(out["img_s"] / out["synthetic_img_s"])
    # torchvision's reference loader of the recipe, fed to the same model for its own number of epochs
    ref = out["reference"]
    assert ref["img_s"] > 0 and ref["epochs"] == 3 and ref["timed_steps"] == 2 * 3
    assert out["vs_reference"] == pytest.approx(out["img_s"] / ref["img_s"])
    # where the host's time went: the augmentation hook ran on every training batch, on the batches' device
    host = out["host"]
    assert host["augment_batch_devices"] == ["cpu"] and host["augment_host_ms_median"] > 0
    assert host["training_process_cores"] > 0 and host["torch_threads"] == threads  # a CPU run: no cap
    assert (
        host["timeline_ms"]["step"] > 0 and host["timeline_ms"]["augment"] > 0 and "gpu_step" not in host["timeline_ms"]
    )
    busiest = host["busiest_threads"]  # [name, CPU seconds] of the training process's busiest threads
    assert busiest[0][2] > 0 and all(isinstance(name, str) for name, *_ in busiest)
    assert "profile" not in host and "ops" not in host  # the timed fit carries neither profiler nor recorder
    # the untimed diagnose fit: the profiler's table of the second epoch, the recorder's rows of the first
    d = out["diagnose"]
    assert any("Self CPU" in line for line in d["profile"])
    assert d["ops_by_device"]["cpu"] > 0 and {"op", "device", "frame", "calls", "max_elements"} <= set(d["ops"][0])
    assert any(r["op"] == "convolution" for r in d["ops"])  # the model's forward, recorded in the training thread
    assert d["waits"] == {}  # on a CPU nothing waits for a device (on a GPU: each call that made the host wait)
    # --recipe-variants: the recipe less a piece, here all but the crop and flip (no keys, so no augmentation hook)
    variant, one_thread, all_threads = out["variants"]
    assert variant["variant"] == "crop-flip-only" and variant["img_s"] > 0 and variant["timed_steps"] == 3
    assert variant["host"]["augment_batch_devices"] == ["cpu"] and "profile" not in variant["host"]
    # the whole recipe with the training process's torch ops on one thread (the recipe's own hook ran)
    assert one_thread["variant"] == "one-torch-thread" and one_thread["host"]["torch_threads"] == 1
    assert all_threads["host"]["torch_threads"] == threads
    phases = {"synthetic_fit", "fed_fit", "reference_fit", "diagnose_fit", "device_cost"}
    assert set(out["phase_seconds"]) == phases | {f"variant {v}" for v in variants}
    table = summary(out)
    assert "torchvision's reference loader" in table and "variant all-torch-threads" in table and "*" in table


def test_the_busiest_threads_are_named_with_their_cpu_seconds() -> None:
    """What the recipe part records of the training process's threads: a thread that burns CPU comes first."""
    from benchmarks.gpu_recipe import busiest_threads, thread_cpu_s

    done = threading.Event()

    def spin() -> None:  # burns CPU until told to stop
        while not done.is_set():
            pass

    before = thread_cpu_s()
    assert before and all(isinstance(name, str) and s >= 0 for name, s in before.values())
    live = threading.Thread(target=spin)
    live.start()
    try:
        deadline = time.monotonic() + 30
        while thread_cpu_s().get(live.native_id or -1, ("", 0.0))[1] < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        rows = busiest_threads(before, thread_cpu_s(), top=1)
    finally:
        done.set()
        live.join()
    name, tid, seconds = rows[0]
    assert tid == live.native_id and seconds >= 0.3 and isinstance(name, str)
    assert len(rows) == 2 and rows[1][0].endswith(" others)") and rows[1][1] is None


def test_the_policy_in_workers_variant_trains_torchvisions_own_policy_in_the_workers(image_folder: Path) -> None:
    """``--recipe-variants policy-in-workers``: the shipped recipe's config less its device policy, which runs as
    torchvision's object per sample in the loader workers (the config's commented block)."""
    from torchvision.transforms import v2

    from benchmarks.gpu_recipe import VARIANTS, check_variants
    from lightning_fastdata import ImageFolderDataModule
    from lightning_fastdata.recipe import load_recipe

    assert check_variants(("policy-in-workers",)) == ("policy-in-workers",)
    made, _ = load_recipe("recipe_torchvision")
    made.pop("image_size")
    args = VARIANTS["policy-in-workers"](dict(made))
    assert "device_transforms" not in args and args["batch_transforms"] is made["batch_transforms"]
    policy = args["train_transforms"]
    assert type(policy) is v2.TrivialAugmentWide and policy.interpolation == v2.InterpolationMode.BILINEAR
    dm = ImageFolderDataModule(str(image_folder), image_size=32, batch_size=4, num_workers=0, val_fraction=0, **args)
    dm.setup("fit")
    images, targets = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32 and targets.shape == (4, 3)  # soft


def test_the_worker_count_variants_train_the_policy_in_the_workers_with_their_count(image_folder: Path) -> None:
    """``policy-in-workers-13w``/``-14w`` (the GPU check's diagnose): the rule that leaves the training process's
    busy threads their CPUs is measured at 13, 14 and 15 workers before it is shipped."""
    from benchmarks.gpu_recipe import _MODULE, VARIANTS
    from lightning_fastdata import ImageFolderDataModule
    from lightning_fastdata.recipe import load_recipe

    made, _ = load_recipe("recipe_torchvision")
    made["image_size"] = 32
    for name, count in (("policy-in-workers-13w", 13), ("policy-in-workers-14w", 14)):
        args = VARIANTS[name](dict(made))
        assert "device_transforms" not in args and args["train_transforms"] is not None
        dm = ImageFolderDataModule(str(image_folder), num_workers=15, **args)
        _MODULE[name](dm)
        assert dm.num_workers == count and dm.transfer.workers(1) == count
