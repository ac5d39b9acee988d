"""Batches for training and evaluation: a resumable, rank-aware batch sampler and the collate function.

:class:`ResumableBatchSampler` gives every process of a distributed run its share of one seeded
permutation per epoch, strided so that step ``k`` of ``W`` processes with batch ``b`` sees exactly the images
of step ``k`` of one process with batch ``W * b``. ``set_epoch(epoch, start_batch)`` restarts mid-epoch:
a resumed run skips the batches it already trained on and then sees what an uninterrupted run would.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler


class ResumableBatchSampler(Sampler[list[int]]):
    def __init__(
        self,
        dataset_size: int,
        batch_size: int,
        *,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
    ) -> None:
        if dataset_size < num_replicas * batch_size and drop_last:
            raise ValueError(
                f"the dataset has {dataset_size} images, fewer than one global batch "
                f"({num_replicas} process(es) x batch {batch_size})"
            )
        self.dataset_size, self.batch_size = dataset_size, batch_size
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch, self.start_batch = 0, 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.epoch, self.start_batch = epoch, start_batch

    def _indices(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.dataset_size, generator=g).tolist()
        else:
            order = list(range(self.dataset_size))
        global_batch = self.num_replicas * self.batch_size
        if self.drop_last:
            order = order[: len(order) // global_batch * global_batch]
        # without drop_last (evaluation) every image comes once; the last ranks may get one image fewer
        return order[self.rank :: self.num_replicas]

    def batches_per_epoch(self) -> int:
        n = len(self._indices())
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __len__(self) -> int:
        return max(0, self.batches_per_epoch() - self.start_batch)

    def __iter__(self) -> Iterator[list[int]]:
        indices = self._indices()
        for b in range(self.start_batch, self.batches_per_epoch()):
            yield indices[b * self.batch_size : (b + 1) * self.batch_size]


def collate(
    batch: list[tuple[torch.Tensor, dict[str, Any]]],
) -> tuple[torch.Tensor, torch.Tensor, list[dict[str, Any]]]:
    """``[(image [3,H,W], target)] -> (images [B,3,Hmax,Wmax], mask [B,Hmax,Wmax] True=padding, targets)``."""
    from dinops.model import pad_images

    images, targets = zip(*batch, strict=True)
    padded, mask = pad_images(list(images))
    return padded, mask, list(targets)
