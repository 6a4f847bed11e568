"""Macro-averaged F1: the mean over classes of 2 TP / (2 TP + FP + FN), each
class's F1 weighing the same whatever its size, so a model that ignores a rare
class scores low even where its accuracy is high. A class neither in the labels
nor among the predictions is left out of the mean (as scikit-learn's
``f1_score(average="macro")`` leaves it out).

    fedforge run --plugin examples/macro_f1.py --config examples/macro_f1.yaml

Named in ``evaluation.metrics``, it is recorded beside the task's accuracy at every
evaluation (the run store's ``eval_metrics`` table). Its statistics are the
confusion matrix, summed over the test set's batches.
"""

from __future__ import annotations

import math

import torch

import fedforge
from fedforge.config.components import ComponentContext


class MacroF1:
    def batch(self, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """counts[c * label + prediction] of rows of logits [B, C]."""
        c = outputs.shape[-1]
        pairs = labels.flatten() * c + outputs.argmax(dim=-1).flatten()
        return torch.bincount(pairs, minlength=c * c).to("cpu", torch.float64)

    def value(self, total: torch.Tensor) -> float:
        c = math.isqrt(len(total))
        confusion = total.view(c, c)  # rows: labels, columns: predictions
        tp = confusion.diagonal()
        predicted, labelled = confusion.sum(dim=0), confusion.sum(dim=1)
        present = (predicted + labelled) > 0
        f1 = 2 * tp / (predicted + labelled)  # 2 TP / (2 TP + FP + FN)
        return float(f1[present].mean())


def macro_f1(context: ComponentContext) -> MacroF1:
    return MacroF1()


fedforge.register_metric("macro_f1", macro_f1)
