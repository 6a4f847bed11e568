"""Feature-shift partitions: each client's images seen through one domain.

FedBN (Li et al., ICLR 2021) studies feature shift: clients whose label mix may be
the same but whose inputs differ in appearance (in the paper, digits from MNIST,
SVHN, USPS, SynthDigits, MNIST-M). Here the domains are fixed transforms of MNIST,
in pixel space p in [0, 1] (the stored tensors are standardised,
x = (p - 0.1307) / 0.3081, so each transform maps x to pixels and back):

- ``none``: unchanged;
- ``rotation``: rotated by 90 degrees counter-clockwise (``torch.rot90``, exact);
- ``invert``: p -> 1 - p (white digit on black becomes black on white);
- ``contrast``: p -> 0.5 + 0.3 (p - 0.5), a washed-out grey;
- ``blur``: a 5x5 Gaussian blur of sigma 1 (normalised kernel, black border);
- ``noise``: p + N(0, 0.2^2) per pixel, clipped to [0, 1], drawn from
  (seed, "feature-shift", "noise", client);
- ``scale``: the digit at half size (2x2 averages) centred on a black 28x28 canvas.

A domain is one transform for every client it is given to, so clients of one
domain share their input statistics. Domains are dealt over clients in a
balanced way: a permutation of the clients from (seed, "feature-shift") is cut in
turn over the configured domains, so each domain holds floor(N / D) or ceil(N / D)
clients. The label partition (iid, shards, dirichlet, quantity) is untouched: it
composes. The transform is applied to every example the client holds, so its
held-out slices (``evaluation.clients``, the quality weights' validation split) are in
its domain too; the test set stays plain MNIST.

Runs on the simulation host, once per run, before any round.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fedforge.core.errors import PartitionError
from fedforge.core.rng import numpy_rng, torch_generator
from fedforge.data.mnist import MEAN, STD
from fedforge.data.partition import Partition

DOMAINS = ("none", "rotation", "invert", "contrast", "blur", "noise", "scale")
CONTRAST = 0.3  # contrast: the factor around mid-grey
BLUR_SIGMA, BLUR_SIZE = 1.0, 5  # blur: Gaussian sigma (pixels) and kernel width
NOISE_STD = 0.2  # noise: std of the additive Gaussian noise, in pixels


def to_pixels(x: torch.Tensor) -> torch.Tensor:
    """Standardised MNIST values back to pixel intensities in [0, 1]."""
    return x * STD + MEAN


def from_pixels(p: torch.Tensor) -> torch.Tensor:
    """Pixel intensities to the standardised values the models see."""
    return (p - MEAN) / STD


def gaussian_kernel(sigma: float = BLUR_SIGMA, size: int = BLUR_SIZE) -> torch.Tensor:
    """The normalised 1-D Gaussian kernel of ``size`` taps (float64)."""
    d = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    k = torch.exp(-(d**2) / (2 * sigma**2))
    return k / k.sum()


def _blur(p: torch.Tensor) -> torch.Tensor:
    k = gaussian_kernel().to(p.dtype)
    pad = BLUR_SIZE // 2
    out = F.conv2d(p, k.view(1, 1, 1, -1), padding=(0, pad))  # rows, then columns
    return F.conv2d(out, k.view(1, 1, -1, 1), padding=(pad, 0))


def _scale(p: torch.Tensor) -> torch.Tensor:
    small = F.avg_pool2d(p, 2)
    h, w = p.shape[-2] - small.shape[-2], p.shape[-1] - small.shape[-1]
    return F.pad(small, (w // 2, w - w // 2, h // 2, h - h // 2))


def apply_domain(domain: str, x: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
    """``x`` (standardised images ``[N, 1, H, W]``) seen through ``domain``; ``gen``
    draws the ``noise`` domain's noise."""
    if x.ndim != 4:
        raise PartitionError(f"feature shift needs images [N, C, H, W], got shape {tuple(x.shape)}")
    if domain == "none":
        return x.clone()
    if domain == "rotation":  # commutes with the per-pixel standardisation
        return torch.rot90(x, 1, dims=(-2, -1)).contiguous()
    p = to_pixels(x)
    if domain == "invert":
        p = 1.0 - p
    elif domain == "contrast":
        p = 0.5 + CONTRAST * (p - 0.5)
    elif domain == "blur":
        p = _blur(p)
    elif domain == "noise":
        noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
        p = (p + NOISE_STD * noise).clamp_(0.0, 1.0)
    elif domain == "scale":
        p = _scale(p)
    else:
        raise PartitionError(
            f"feature-shift domain {domain!r} is invalid: must be one of "
            + ", ".join(repr(d) for d in DOMAINS)
        )
    return from_pixels(p)


def assign_domains(num_clients: int, domains: Sequence[str], seed: int) -> tuple[str, ...]:
    """Each client's domain: a permutation from (seed, "feature-shift") dealt over
    ``domains`` in turn (balanced to within one client)."""
    if not domains:
        raise PartitionError("feature shift needs at least one domain")
    bad = [d for d in domains if d not in DOMAINS]
    if bad:
        raise PartitionError(
            f"feature-shift domain {bad[0]!r} is invalid: must be one of "
            + ", ".join(repr(d) for d in DOMAINS)
        )
    order = numpy_rng(seed, "feature-shift").permutation(num_clients)
    out = [""] * num_clients
    for rank, client_id in enumerate(order.tolist()):
        out[client_id] = domains[rank % len(domains)]
    return tuple(out)


def shift_features(
    train_x: torch.Tensor, partition: Partition, client_domains: Sequence[str], seed: int
) -> torch.Tensor:
    """A copy of ``train_x`` with each client's rows in its domain (rows no client
    holds stay as they are). Clients' index sets must not overlap."""
    if len(client_domains) != partition.num_clients:
        raise PartitionError(
            f"{len(client_domains)} domains for {partition.num_clients} clients: need one each"
        )
    held = np.concatenate([*partition.client_indices, np.empty(0, dtype=np.int64)])
    if np.unique(held).size != held.size:
        raise PartitionError("feature shift needs clients whose examples do not overlap")
    out = train_x.clone()
    for client_id, (idx, domain) in enumerate(
        zip(partition.client_indices, client_domains, strict=True)
    ):
        if domain == "none" or len(idx) == 0:
            continue
        rows = torch.from_numpy(np.array(idx, dtype=np.int64))
        gen = torch_generator(seed, "feature-shift", "noise", client_id)
        out[rows] = apply_domain(domain, train_x[rows], gen).to(out.dtype)
    return out
