"""Tasks (fedforge.tasks): each built-in task's model, loss and metric against hand
computations; a registered regression task trained to the least-squares solution;
Shakespeare with the char-LSTM end to end; the one-line refusals."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import fedforge as ff
from fedforge.config import Config, EvaluationConfig, override
from fedforge.core.dataspec import PAD
from fedforge.core.errors import ConfigError, DataError
from fedforge.core.params import ParamSpec
from fedforge.data import regression
from fedforge.data import shakespeare as sh
from fedforge.data.federated import FederatedData, load_regression
from fedforge.data.partition import Partition
from fedforge.engines.vectorized import unsupported_reason
from fedforge.evaluation.evaluate import evaluate
from fedforge.models import CharLSTM, DataSpec, build_model
from fedforge.tasks import TASKS, Task, resolve_task
from fedforge.tasks.losses import cross_entropy, squared_error, token_cross_entropy

F64 = torch.float64


def _data(x: torch.Tensor, y: torch.Tensor, classes: int | None) -> FederatedData:
    return FederatedData(x, y, x, y, Partition((np.arange(len(x)),)), num_classes=classes)


@pytest.mark.parametrize(
    "task, x, y, classes, out_shape",
    [
        ("mnist-2nn", torch.zeros(3, 1, 28, 28), torch.zeros(3, dtype=torch.int64), 10, (3, 10)),
        ("mnist-cnn", torch.zeros(3, 1, 28, 28), torch.zeros(3, dtype=torch.int64), 10, (3, 10)),
        ("synthetic-logreg", torch.zeros(3, 60), torch.zeros(3, dtype=torch.int64), 10, (3, 10)),
        (
            "shakespeare-lstm",
            torch.zeros(3, 80, dtype=torch.int64),
            torch.zeros(3, 80, dtype=torch.int64),
            65,
            (3, 80, 65),
        ),
        ("linear-regression", torch.zeros(3, 20), torch.zeros(3), None, (3,)),
    ],
)
def test_each_built_in_task_sizes_its_model_from_the_data(
    task: str, x: torch.Tensor, y: torch.Tensor, classes: int | None, out_shape: tuple[int, ...]
) -> None:
    cfg = Config(task=task)
    resolved = resolve_task(cfg)
    data = _data(x, y, classes)
    resolved.check_labels(data)
    model = resolved.build_model(cfg, data.spec(), torch.float32)
    assert tuple(model(x).shape) == out_shape
    losses = resolved.loss()(model(x), y)
    assert losses.shape == (3,) and torch.isfinite(losses).all()


def test_a_task_names_its_data_set_and_model_and_refuses_a_disagreeing_one() -> None:
    cfg = Config(task="shakespeare-lstm", partition=ff.PartitionConfig(kind="natural"))
    assert (cfg.dataset, cfg.model) == ("shakespeare", "char_lstm")
    assert Config(dataset="synthetic", model="logreg").task is None  # the shorthand stays
    with pytest.raises(ConfigError, match="model = '2nn' disagrees with task = 'mnist-cnn'"):
        Config(task="mnist-cnn", model="2nn")


def test_losses_against_hand_computations() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 0.0]], dtype=F64)
    got = cross_entropy(logits, torch.tensor([0, 1]))
    assert torch.allclose(got, torch.tensor([math.log(1 + math.exp(-2)), math.log(2)], dtype=F64))
    # a sequence row of 2 steps, the second padding: its loss is the first step's over 2
    seq = torch.tensor([[[2.0, 0.0], [5.0, -5.0]]], dtype=F64)
    got = token_cross_entropy(seq, torch.tensor([[0, PAD]]))
    assert torch.allclose(got, torch.tensor([math.log(1 + math.exp(-2)) / 2], dtype=F64))
    got = squared_error(
        torch.tensor([[1.0], [3.0]], dtype=F64), torch.tensor([0.0, 1.0], dtype=F64)
    )
    assert got.tolist() == [1.0, 4.0]


class _Fixed(nn.Module):
    """Returns the given outputs, whatever the input (a hand-made prediction)."""

    def __init__(self, outputs: torch.Tensor) -> None:
        super().__init__()
        self.outputs = outputs
        self.unused = nn.Parameter(torch.zeros(1, dtype=outputs.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outputs[x.flatten(1)[:, 0].long()]


def _score(task: Task, outputs: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    model = _Fixed(outputs)
    spec = ParamSpec.of(model)
    rows = torch.arange(len(y), dtype=F64).unsqueeze(1)
    ev = evaluate(model, spec, spec.flatten(model, F64), rows, y, 2, task.scores())
    return ev.accuracy, ev.loss


def test_token_accuracy_counts_every_scored_character_once() -> None:
    # two rows of 3 steps over 2 classes; the last step of row 1 is padding
    logits = torch.tensor(
        [[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0], [9.0, 0.0]]], dtype=F64
    )
    y = torch.tensor([[0, 0, 0], [1, 0, PAD]])
    acc, loss = _score(Task("t", "sequence"), logits, y)
    assert acc == 3 / 5  # hits: (0,0), (0,2), (1,0); misses (0,1), (1,1)
    hit, miss = math.log(1 + math.exp(-1)), math.log(1 + math.exp(1))
    assert loss == pytest.approx((3 * hit + 2 * miss) / 5, rel=1e-12)


def test_regression_scores_r2_and_mse() -> None:
    pred = torch.tensor([1.0, 2.0, 2.0, 5.0], dtype=F64)
    y = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64)
    r2, mse = _score(Task("r", "regression"), pred, y)
    assert mse == pytest.approx(2 / 4)  # squared errors 0, 0, 1, 1
    assert r2 == pytest.approx(1 - 2 / 5)  # SST: 2.25 + 0.25 + 0.25 + 2.25


def test_a_registered_regression_task_reaches_the_least_squares_solution(tmp_path: Path) -> None:
    data64 = regression.generate(5, seed=3)
    sizes = [90, 150, 200, 260, 300]  # unbalanced clients
    bounds = np.cumsum([0, *sizes])
    parts = tuple(np.arange(bounds[k], bounds[k + 1]) for k in range(5))

    def load(cfg: Config) -> FederatedData:
        return FederatedData(
            data64.train_x, data64.train_y, data64.test_x, data64.test_y, Partition(parts)
        )

    task = Task("my-regression", "regression", model=lambda s: nn.Linear(s.input_features, 1))
    ff.register_task(Task(task.name, task.kind, task.model, load))
    try:
        cfg = Config(
            task="my-regression",
            algorithm="fedsgd",
            num_clients=5,
            client_fraction=1.0,
            lr=0.4,
            rounds=60,
            target_accuracy=None,
            evaluation=EvaluationConfig(every=60),
            dtype="float64",
            engine="serial",
            runs_dir=str(tmp_path),
        )
        result = ff.run(cfg)
    finally:
        TASKS.pop("my-regression")
    # FedSGD over all clients, weighted by their rows, is gradient descent on the
    # mean squared error of all 1,000 training rows: its fixed point is least squares
    weight, bias = regression.least_squares(data64.train_x, data64.train_y)
    params = result.params
    assert torch.allclose(params[:20], weight, atol=1e-9)
    assert params[20].item() == pytest.approx(bias, abs=1e-9)
    assert result.rounds[-1].test_accuracy > 0.99  # R^2 of a 0.1-noise linear fit


def test_the_built_in_regression_task_runs_vectorised() -> None:
    cfg = Config(
        task="linear-regression",
        num_clients=4,
        client_fraction=1.0,
        algorithm="fedsgd",
        lr=0.4,
        rounds=40,
        target_accuracy=None,
        evaluation=EvaluationConfig(every=40),
        dtype="float64",
        engine="vectorized",
    )
    result = ff.run(cfg, store=False)
    data = load_regression(cfg)
    weight, bias = regression.least_squares(data.train_x, data.train_y)
    assert torch.allclose(result.params[:20], weight, atol=1e-8)
    assert result.params[20].item() == pytest.approx(bias, abs=1e-8)


PLAY = (
    "\n\n".join(
        f"ROLE{k % 3}:\n" + "\n".join("to be or not to be that is the question" for _ in range(4))
        for k in range(9)
    )
    + "\n"
)


def _play_run(**fields: object) -> tuple[Config, FederatedData]:
    """A config of the play's three roles, all in each round, and the play's data."""
    play = sh.build_shakespeare(PLAY)
    data = FederatedData(
        play.train_x, play.train_y, play.test_x, play.test_y, play.partition, num_classes=22
    )
    base = Config(
        task="shakespeare-lstm",
        partition=ff.PartitionConfig(kind="natural"),
        num_clients=3,
        client_fraction=1.0,
        target_accuracy=None,
    )
    return override(base, fields), data


def test_a_sequence_task_learns_a_play_end_to_end(tmp_path: Path) -> None:
    # the shakespeare-lstm task's data path, loss and per-token metric with a small
    # char-LSTM (hidden 32, one layer) so that the run takes seconds: the play repeats
    # one line, which a model that reads the characters so far learns to continue
    task = Task("small-lstm", "sequence", model=lambda s: CharLSTM(s.outputs, 8, 32, 1))
    cfg, data = _play_run(batch_size=2, local_epochs=5, lr=3.0, rounds=4, engine="serial")
    cfg = override(cfg, {"runs_dir": str(tmp_path)})
    result = ff.run(cfg, data=data, task=task)
    last = result.rounds[-1]
    assert last.test_accuracy is not None and last.test_loss is not None
    assert last.test_loss < 0.3 * math.log(22)  # far below a uniform guess over 22 chars
    assert last.test_accuracy > 0.9


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"task": "shakespeare-lstm", "robust": {"attack": "label_flip"}}, "flips class ids"),
        ({"task": "linear-regression", "partition": {"kind": "shards"}}, "deals classes"),
        (
            {"task": "linear-regression", "aggregation": {"weights": "class"}},
            "weighs clients by class",
        ),
        ({"dataset": "shakespeare", "model": "cnn"}, "does not fit dataset 'shakespeare'"),
        ({"partition": {"kind": "natural"}}, "dataset 'mnist' has none"),
        ({"task": ""}, "must be a task name"),
    ],
)
def test_combinations_that_cannot_run_are_refused_in_one_line(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        override(Config(), fields)
    assert "\n" not in str(info.value)


def test_an_unknown_task_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="task 'nope' is unknown; built in: mnist-2nn"):
        resolve_task(Config(task="nope"))


def test_labels_of_the_wrong_kind_are_refused_in_one_line() -> None:
    x = torch.zeros(4, 20)
    with pytest.raises(DataError, match="regression: train_y must hold float targets"):
        Task("r", "regression").check_labels(_data(x, torch.zeros(4, dtype=torch.int64), None))
    with pytest.raises(DataError, match=r"predicts sequences: train_y must be \[rows, steps\]"):
        Task("s", "sequence").check_labels(_data(x, torch.zeros(4, dtype=torch.int64), 3))


def test_the_vectorised_engine_names_why_it_refuses_an_lstm() -> None:
    reason = unsupported_reason(build_model("char_lstm", 0, data=_lstm_spec()))
    assert reason == "module 'lstm' is a recurrent layer, which torch.func.vmap cannot batch"


def _lstm_spec() -> DataSpec:
    return DataSpec((80,), torch.int64, (80,), 65)


def test_a_sequence_model_without_recurrence_runs_vectorised_as_serially() -> None:
    class Bigram(nn.Module):  # the next character from the current one alone
        def __init__(self, vocab: int) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, 8)
            self.out = nn.Linear(8, vocab)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.embed(x))

    task = Task("bigram", "sequence", model=lambda s: Bigram(s.outputs))
    cfg, data = _play_run(batch_size=2, lr=0.5, rounds=2, dtype="float64")
    serial = ff.run(override(cfg, {"engine": "serial"}), data=data, task=task, store=False)
    vector = ff.run(override(cfg, {"engine": "vectorized"}), data=data, task=task, store=False)
    assert torch.allclose(serial.params, vector.params, rtol=0, atol=1e-9)


def _regression_task() -> Task:
    def load(cfg: Config) -> FederatedData:
        d = regression.generate(4, seed=1)
        parts = tuple(np.arange(k * 200, (k + 1) * 200) for k in range(4))
        return FederatedData(d.train_x, d.train_y, d.test_x, d.test_y, Partition(parts))

    return Task("own-regression", "regression", model="linear", data_fn=load)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"partition": {"label_noise": 0.5}}, "flips class ids"),
        ({"robust": {"attack": "label_flip", "attack_fraction": 0.25}}, "flips class ids"),
        ({"aggregation": {"weights": "class"}}, "weighs clients by class"),
        ({"communication": {"groups": 2, "group_by": "label"}}, "groups clients by class"),
    ],
)
def test_class_features_are_refused_for_a_task_of_the_callers(
    fields: dict[str, object], message: str
) -> None:
    cfg = override(Config(num_clients=4, dtype="float64", rounds=1), fields)
    with pytest.raises(ConfigError, match=message) as info:
        ff.run(cfg, task=_regression_task(), store=False)
    assert "real-valued targets" in str(info.value) and "\n" not in str(info.value)


def test_a_registered_task_may_name_a_built_in_model() -> None:
    ff.register_task(_regression_task())
    try:
        cfg = Config(task="own-regression", model="linear", num_clients=4, dtype="float64")
        assert cfg.model == "linear"
    finally:
        TASKS.pop("own-regression")


def test_the_last_said_of_task_and_model_wins_in_an_override() -> None:
    two = Config(task="mnist-2nn")
    own = override(two, {"model": "cnn"})
    assert (own.task, own.model) == (None, "cnn")
    other = override(two, {"task": "synthetic-logreg"})
    assert (other.task, other.dataset, other.model) == ("synthetic-logreg", "synthetic", "logreg")
    with pytest.raises(ConfigError, match="dataset = 'mnist' disagrees with task"):
        ff.config.from_dict({"task": "shakespeare-lstm", "dataset": "mnist"})


def test_r2_is_about_each_targets_own_mean() -> None:
    # two targets a row; predicting each column's mean explains nothing: R^2 = 0
    y = torch.tensor([[0.0, 100.0], [2.0, 104.0]], dtype=F64)
    r2, mse = _score(Task("r", "regression"), y.mean(dim=0).expand(2, 2).clone(), y)
    assert r2 == pytest.approx(0.0, abs=1e-12) and mse == pytest.approx((1 + 4) / 2)
    constant = torch.tensor([3.0, 3.0], dtype=F64)
    assert _score(Task("r", "regression"), constant, constant)[0] == 1.0
