"""The device ops and policies against torchvision's own, op by op; key-derived randomness; repeated augmentation."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torchvision.io import decode_jpeg, read_file
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from lightning_fastdata.augment import ColorJitter, RandAugment, RandomErasing, TrivialAugmentWide, keyed, ops
from lightning_fastdata.augment.batched import to_batched
from lightning_fastdata.augment.keyed import sample_seed, uniforms
from lightning_fastdata.loading.sampler import EpochSampler


@pytest.fixture(scope="module")
def batch(image_folder: Path) -> torch.Tensor:
    """Twelve decoded photo-like JPEGs, 64 x 64 (square: rotations by 90 degrees are transposes)."""
    files = sorted(image_folder.glob("*/*.jpg"))[:12]
    return torch.stack([F.center_crop(decode_jpeg(read_file(str(p))), [64, 64]) for p in files])


def each(fn, images: torch.Tensor, params: list) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return torch.stack([fn(img, p) for img, p in zip(images, params)])


def test_colour_and_histogram_ops_equal_torchvision_bit_for_bit(batch: torch.Tensor) -> None:
    n = len(batch)
    factor = torch.linspace(0.01, 1.99, n)
    f = factor.tolist()
    assert torch.equal(ops.adjust_brightness(batch, factor), each(F.adjust_brightness, batch, f))
    assert torch.equal(ops.adjust_saturation(batch, factor), each(F.adjust_saturation, batch, f))
    assert torch.equal(ops.adjust_contrast(batch, factor), each(F.adjust_contrast, batch, f))
    assert torch.equal(ops.adjust_sharpness(batch, factor), each(F.adjust_sharpness, batch, f))
    bits = torch.arange(n) % 9
    assert torch.equal(ops.posterize(batch, bits), each(F.posterize, batch, [int(b) for b in bits]))
    threshold = torch.linspace(0, 255, n)
    assert torch.equal(ops.solarize(batch, threshold), each(F.solarize, batch, threshold.tolist()))
    assert torch.equal(ops.autocontrast(batch), torch.stack([F.autocontrast(i) for i in batch]))
    assert torch.equal(ops.equalize(batch), torch.stack([F.equalize(i) for i in batch]))


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_affine_ops_equal_torchvision(batch: torch.Tensor, interpolation: str) -> None:
    """On a CPU the per-sample grids give torchvision's pixels exactly (on a GPU: see tests/test_cuda.py)."""
    n = len(batch)
    mode = v2.InterpolationMode(interpolation)
    angle = torch.tensor([0.0, 4.5, -90.0, 90.0, 135.0, -30.0, 13.5, 180.0, 270.0, -135.0, 45.0, 1.0])[:n]
    ours = ops.rotate(batch, angle, interpolation=interpolation)
    assert torch.equal(ours, each(lambda i, a: F.rotate(i, a, interpolation=mode), batch, angle.tolist()))
    shift = torch.tensor([[3.0, 0], [0, -7], [32, 0], [-32, 0], [0, 14], [1, 1]] * 2)[:n]
    zeros = torch.zeros(n, 2)
    ours = ops.affine(batch, torch.zeros(n), shift, zeros, interpolation=interpolation)
    ref = each(lambda i, t: F.affine(i, 0.0, [int(t[0]), int(t[1])], 1.0, [0.0, 0.0], interpolation=mode), batch, shift)
    assert torch.equal(ours, ref)
    tangent = torch.linspace(-0.99, 0.99, n)
    degrees = ops.shear_degrees(tangent)
    shear = torch.stack([degrees, torch.zeros_like(degrees)], 1)
    ours = ops.affine(batch, torch.zeros(n), zeros, shear, zeros, fill=128.0, interpolation=interpolation)
    ref = each(
        lambda i, m: F.affine(
            i, 0.0, [0, 0], 1.0, [math.degrees(math.atan(m)), 0.0], interpolation=mode, fill=128.0, center=[0, 0]
        ),
        batch,
        tangent.tolist(),
    )
    assert torch.equal(ours, ref)


def test_erase_equals_torchvision(batch: torch.Tensor) -> None:
    boxes = torch.tensor([[0, 0, 10, 20], [5, 5, 0, 0], [60, 60, 4, 4], [10, 20, 30, 40], [0, 0, 64, 64], [1, 2, 3, 4]])
    images = batch[: len(boxes)]
    ref = torch.stack(
        [F.erase(i, *[int(v) for v in b], v=torch.tensor(7, dtype=torch.uint8)) for i, b in zip(images, boxes)]
    )
    assert torch.equal(ops.erase(images, boxes, 7), ref)
    # the one-mask form a GPU batch takes gives the same pixels (here on the CPU, called directly), in place too
    assert torch.equal(ops.erase_masked(images, boxes, 7), ref)
    copy = images.clone()
    assert ops.erase_masked(copy, boxes, 7, inplace=True) is copy and torch.equal(copy, ref)
    floats = images.float() / 255
    assert torch.equal(ops.erase_masked(floats, boxes, -0.5), ops.erase(floats, boxes, -0.5))


def test_erase_off_the_cpu_is_a_fixed_number_of_ops_whatever_the_boxes() -> None:
    """Per box, three launches (~180 of a 256-image GPU batch with the recipe): one mask instead, off the CPU."""
    from benchmarks.recorder import OpRecorder

    images = torch.empty(256, 3, 32, 32, dtype=torch.uint8, device="meta")
    counts = []
    for erased in (1, 64, 256):
        boxes = torch.tensor([[1, 2, 5, 6]] * erased + [[0, 0, 0, 0]] * (256 - erased))
        with OpRecorder() as rec:
            out = ops.erase(images, boxes, 0)
        assert out.shape == images.shape and out.device.type == "meta"
        counts.append(rec.calls_by_device().get("meta", 0))
    assert counts[0] == counts[1] == counts[2] <= 24, counts  # (20 today, views included)


def keys_of(n: int, epoch: int = 0) -> torch.Tensor:
    return torch.stack([torch.full((n,), epoch), torch.arange(n), torch.zeros(n, dtype=torch.int64)], 1)


@pytest.mark.parametrize("policy", [TrivialAugmentWide(), RandAugment(), TrivialAugmentWide(interpolation="bilinear")])
def test_a_policy_applies_to_each_sample_what_torchvision_applies_with_its_drawn_op(
    batch: torch.Tensor, policy: TrivialAugmentWide
) -> None:
    reference = v2.TrivialAugmentWide(interpolation=v2.InterpolationMode(policy.interpolation))
    keys = keys_of(len(batch), epoch=3)
    ours = policy(batch, keys, 0)
    expected = batch.clone()
    for names, magnitude in policy.params(keys, 0, 64, 64):
        expected = torch.stack(
            [
                reference._apply_image_or_video_transform(img, name, float(m), policy.interpolation, {"others": None})
                for img, name, m in zip(expected, names, magnitude)
            ]
        )
    assert torch.equal(ours, expected)


def test_policies_draw_every_op_and_both_signs_per_sample() -> None:
    names, magnitude = TrivialAugmentWide().params(keys_of(4000), 0, 64, 64)[0]
    assert set(names) == set(v2.TrivialAugmentWide._AUGMENTATION_SPACE)
    rotations = magnitude[[i for i, n in enumerate(names) if n == "Rotate"]]
    assert (rotations > 0).any() and (rotations < 0).any() and rotations.abs().max() <= 135
    rounds = RandAugment(num_ops=2).params(keys_of(500), 0, 64, 64)
    assert len(rounds) == 2 and rounds[0][0] != rounds[1][0]  # two independent draws per sample


def test_a_samples_draw_depends_on_its_key_only() -> None:
    keys = keys_of(64, epoch=2)
    u = uniforms(5, keys, stream=1, count=4)
    assert torch.equal(u[10:20], uniforms(5, keys[10:20], stream=1, count=4))  # not on its batch-mates
    assert torch.equal(u[torch.randperm(64)].sort(0).values, u.sort(0).values)
    assert not torch.equal(u, uniforms(5, keys_of(64, epoch=3), 1, 4))  # another epoch, other numbers
    assert not torch.equal(u, uniforms(6, keys, 1, 4)) and not torch.equal(u, uniforms(5, keys, 2, 4))
    many = uniforms(0, keys_of(20000), 0, 2)
    assert abs(float(many.mean()) - 0.5) < 0.01 and abs(float(torch.corrcoef(many.T)[0, 1])) < 0.03
    assert sample_seed(0, (1, 2, 0)) != sample_seed(0, (1, 2, 1)) and sample_seed(0, (1, 2)) < 2**63


def test_a_samples_seed_is_the_batched_hash_of_its_key() -> None:
    """The per-sample seed (Python ints, the workers' path) is the tensor hash's number for the same key."""
    for seed, key, stream in [(0, (0, 0, 0), 0), (2**40 + 7, (3, 1281166, 2), 0x7F1), (-5, (2**33, 9), 3)]:
        parts = [seed, *key, stream]
        as_tensors = [torch.tensor([[p]]) for p in parts]
        lo, hi = int(keyed._chain(as_tensors)), int(keyed._chain([*as_tensors, torch.tensor([[1]])]))
        assert sample_seed(seed, key, stream) == ((hi & 0x7FFFFFFF) << 32) | lo


def test_keys_on_the_cpu_draw_the_numbers_a_device_draws() -> None:
    """The host's draws (numpy's uint64 hash) are the torch hash's, which runs where the keys are on a GPU."""
    g = torch.Generator().manual_seed(0)
    for n in (1, 5, 300):
        epochs, indices = torch.randint(0, 2**62, (n,), generator=g), torch.randint(0, 10**7, (n,), generator=g)
        keys = torch.stack([epochs, indices, torch.arange(n) % 4], 1)
        for seed in (0, -3, 2**40 + 7, 2**63 - 1, 2**70 + 5):
            for stream, count in ((0x7A1, 3), (0x7A3, 41), (1, 1)):
                device_numbers = keyed._uniforms_torch(seed, keys, stream, count)
                assert torch.equal(uniforms(seed, keys, stream, count), device_numbers)
    odd = torch.tensor([[-1, -5, 0], [-(2**63), 3, -2]])  # not keys we make, but hashed the same way
    assert torch.equal(uniforms(7, odd, 9, 4), keyed._uniforms_torch(7, odd, 9, 4))


class _TorchCalls(TorchFunctionMode):
    """Counts the torch functions and tensor methods called inside it (each one dispatch: a kernel on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        return func(*args, **(kwargs or {}))


def _torch_calls(fn: Any, *args: Any) -> int:
    with _TorchCalls() as counter:
        fn(*args)
    return counter.calls


def test_the_host_work_per_batch_does_not_grow_with_the_batch() -> None:
    """Was: ~2,200 torch calls per batch of 256 for the reference recipe (a per-sample loop reading each op's name,
    a loop per erasing try, ~200 calls per key hash), most of a GPU batch's augmentation time; now the draws take
    the same calls for 16 samples as for 1,024, and a policy a fixed number per op group."""
    counts = {}
    for n in (16, 1024):
        keys = keys_of(n, epoch=2)
        images = torch.randint(0, 256, (n, 3, 24, 24), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))
        ta, ra, jitter = TrivialAugmentWide(), RandAugment(), ColorJitter(0.4, 0.4, 0.4, 0.1)
        counts[n] = [
            _torch_calls(uniforms, 0, keys, 1, 41),
            _torch_calls(ta.params, keys, 0, 24, 24),
            _torch_calls(ra.params, keys, 0, 24, 24),
            _torch_calls(RandomErasing(p=0.5).boxes, keys, 0, 24, 24),
            _torch_calls(jitter.params, keys, 0),
            _torch_calls(ta, images, keys, 0),
            _torch_calls(ra, images, keys, 0),
        ]
    draws = 5
    assert counts[16][:draws] == counts[1024][:draws] and max(counts[16][:draws]) < 100, counts
    # the policies: a fixed number of calls per op group (the 1,024 batch has every group, the 16 one not all)
    assert all(big < small + 300 for small, big in zip(counts[16][draws:], counts[1024][draws:])), counts


def test_random_erasing_draws_a_fitting_box_per_sample_or_none(batch: torch.Tensor) -> None:
    keys = keys_of(2000)
    boxes = RandomErasing(p=0.5).boxes(keys, 0, 64, 64)
    erased = boxes[:, 2] > 0
    assert 0.4 < float(erased.float().mean()) < 0.6
    top, left, h, w = boxes[erased].unbind(1)
    assert bool(((top + h <= 64) & (left + w <= 64) & (h < 64) & (w < 64)).all())
    area = (h * w).double() / 64**2
    assert 0.015 < float(area.min()) and float(area.max()) < 0.36
    assert not bool((RandomErasing(p=0.0).boxes(keys, 0, 64, 64)[:, 2] > 0).any())
    images = batch.float()
    out = RandomErasing(p=1.0, value=0.0)(images, keys_of(len(images)), 0)
    assert bool((out == 0).flatten(1).any(1).all())  # every sample lost a box


def test_two_entries_of_one_transform_draw_independently_and_distinct_ones_as_before(batch: torch.Tensor) -> None:
    """Two ``RandomErasing`` entries erase two boxes (torchvision's two objects do); the first draws as one alone."""
    from lightning_fastdata.augment.pipeline import DeviceAugment

    images, keys = batch.float(), keys_of(len(batch))
    labels = torch.zeros(len(batch), dtype=torch.int64)

    def run(device: list[Any], after: list[Any], given: torch.Tensor = images) -> torch.Tensor:
        return DeviceAugment(device, after, seed=5)(given.clone(), labels, keys, lambda x: x.float())[0]

    one = run([], [RandomErasing(p=1.0, value=-1.0)])
    alone = RandomErasing(p=1.0, value=-1.0)(images, keys, 5)
    assert torch.equal(one, alone)  # a pipeline of distinct transforms: the numbers it always drew
    erasing = RandomErasing(p=1.0, value=-1.0)
    for pair in ([RandomErasing(p=1.0, value=-1.0), RandomErasing(p=1.0, value=-1.0)], [erasing, erasing]):
        two = run([], pair)
        assert bool(((two == -1) & (one != -1)).flatten(1).any(1).all())  # every sample lost a second box
        assert bool(((two == -1) | (one != -1)).all())  # and still the first one
    # distinct kinds in one pipeline keep their own numbers
    policy = TrivialAugmentWide()
    both = run([policy], [RandomErasing(p=1.0, value=-1.0)], batch)
    assert torch.equal(both, RandomErasing(p=1.0, value=-1.0)(policy(batch, keys, 5).float(), keys, 5))


def test_a_policy_whose_table_holds_an_op_without_a_batched_twin_is_refused_when_made() -> None:
    class WithInvented(TrivialAugmentWide):
        space = {**TrivialAugmentWide.space, "Vignette": TrivialAugmentWide.space["Brightness"]}

    with pytest.raises(ValueError, match=r"holds \['Vignette'\], which have no batched op"):
        WithInvented()


def test_torchvisions_objects_become_their_per_sample_twins() -> None:
    twin = to_batched(v2.TrivialAugmentWide(num_magnitude_bins=15, interpolation=v2.InterpolationMode.BILINEAR))
    assert isinstance(twin, TrivialAugmentWide) and twin.num_magnitude_bins == 15 and twin.interpolation == "bilinear"
    twin = to_batched(v2.RandAugment(num_ops=3, magnitude=5))
    assert isinstance(twin, RandAugment) and (twin.num_ops, twin.magnitude) == (3, 5)
    twin = to_batched(v2.RandomErasing(p=0.1, value=0))
    assert isinstance(twin, RandomErasing) and twin.p == 0.1
    with pytest.raises(ValueError, match="value='random'"):
        to_batched(v2.RandomErasing(value="random"))
    mixup = v2.MixUp(alpha=0.2)
    assert to_batched(mixup) is mixup


@pytest.mark.parametrize("world", [1, 2, 3])
def test_repeated_augmentation_deals_each_sample_repeats_times_to_consecutive_ranks(world: int) -> None:
    samplers = [EpochSampler(30, num_replicas=world, rank=r, seed=1, repeats=3) for r in range(world)]
    shares = [list(s) for s in samplers]
    assert all(len(share) == -(-30 // world) for share in shares)  # an epoch keeps its length
    assert all(len(key) == 3 for share in shares for key in share)
    interleaved = [k for pos in zip(*shares) for k in pos]  # rank order, as torchvision deals them
    assert interleaved[:3] == [(0, interleaved[0][1], r) for r in range(3)]  # one sample's repeats side by side
    assert len({(i, r) for _, i, r in interleaved}) == len(interleaved)  # no (sample, repeat) twice


def test_repeated_augmentation_resumes_mid_epoch() -> None:
    sampler = EpochSampler(40, seed=2, repeats=4)
    sampler.set_epoch(1)
    whole = list(sampler)
    it = iter(sampler)
    head = [next(it) for _ in range(13)]
    state = sampler.state_dict()
    resumed = EpochSampler(40, seed=2, repeats=4)
    resumed.load_state_dict(state)
    assert head + list(resumed) == whole
    with pytest.raises(ValueError, match="repeats=4"):
        EpochSampler(40, seed=2).load_state_dict(state)


def test_hue_equals_torchvision(batch: torch.Tensor) -> None:
    shift = torch.linspace(-0.5, 0.5, len(batch))
    assert torch.equal(ops.adjust_hue(batch, shift), each(F.adjust_hue, batch, shift.tolist()))


def test_color_jitter_applies_each_samples_order_and_factors_as_torchvision(batch: torch.Tensor) -> None:
    jitter = to_batched(v2.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1))
    assert isinstance(jitter, ColorJitter)
    keys = keys_of(len(batch), epoch=1)
    order, factors = jitter.params(keys, 0)
    assert len({tuple(o) for o in order.tolist()}) > 1  # not one order for the whole batch
    fns = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
    expected = []
    for i, image in enumerate(batch):
        for k in order[i].tolist():
            image = fns[k](image, float(factors[k][i]))  # type: ignore[index]
        expected.append(image)
    assert torch.equal(jitter(batch, keys, 0), torch.stack(expected))
    b = factors[0]
    assert b is not None and 0.6 <= float(b.min()) and float(b.max()) <= 1.4
    with pytest.raises(ValueError, match="hue values should be between"):
        ColorJitter(hue=(-0.7, 0.2))


def test_repeated_augmentation_continues_an_epoch_on_another_world_size() -> None:
    """2 ranks stopped after 6 keys each, continued on 1 rank: the epoch's (index, repeat) pairs, each once."""
    two = [EpochSampler(30, num_replicas=2, rank=r, seed=4, repeats=3) for r in range(2)]
    taken = [list(s)[:6] for s in two]
    mask = two[0].consumed_mask([6, 6], epoch=0)
    one = EpochSampler(30, seed=4, repeats=3)
    one.continue_epoch(0, mask)
    rest = list(one)
    assert len(rest) == 30 - 12  # the epoch keeps its length: 30 samples in all
    whole = list(EpochSampler(30, seed=4, repeats=3))
    trained = [k[1:] for k in taken[0] + taken[1] + rest]
    assert sorted(trained) == sorted(k[1:] for k in whole) and len(set(trained)) == 30


@pytest.mark.parametrize("size", [(64, 64), (48, 80), (45, 71)])
@pytest.mark.parametrize(
    ("interpolation", "fill", "avx2"),
    [("nearest", None, True), ("nearest", 128, True), ("bilinear", None, True), ("bilinear", None, False)],
)
def test_worker_policies_apply_every_op_at_every_magnitude_as_torchvision(
    batch: torch.Tensor,
    size: tuple[int, int],
    interpolation: str,
    fill: int | None,
    avx2: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker path's faster kernels (C warps, level tables) give torchvision's pixels for every op, bin and sign,
    on square, non-square and odd-sized images (the AVX2 warp's scalar tail), nearest and bilinear, with and without
    a fill, and with the AVX2 bilinear warp switched off (the one-pixel-at-a-time code other CPUs run)."""
    if not avx2:
        monkeypatch.setenv("LIGHTNING_FASTDATA_NO_AVX2", "1")
    from lightning_fastdata._ext.native import imageops_available
    from lightning_fastdata.augment.worker import accelerate

    if not imageops_available():
        pytest.skip("the compiled extension is not built: the worker path is torchvision's own code")
    photo = F.center_crop(batch[3], list(size))
    flat = torch.full_like(photo, 7)  # one level: autocontrast's and equalize's degenerate cases
    channels_last = photo.permute(1, 2, 0).contiguous().permute(2, 0, 1)  # how the workers' crops lie in memory
    cases = [(v2.TrivialAugmentWide, photo), (v2.RandAugment, photo), (v2.TrivialAugmentWide, flat)]
    for cls, image in cases + [(v2.TrivialAugmentWide, channels_last)]:
        reference = cls(interpolation=v2.InterpolationMode(interpolation), fill=fill)
        fast = accelerate(reference)
        assert type(fast) is not cls and isinstance(fast, cls) and type(reference) is cls  # a twin, user's untouched
        fills = reference._fill
        for name, (table, signed) in reference._AUGMENTATION_SPACE.items():
            values = table(31, size[0], size[1])
            mags = [0.0] if values is None else values.tolist()
            for m in mags + ([-v for v in mags] if signed else []):
                ours = fast._apply_image_or_video_transform(image, name, m, reference.interpolation, fills)
                ref = reference._apply_image_or_video_transform(image, name, m, reference.interpolation, fills)
                assert torch.equal(ours, ref), (cls.__name__, name, m)


def test_worker_policies_draw_and_apply_what_torchvision_does_under_the_same_seed(batch: torch.Tensor) -> None:
    """Whole policies, inside Compose and RandomApply, under the same torch seeds: the same images."""
    from lightning_fastdata.augment.worker import accelerate

    pipelines = [
        v2.TrivialAugmentWide(),
        v2.TrivialAugmentWide(interpolation=v2.InterpolationMode.BILINEAR),
        v2.Compose([v2.RandAugment(num_ops=3), v2.RandomApply([v2.AutoAugment()], p=0.7)]),
        v2.AugMix(),
        # every constructor argument carried over to the twin (it is built from the user's object's attributes)
        v2.TrivialAugmentWide(num_magnitude_bins=15, fill=[10, 20, 30]),
        v2.RandAugment(num_ops=1, magnitude=5, num_magnitude_bins=21, interpolation=v2.InterpolationMode.BILINEAR),
        v2.AutoAugment(policy=v2.AutoAugmentPolicy.SVHN),
        v2.AugMix(severity=2, mixture_width=2, chain_depth=1, alpha=0.5, all_ops=False),
    ]
    for pipeline in pipelines:
        fast = accelerate(pipeline)
        if not isinstance(pipeline, v2.Compose):
            assert type(fast) is not type(pipeline) and isinstance(fast, type(pipeline))
            public = {k: v for k, v in vars(pipeline).items() if not k.startswith("_") and k != "training"}
            assert {k: getattr(fast, k) for k in public} == public
        for seed in range(40):
            image = batch[seed % len(batch)]
            torch.manual_seed(seed)
            ref = pipeline(image)
            torch.manual_seed(seed)
            assert torch.equal(fast(image), ref), (type(pipeline).__name__, seed)
    assert accelerate(v2.RandomHorizontalFlip()).__class__ is v2.RandomHorizontalFlip  # others as they are


def test_the_image_kernels_refuse_buffers_smaller_than_the_shape_they_are_given() -> None:
    """The C entry points check every buffer against the shape and strides before touching memory."""
    import numpy as np

    from lightning_fastdata._ext.native import imageops_available, jpegroi

    if not imageops_available():
        pytest.skip("the compiled extension is not built")
    small, big = np.zeros(10, np.uint8), np.zeros(4 * 8 * 8 * 3, np.uint8)
    grid, params = np.zeros(8, np.float32), np.zeros(6, np.float32)
    with pytest.raises(ValueError, match="warp"):
        jpegroi.warp(small, (192, 64, 8, 1), big, (192, 64, 8, 1), (1, 3, 8, 8), grid, grid, params, 0, True)
    with pytest.raises(ValueError, match="warp"):  # strides that reach past the buffer
        jpegroi.warp(big, (192, 640, 8, 1), big, (192, 64, 8, 1), (1, 3, 8, 8), grid, grid, params, 0)
    with pytest.raises(ValueError, match="lookup"):
        jpegroi.lookup(big, (64, 8, 1), small, (64, 8, 1), (3, 8, 8), np.zeros(256, np.uint8), 1)
    with pytest.raises(ValueError, match="histogram"):
        jpegroi.histogram(big, (64, 8, 1), (3, 8, 8), np.zeros(10, np.int64))
    with pytest.raises(ValueError, match="transpose"):
        jpegroi.transpose(small, big, 3, 64)
    with pytest.raises(ValueError, match="sharpen"):
        jpegroi.sharpen(big, (64, 8, 1), small, (64, 8, 1), (3, 8, 8), 0.5)
    with pytest.raises(ValueError, match="hue"):
        jpegroi.hue(big, (64, 8, 1), small, (64, 8, 1), (3, 8, 8), 0.1)


def test_the_sharpness_kernel_gives_torchvisions_bytes_and_leaves_it_the_blends_it_cannot_promise(
    batch: torch.Tensor,
) -> None:
    """C sharpen: TrivialAugment's factors on photos, a channels-last view and a 3 x 3 image, against torchvision;
    the factors whose float32 blend could round differently fused and unfused go to torchvision's own code."""
    import numpy as np

    from lightning_fastdata._ext.native import imageops_available
    from lightning_fastdata.augment import worker as fast

    if not imageops_available():
        pytest.skip("the compiled extension is not built")
    photo = F.center_crop(batch[5], [61, 47])
    images = [photo, photo.permute(1, 2, 0).contiguous().permute(2, 0, 1), photo[:, :3, :3].contiguous()]
    ran = 0
    for m in torch.linspace(0.0, 0.99, 31).tolist():
        for factor in (1.0 + m, 1.0 - m):
            for image in images:
                ours = fast._sharpen(image, factor)
                if ours is not None:
                    ran += 1
                    assert torch.equal(ours, F.adjust_sharpness(image, factor)), factor
    assert ran >= 0.8 * 62 * len(images)  # most factors run in C
    assert not fast._blend_is_exact(float(np.float32(-0.55)))  # one that does not: 147 of its pairs differ
    assert fast._sharpen(photo, 1.55) is None and fast._sharpen(photo[:, :2], 1.5) is None  # 2-pixel rows too


def _hue_kernel_equals_torchvision(step: int) -> None:
    """The C hue against torchvision's on every ``step``-th level of each channel (1: all 2^24 colours)."""
    from lightning_fastdata._ext.native import imageops_available
    from lightning_fastdata.augment.kernels import adjust_hue

    if not imageops_available():
        pytest.skip("the compiled extension is not built")
    levels = torch.cat([torch.arange(0, 255, step), torch.tensor([255])]).unique().to(torch.uint8)
    r, g, b = torch.meshgrid(levels, levels, levels, indexing="ij")
    colours = torch.stack([r, g, b]).reshape(3, len(levels), -1)
    for shift in (-0.5, -0.0371, 0.0, 1e-7, 0.05, 0.5):
        assert torch.equal(adjust_hue(colours, shift), F.adjust_hue(colours, shift)), shift


@pytest.mark.slow
def test_the_hue_kernel_gives_torchvisions_bytes_for_all_two_to_the_24_colours() -> None:
    _hue_kernel_equals_torchvision(1)


def test_the_hue_kernel_gives_torchvisions_bytes_on_photos_and_a_grid_of_colours(batch: torch.Tensor) -> None:
    """C hue (torchvision's float32 HSV round trip in one pass): a grid of colours at shifts across -0.5..0.5, and
    photos planar and channels-last, against torchvision's ``adjust_hue`` (every colour: the full run); a grey image
    is left to torchvision."""
    from lightning_fastdata.augment.kernels import adjust_hue

    _hue_kernel_equals_torchvision(3)
    for image, shift in zip(batch, torch.linspace(-0.5, 0.5, len(batch)).tolist()):
        last = image.permute(1, 2, 0).contiguous().permute(2, 0, 1)
        assert torch.equal(adjust_hue(last, shift), F.adjust_hue(image, shift))
        assert adjust_hue(last, shift).stride() == last.stride()
    grey = batch[0, :1]
    assert torch.equal(adjust_hue(grey, 0.2), grey)
    with pytest.raises(ValueError, match="hue_factor"):
        adjust_hue(batch[0], 0.7)
