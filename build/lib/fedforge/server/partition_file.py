"""The partition a run trains on, described once at its start: sizes and label
histograms printed and written beside the run store as ``partition.json``. A
deployment server whose clients bring their own data knows only the counts they
declared when they joined: no histograms, heterogeneity unknown (NaN)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from fedforge.data import PartitionSummary, summarize
from fedforge.data.federated import FederatedData
from fedforge.server.experiment import Experiment


def partition_summary(exp: Experiment) -> PartitionSummary:
    data = exp.data
    if data.hosted is not None:  # the rows are the clients': their declared counts
        sizes = np.asarray(exp.client_sizes(), dtype=np.int64)
        return PartitionSummary(sizes, np.zeros((len(sizes), 0), dtype=np.int64), math.nan)
    return summarize(data.partition, *_class_labels(data), data.domains, data.noisy_clients)


def _class_labels(data: FederatedData) -> tuple[np.ndarray, int]:
    """Each training row's class and the number of classes, for the partition's
    histograms: the labels where a row has one class id; one class for all
    otherwise (sequences, regression)."""
    classes = data.classes()
    if data.train_y.dim() == 1 and classes is not None:
        return data.train_y.numpy(), classes
    return np.zeros(len(data.train_y), dtype=np.int64), 1


def write_partition(path: Path, summary: PartitionSummary) -> None:
    """Sizes and per-client label histograms beside the store, for reports; with
    feature shift each client's domain, with label noise the noisy clients' ids."""
    data: dict[str, Any] = {
        "heterogeneity": summary.heterogeneity,
        "sizes": summary.sizes.tolist(),
        "label_counts": summary.label_counts.tolist(),
    }
    if summary.domains is not None:
        data["domains"] = list(summary.domains)
    if summary.noisy_clients is not None:
        data["noisy_clients"] = list(summary.noisy_clients)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)
