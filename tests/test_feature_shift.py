"""Issue 4 data: feature-shift partitions (FedBN's domains), against hand-made images."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.conftest import TINY_LOGREG, MakeData

from fedforge.config import from_dict
from fedforge.core.errors import ConfigError, PartitionError
from fedforge.core.rng import torch_generator
from fedforge.data import load_mnist, make_partition, summarize
from fedforge.data.federated import FederatedData, load_federated_data
from fedforge.data.mnist import MEAN, STD
from fedforge.data.shift import DOMAINS, apply_domain, assign_domains, shift_features
from fedforge.server.experiment import build
from fedforge.server.loop import run

F64 = torch.float64


def pixels_to_x(p: torch.Tensor) -> torch.Tensor:
    return (p - 0.1307) / 0.3081  # MNIST's standardisation, written out


def x_to_pixels(x: torch.Tensor) -> torch.Tensor:
    return x * 0.3081 + 0.1307


def random_images(n: int = 5, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return pixels_to_x(torch.rand(n, 1, 28, 28, generator=gen, dtype=F64))


def test_standardisation_constants_are_mnists() -> None:
    assert (MEAN, STD) == (0.1307, 0.3081)


def test_rotation_is_rot90_and_none_is_identity() -> None:
    x = random_images()
    assert torch.equal(apply_domain("rotation", x), torch.rot90(x, 1, dims=(2, 3)))
    # a pixel at row 0, column 27 (top right) goes to row 0, column 0 (top left)
    p = torch.zeros(1, 1, 28, 28, dtype=F64)
    p[0, 0, 0, 27] = 1.0
    out = x_to_pixels(apply_domain("rotation", pixels_to_x(p)))
    assert out[0, 0, 0, 0] == pytest.approx(1.0) and out.sum() == pytest.approx(1.0)
    assert torch.equal(apply_domain("none", x), x)


def test_invert_is_one_minus_pixel() -> None:
    x = random_images()
    got = apply_domain("invert", x)
    assert torch.allclose(x_to_pixels(got), 1.0 - x_to_pixels(x), atol=1e-12)
    # in standardised space: x -> (1 - 2 * 0.1307) / 0.3081 - x
    assert torch.allclose(got, (1 - 2 * 0.1307) / 0.3081 - x, atol=1e-12)


def test_contrast_by_hand() -> None:
    p = torch.tensor([0.0, 0.5, 1.0, 0.25], dtype=F64).view(1, 1, 2, 2)
    got = x_to_pixels(apply_domain("contrast", pixels_to_x(p))).flatten()
    want = torch.tensor([0.35, 0.5, 0.65, 0.425], dtype=F64)  # 0.5 + 0.3 (p - 0.5)
    assert torch.allclose(got, want, atol=1e-12)


def test_blur_of_one_white_pixel_is_the_gaussian() -> None:
    p = torch.zeros(1, 1, 28, 28, dtype=F64)
    p[0, 0, 14, 14] = 1.0
    got = x_to_pixels(apply_domain("blur", pixels_to_x(p)))[0, 0]
    taps = [math.exp(-(d * d) / 2.0) for d in (-2, -1, 0, 1, 2)]  # sigma 1, 5 taps
    k = [t / sum(taps) for t in taps]
    for dr in range(-3, 4):
        for dc in range(-3, 4):
            want = k[dr + 2] * k[dc + 2] if abs(dr) <= 2 and abs(dc) <= 2 else 0.0
            assert float(got[14 + dr, 14 + dc]) == pytest.approx(want, abs=1e-12)
    assert float(got.sum()) == pytest.approx(1.0)  # away from the border, mass is kept


def test_scale_is_half_size_centred() -> None:
    p = torch.ones(1, 1, 28, 28, dtype=F64)
    p[0, 0, 0, 0] = p[0, 0, 0, 1] = 0.0  # the top-left 2x2 block averages to 0.5
    got = x_to_pixels(apply_domain("scale", pixels_to_x(p)))[0, 0]
    want = torch.zeros(28, 28, dtype=F64)
    want[7:21, 7:21] = 1.0
    want[7, 7] = 0.5
    assert torch.allclose(got, want, atol=1e-12)


def test_noise_is_seeded_gaussian_clipped() -> None:
    p = torch.full((200, 1, 28, 28), 0.5, dtype=F64)
    a = x_to_pixels(apply_domain("noise", pixels_to_x(p), torch_generator(3, "n")))
    b = x_to_pixels(apply_domain("noise", pixels_to_x(p), torch_generator(3, "n")))
    c = x_to_pixels(apply_domain("noise", pixels_to_x(p), torch_generator(4, "n")))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert float(a.min()) >= 0.0 and float(a.max()) <= 1.0
    # N(0, 0.2^2) around 0.5: clipping at 2.5 sigma barely changes the std
    assert float((a - 0.5).std()) == pytest.approx(0.2, rel=0.03)
    assert abs(float((a - 0.5).mean())) < 0.005


def test_unknown_domain_and_bad_shape_are_refused() -> None:
    with pytest.raises(PartitionError, match="'rotate' is invalid: must be one of"):
        apply_domain("rotate", random_images())
    with pytest.raises(PartitionError, match="images"):
        apply_domain("invert", torch.zeros(3, 60))


def test_domains_are_balanced_and_seeded() -> None:
    got = assign_domains(10, ["rotation", "invert", "blur"], seed=1)
    assert sorted(Counter(got).values()) == [3, 3, 4]
    assert got == assign_domains(10, ["rotation", "invert", "blur"], seed=1)
    assert got != assign_domains(10, ["rotation", "invert", "blur"], seed=2)
    every = assign_domains(len(DOMAINS), DOMAINS, seed=0)
    assert sorted(every) == sorted(DOMAINS)


def test_shift_features_transforms_each_clients_rows(make_data: MakeData) -> None:
    data = make_data([4, 3, 5], dtype=F64)
    domains = ("invert", "none", "noise")
    out = shift_features(data.train_x, data.partition, domains, seed=7)
    for client_id, domain in enumerate(domains):
        rows = torch.tensor(data.partition.client_indices[client_id])
        gen = torch_generator(7, "feature-shift", "noise", client_id)
        assert torch.equal(out[rows], apply_domain(domain, data.train_x[rows], gen))
    with pytest.raises(PartitionError, match="one each"):
        shift_features(data.train_x, data.partition, ("invert",), seed=7)


BASE: dict[str, Any] = {**TINY_LOGREG, "num_clients": 3}


def test_build_puts_each_client_in_its_domain(make_data: MakeData, tmp_path: Path) -> None:
    data = make_data([6, 6, 6], dtype=F64)
    shifted = {"feature_shift": ["invert", "rotation", "none"]}
    cfg = from_dict(
        {**BASE, "partition": shifted, "evaluation": {"clients": True}, "runs_dir": str(tmp_path)}
    )
    exp = build(cfg, data)
    domains = assign_domains(3, ["invert", "rotation", "none"], cfg.seed)
    assert exp.data.domains == domains
    for client_id, domain in enumerate(domains):
        # training data and the held-out slice alike are in the client's domain
        for idx in (exp.data.partition, exp.data.holdout):
            assert idx is not None
            rows = torch.tensor(idx.client_indices[client_id])
            assert torch.equal(exp.data.train_x[rows], apply_domain(domain, data.train_x[rows]))
    assert torch.equal(exp.data.test_x, data.test_x)  # the test set stays plain
    assert torch.equal(exp.data.train_y, data.train_y)
    # applied once: building again from the shifted data changes nothing
    assert torch.equal(build(cfg, exp.data).data.train_x, exp.data.train_x)
    result = run(cfg, data=data)
    assert result.run_dir is not None
    written = json.loads((result.run_dir / "partition.json").read_text())
    assert written["domains"] == list(domains)


def test_config_refuses_bad_domains() -> None:
    with pytest.raises(ConfigError, match=r"partition\.feature_shift.*'spin'.*must be one of"):
        from_dict({**BASE, "partition": {"feature_shift": ["spin"]}})
    with pytest.raises(ConfigError, match="each domain once"):
        from_dict({**BASE, "partition": {"feature_shift": ["blur", "blur"]}})
    with pytest.raises(ConfigError, match="needs dataset 'mnist'"):
        from_dict({**BASE, "dataset": "synthetic", "partition": {"feature_shift": ["blur"]}})
    with pytest.raises(ConfigError, match="must be a list"):
        from_dict({**BASE, "partition": {"feature_shift": 3}})
    # the command line's comma form
    cfg = from_dict({**BASE, "partition": {"feature_shift": "blur, scale"}})
    assert cfg.partition.feature_shift == ("blur", "scale")


def test_composes_with_shards_on_real_mnist(mnist_dir: Path, one_thread: None) -> None:
    cfg = from_dict(
        {
            "data_dir": str(mnist_dir),
            "model": "2nn",
            "num_clients": 20,
            "partition": {"kind": "shards", "feature_shift": ["rotation", "invert"]},
        }
    )
    data = load_federated_data(cfg)  # plain MNIST, split in shards: build shifts it
    exp = build(cfg, data)
    labels = data.train_y.numpy()
    # the label partition is the configured shards, untouched by the shift
    want = make_partition(cfg.partition, 20, load_mnist(mnist_dir).train_y.numpy(), cfg.seed)
    for got, ref in zip(exp.data.partition.client_indices, want.client_indices, strict=True):
        assert np.array_equal(got, ref)
    summary = summarize(exp.data.partition, labels, 10, exp.data.domains)
    assert np.array_equal(summary.label_counts, summarize(want, labels, 10).label_counts)
    assert summary.labels_per_client().max() <= 3  # 40 shards of 1500: at most 3 labels
    assert Counter(exp.data.domains or ()) == {"rotation": 10, "invert": 10}
    assert "domains invert x10, rotation x10" in summary.format()
    c = exp.data.domains.index("invert") if exp.data.domains else 0
    rows = torch.tensor(exp.data.partition.client_indices[c])
    assert torch.allclose(
        x_to_pixels(exp.data.train_x[rows]).double(),
        1.0 - x_to_pixels(data.train_x[rows]).double(),
        atol=1e-5,
    )


def test_federated_data_fields_default_to_none(make_data: MakeData) -> None:
    data: FederatedData = make_data([2, 2])
    assert data.domains is None and data.noisy_clients is None


def test_a_shifted_run_says_its_headline_is_of_the_unshifted_test_set(
    make_data: MakeData, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedforge.config.notes import config_notes

    assert config_notes(from_dict({**BASE, "partition": {"feature_shift": ["none"]}})) == []
    (note,) = config_notes(from_dict({**BASE, "partition": {"feature_shift": ["invert", "blur"]}}))
    assert note.startswith("partition.feature_shift = [invert, blur]: the global test accuracy")
    assert "unshifted test set (no client's domain)" in note
    cfg = from_dict(
        {**BASE, "partition": {"feature_shift": ["invert", "none"]}, "runs_dir": str(tmp_path)}
    )
    run(cfg, data=make_data([6, 6, 6], dtype=F64))
    err = capsys.readouterr().err  # the run's start lines
    assert "the unshifted test set (domain 'none', one of 2)" in err
