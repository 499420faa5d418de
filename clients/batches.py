"""A client's batches: which examples each local step sees, how many steps a round takes, inputs as tensors.

Pure torch and numpy (no Flower); the training loop (``clients/training.py``) and the
personalised evaluation (``clients/evaluation.py``) draw their batches here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch
from torch import Tensor

from strategies.contracts.common import TrainingSettings
from strategies.contracts.models import ModelCard

Batch = tuple[Tensor, Tensor]


def batch_indices(num_examples: int, batch_size: int, steps: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Yield ``steps`` batches of ``min(batch_size, num_examples)`` distinct indices.

    Batches walk through a fresh permutation of the data and start a new one when
    too few indices are left, so every example is seen once per pass.
    """
    size = min(batch_size, num_examples)
    order, cursor = rng.permutation(num_examples), 0
    for _ in range(steps):
        if cursor + size > num_examples:
            order, cursor = rng.permutation(num_examples), 0
        yield order[cursor : cursor + size]
        cursor += size


def batches_of(x: Tensor, y: Tensor, indices: Iterable[np.ndarray]) -> Iterator[Batch]:
    """``(x[idx], y[idx])`` for every index array.

    The indices are drawn all at once, when the first batch is asked for, and sent to
    ``x``'s device in one copy: a copy per step would make a GPU finish each step before
    the next is queued. They are the same indices as drawn one by one, as long as
    nothing else draws from their generator in between (nothing does while training).
    """
    arrays = list(indices)
    if not arrays:
        return
    index = torch.as_tensor(np.concatenate(arrays), device=x.device)
    for part in torch.split(index, [len(a) for a in arrays]):
        yield x[part], y[part]


def round_batches(x: Tensor, y: Tensor, training: TrainingSettings, rng: np.random.Generator, *,
                  batch_size: int | None = None, steps: int | None = None) -> tuple[int, Iterator[Batch]]:  # fmt: skip
    """A round's local steps and their batches: ``local-steps`` (or ``local-epochs``) batches of ``batch-size``.

    ``batch_size`` and ``steps`` override the round's; the batches are drawn from ``rng``
    as :func:`batch_indices` draws them. Every loop over a client's training data takes its
    batches here: the shared SGD (``clients.training.local_sgd``) and the methods with a
    step of their own (APFL, pFedMe).
    """
    num = len(y)
    batch_size = training.batch_size if batch_size is None else batch_size
    if steps is None:
        steps = steps_for(num, batch_size, training.local_steps, training.local_epochs)
    return steps, batches_of(x, y, batch_indices(num, batch_size, steps, rng))


def steps_for(num_examples: int, batch_size: int, local_steps: int, local_epochs: float) -> int:
    """Local SGD steps: ``local_epochs`` passes when positive, else ``local_steps``."""
    if local_epochs > 0:
        per_epoch = -(-num_examples // min(batch_size, num_examples))
        return max(1, int(np.ceil(local_epochs * per_epoch)))
    return local_steps


def to_tensor(
    x: np.ndarray, device: torch.device, normalisation: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())
) -> Tensor:
    """Inputs as float32 on ``device``; uint8 images are scaled to [0, 1], then normalised per channel.

    ``normalisation`` is ``(means, stds)``, one value per channel (dimension 1), from
    the run config's ``input-mean`` and ``input-std``; empty leaves the inputs as they are.

    Raises
    ------
    ValueError
        When the inputs have another number of channels than ``normalisation`` values.

    """
    tensor = torch.from_numpy(np.ascontiguousarray(x))
    tensor = tensor.float().div_(255.0) if tensor.dtype == torch.uint8 else tensor.float()
    means, stds = normalisation
    if means:
        if tensor.dim() < 2 or tensor.shape[1] != len(means):
            raise ValueError(f"run config keys 'input-mean'/'input-std' give {len(means)} channel values, but one "
                             f"input has shape {tuple(tensor.shape[1:])} (channels first)")  # fmt: skip
        shape = (1, len(means)) + (1,) * (tensor.dim() - 2)
        tensor = tensor.sub_(torch.tensor(means).view(shape)).div_(torch.tensor(stds).view(shape))
    return tensor.to(device)


def batch_problem(num: int, sizes: dict[str, int], training: TrainingSettings, card: ModelCard, *,
                  where: str = "") -> str | None:  # fmt: skip
    """Why a client of ``num`` training examples cannot take batches of ``sizes`` (by key), or ``None``.

    An empty training set cannot train; under ``strict-batches`` neither can a batch size
    above ``num`` (otherwise such a batch takes min(b, n) examples); and with a model that
    needs at least ``card.min_batch`` examples a batch (BatchNorm), a batch this training
    set cuts below that, the adaptation's included. ``where`` names the client's data.
    """
    if num == 0:
        return f"this client has no training examples{where}"
    if training.strict_batches:
        for name, size in sizes.items():
            if size > num:
                return f"{name} {size} must be in [1, {num}] (this client's training examples{where}; " \
                       "strict-batches = true)"
    if training.adapt_steps > 0:
        sizes = {**sizes, "adapt-batch-size": training.adapt_batch_size or num}
    for name, size in sizes.items():
        if min(size, num) < card.min_batch:
            return (f"{name} {size}: this client's batches would hold {min(size, num)} example(s) (it has {num}"
                    f"{where}); model {card.name!r} ({card.norm} norm) trains on at least {card.min_batch}")
    return None
