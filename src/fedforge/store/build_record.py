"""What a run was built from, beside its store (``build.json``): the flat model's
length and a fingerprint of the data it trained on. Resume compares them with
what it rebuilt, so that a run resumed with other data or another model is
refused instead of its checkpoints being taken for damaged (and the run started
again from round 0 on the wrong data). A sweep compares them before reusing a
point: the same config over other data is another job."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedforge.config import Config
from fedforge.core.errors import StoreError
from fedforge.core.params import ParamSpec
from fedforge.data.partition import Partition

BUILD_NAME = "build.json"
_SAMPLES = 4096  # feature values hashed per tensor, evenly spaced


def _feed(h: Any, t: torch.Tensor, sample: bool) -> None:
    h.update(f"{tuple(t.shape)}{t.dtype};".encode())
    flat = t.detach().reshape(-1)
    if sample and flat.numel() > _SAMPLES:
        flat = flat[:: flat.numel() // _SAMPLES]
    h.update(flat.contiguous().cpu().numpy().tobytes())


def data_fingerprint(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    test_x: torch.Tensor,
    test_y: torch.Tensor,
    partition: Partition,
) -> str:
    """Shapes, dtypes and labels in full, the client split in full, and features
    at 4,096 evenly spaced places per tensor (cheap for MNIST's 47M values: a
    different data set, scaling or split shows; one changed pixel may not)."""
    h = hashlib.blake2b(digest_size=12)
    for t, sample in ((train_x, True), (train_y, False), (test_x, True), (test_y, False)):
        _feed(h, t, sample)
    for idx in partition.client_indices:
        h.update(len(idx).to_bytes(8, "little"))
        h.update(np.ascontiguousarray(idx, dtype=np.int64).tobytes())
    return h.hexdigest()


def model_layout(spec: ParamSpec) -> str:
    """A digest of the flat vector's layout (each tensor's name, shape and kind,
    and ``frozen`` for a frozen parameter; runs recorded before there were frozen
    ones keep their digest): another model under a registered name shows, even
    of the same size, and so does a layer frozen or unfrozen since the start."""
    text = ";".join(
        f"{e.name}:{e.shape}:{e.kind}" + (":frozen" if e.frozen else "") for e in spec.entries
    )
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


# the packages whose versions a run records (those a result depends on)
PACKAGES = ("fedforge", "torch", "numpy", "dp-accounting", "cryptography", "grpcio", "protobuf")


def package_version(name: str) -> str | None:
    """The installed version of package ``name``; None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """The software versions and the machine a run starts on (recorded, not checked:
    a run may be resumed elsewhere)."""
    return {
        "versions": {
            "python": platform.python_version(),
            **{name: package_version(name) for name in PACKAGES},
        },
        "environment": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "processor": platform.processor() or None,
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(),
        },
    }


def write_build(
    run_dir: Path,
    spec: ParamSpec,
    fingerprint: str,
    score_name: str = "accuracy",
    engine: str | None = None,
    plugins: Mapping[str, tuple[str, str]] | None = None,
) -> None:
    """Write ``build.json``: the model's size and layout, the data's fingerprint,
    what the task scores by and the engine (``remote``: a deployment), the
    plugins whose components it names (name -> version, what they provide), and
    the versions and machine it starts with."""
    path = run_dir / BUILD_NAME
    tmp = path.with_suffix(".tmp")
    record = {
        "num_params": spec.size,
        "model_layout": model_layout(spec),
        "score_name": score_name,
        "engine": engine,
        "plugins": {n: list(v) for n, v in (plugins or {}).items()},
    }
    tmp.write_text(json.dumps({**record, "data_fingerprint": fingerprint, **environment()}))
    tmp.replace(path)


def read_build(run_dir: Path) -> dict[str, Any] | None:
    """The run's record, or None for a run written before it existed (or without it)."""
    try:
        record = json.loads((run_dir / BUILD_NAME).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _legacy_change(cfg: Config) -> str | None:
    """Why a run written before ``build.json`` existed trained on data this version
    no longer makes from its config (None: the same data)."""
    syn = cfg.synthetic
    if cfg.dataset == "synthetic" and syn.iid and syn.beta != 0:
        return (
            "its Synthetic-IID data was drawn before fedforge gave every user features "
            f"N(0, Sigma) (it shifted them by synthetic.beta = {syn.beta})"
        )
    return None


def check_plugins(
    run_dir: Path, record: Mapping[str, Any], now: Mapping[str, tuple[str, str]]
) -> None:
    """Refuse to continue ``run_dir`` with other plugins than it started with:
    one it named now missing (a built-in in its place) or of another version, or
    one now providing a component it did not (a run from before the record
    names none and is taken as it is)."""
    then = record.get("plugins")
    if not isinstance(then, dict):
        return
    for name in [*then, *(n for n in now if n not in then)]:
        was, is_ = then.get(name), now.get(name)
        if was is not None and is_ is not None and was[0] == is_[0]:
            continue
        if was is None:
            provides = is_[1] if is_ is not None else "nothing"
            why = f"it did not use plugin {name!r}, which now provides {provides}"
        elif is_ is None:
            why = f"it used plugin {name!r} version {was[0]} ({was[1]}), not loaded now"
        else:
            why = f"it used plugin {name!r} version {was[0]}, now {is_[0]} ({was[1]})"
        raise StoreError(
            f"run '{run_dir}' cannot be resumed as it started: {why}; resume it with the "
            "plugins it started with (--plugin, the config's plugins)"
        )


def check_build(
    run_dir: Path,
    spec: ParamSpec,
    fingerprint: str,
    cfg: Config,
    plugins: Mapping[str, tuple[str, str]] | None = None,
) -> None:
    """Refuse to continue ``run_dir`` with a model of another length, other data
    or other plugins. A run from before ``build.json`` is taken as it is (and
    gets one) unless its config's data changed since."""
    record = read_build(run_dir)
    if record is None:
        change = _legacy_change(cfg)
        if change is not None:
            raise StoreError(f"run '{run_dir}' cannot be resumed: {change}; run it again")
        write_build(run_dir, spec, fingerprint, plugins=plugins)
        return
    if record.get("num_params") != spec.size:
        raise StoreError(
            f"run '{run_dir}' trained a model of {record.get('num_params')} parameters; this "
            f"build has {spec.size}: resume it with the model and data it started with"
        )
    if record.get("model_layout", model_layout(spec)) != model_layout(spec):
        raise StoreError(
            f"run '{run_dir}' trained a model of another layout (tensors' names or shapes) "
            f"under the name '{cfg.model}': resume it with the model it started with"
        )
    if record.get("data_fingerprint") != fingerprint:
        raise StoreError(
            f"run '{run_dir}' trained on other data (fingerprint "
            f"{record.get('data_fingerprint')}, this data's {fingerprint}): resume it with the "
            "data it started with (fedforge.resume(path, data=...) for data passed to run())"
        )
    check_plugins(run_dir, record, plugins or {})


def same_build(run_dir: Path, fingerprint: str, cfg: Config) -> bool:
    """Whether ``run_dir`` trained on data of this fingerprint (for a run from
    before ``build.json``: whether its config still makes the same data)."""
    record = read_build(run_dir)
    if record is None:
        return _legacy_change(cfg) is None
    return record.get("data_fingerprint") == fingerprint
