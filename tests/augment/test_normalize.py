"""The CPU normalise: the same bits as a plain conversion, the input's memory format, huge pages advised."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from lightning_fastdata.augment.normalize import Normalizer, advise_huge_pages


def reference(images: torch.Tensor, normalizer: Normalizer) -> torch.Tensor:
    scale, shift = normalizer._constants(images.device)
    return images.to(torch.float32).mul_(scale).add_(shift)


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_large_cpu_batch_is_normalised_bit_for_bit_in_its_memory_format(channels_last: bool) -> None:
    normalizer = Normalizer((0.5, 0.4, 0.3), (0.2, 0.25, 0.3))
    images = torch.randint(0, 256, (64, 3, 96, 96), dtype=torch.uint8)  # 7 MB of float: the huge-page path
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    got = normalizer(images)
    assert got.dtype == torch.float32 and torch.equal(got, reference(images, normalizer))
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert got.is_contiguous(memory_format=fmt)
    assert torch.equal(normalizer.denormalize(got), images)
    # each call writes a new tensor: a batch the caller kept is never overwritten by the next one
    kept = got.clone()
    normalizer(torch.zeros_like(images))
    assert torch.equal(got, kept)


def test_small_and_float_batches_take_the_plain_path() -> None:
    normalizer = Normalizer()
    small = torch.randint(0, 256, (2, 3, 5, 5), dtype=torch.uint8)
    assert torch.equal(normalizer(small), reference(small, normalizer))
    floats = small.float()
    assert normalizer(floats) is floats  # in place, as documented
    assert not advise_huge_pages(torch.empty(1000))


def _vma_flags(address: int) -> list[str]:
    """The ``VmFlags`` of the mapping in /proc/self/smaps that holds ``address``."""
    header = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) ")
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        m = header.match(line)
        if m:
            inside = int(m[1], 16) <= address < int(m[2], 16)
        elif inside and line.startswith("VmFlags:"):
            return line.split(":", 1)[1].split()
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc/self/smaps are Linux's")
def test_the_output_of_a_large_batch_is_advised_huge_pages() -> None:
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.exists() or "[never]" in thp.read_text():
        pytest.skip("this kernel has transparent huge pages off: the advice changes nothing here")
    out = torch.empty((64, 3, 224, 224), dtype=torch.float32)  # 38 MB
    assert advise_huge_pages(out)
    inside = -(-out.data_ptr() // (2 << 20)) * (2 << 20)  # the first 2 MiB boundary inside the tensor
    assert "hg" in _vma_flags(inside)  # the kernel's mark for MADV_HUGEPAGE
    # only whole 2 MiB blocks inside the tensor are advised: the memory before the first boundary is not
    if out.data_ptr() < inside:
        assert "hg" not in _vma_flags(out.data_ptr())
