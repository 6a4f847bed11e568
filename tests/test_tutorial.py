"""docs/tutorial.md and its two files, examples/my_fedavg.py and
examples/my_fedprox.py: each computes what the built-in of its kind computes
(float64, serial and vectorised engines, stragglers kept or dropped), the
proximal term is declared as the linear term it adds, the page shows the
files' real diff and the real refusal of an option out of range, and its
commands run as written (the simulator, a resume, and a deployment of real
``fedforge server`` and ``fedforge client`` processes on loopback, with
certificates)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import fedforge
from conftest import RunStopped
from fedforge.algorithms import LinearTerm, StepContext, from_config
from fedforge.config import from_dict, override
from fedforge.engines.batched_mlp import Terms, fused_terms
from fedforge.store import RunStore
from fedforge.store.final import load_final
from test_readme_commands import WAIT_EACH, free_port, run_bash, shell_blocks

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TUTORIAL = ROOT / "docs" / "tutorial.md"
SIMULATOR, DEPLOY = "## Run it in the simulator", "## Deploy it"

# six synthetic clients, three a round, two epochs, half of each cohort
# stragglers (one epoch): FedAvg drops their work, FedProx keeps it
SMALL: dict[str, Any] = {
    "dataset": "synthetic",
    "model": "logreg",
    "num_clients": 6,
    "client_fraction": 0.5,
    "rounds": 3,
    "local_epochs": 2,
    "batch_size": 5,
    "lr": 0.1,
    "lr_decay": 0.9,
    "dtype": "float64",
    "target_accuracy": None,
    "stragglers": {"fraction": 0.5},
}
MU = 0.3


@pytest.fixture(scope="module", autouse=True)
def plugins() -> Iterator[None]:
    fedforge.load_plugin(str(EXAMPLES / "my_fedavg.py"))  # imported once a process
    fedforge.load_plugin(str(EXAMPLES / "my_fedprox.py"))
    yield


def _params(engine: str, **fields: Any) -> torch.Tensor:
    cfg = from_dict({**SMALL, "engine": engine, **fields})
    result = fedforge.run(cfg, store=False)
    assert result.summary["engine"] == engine
    return result.params


@pytest.mark.parametrize("engine", ["serial", "vectorized"])
def test_each_plugin_computes_what_the_builtin_computes(engine: str) -> None:
    fedavg = _params(engine, algorithm="fedavg")
    fedprox = _params(engine, algorithm="fedprox", fedprox={"mu": MU})
    assert not torch.allclose(fedavg, fedprox)  # the term and the stragglers show
    assert torch.equal(_params(engine, algorithm="my_fedavg"), fedavg)
    mine = _params(engine, algorithm="my_fedprox", plugin_options={"my_fedprox": {"mu": MU}})
    assert torch.equal(mine, fedprox)


def test_the_proximal_term_is_declared_as_the_term_it_adds() -> None:
    cfg = from_dict(
        {**SMALL, "algorithm": "my_fedprox", "plugin_options": {"my_fedprox": {"mu": MU}}}
    )
    hook = from_config(cfg).grad_hook
    assert fused_terms(hook, None) == Terms(mu=MU)  # the fused perceptron step folds it in
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(4, 3, 2, generator=gen, dtype=torch.float64) for _ in range(2)]
    anchor = [torch.randn(1, 3, 2, generator=gen, dtype=torch.float64) for _ in range(2)]
    ctx = StepContext(params, anchor)
    called = [torch.randn(4, 3, 2, generator=gen, dtype=torch.float64) for _ in range(2)]
    expected = [g + MU * (w - w_t) for g, w, w_t in zip(called, params, anchor, strict=True)]
    declared = [g.clone() for g in called]
    assert hook is not None
    hook(called, ctx)
    LinearTerm(proximal=MU)(declared, ctx)
    for a, b, want in zip(called, declared, expected, strict=True):
        assert torch.equal(a, b) and torch.allclose(a, want, rtol=0, atol=1e-15)


def test_the_page_shows_the_files_diff() -> None:
    old, new = (EXAMPLES / n for n in ("my_fedavg.py", "my_fedprox.py"))
    diff = difflib.unified_diff(
        old.read_text().splitlines(),
        new.read_text().splitlines(),
        f"examples/{old.name}",
        f"examples/{new.name}",
        lineterm="",
    )
    [shown] = re.findall(r"```diff\n(.*?)```", TUTORIAL.read_text(), flags=re.S)
    assert shown.splitlines() == list(diff)


def test_the_readme_gives_each_examples_line_count() -> None:
    rows = re.findall(
        r"^\| `examples/(\w+\.py)` \|.*\| (\d+) \|$", (ROOT / "README.md").read_text(), flags=re.M
    )
    counted = {name: len((EXAMPLES / name).read_text().splitlines()) for name, _ in rows}
    assert {name for name, _ in rows} == {p.name for p in EXAMPLES.glob("*.py")}
    assert {name: int(n) for name, n in rows} == counted


def _setup(tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(EXAMPLES)


def test_an_option_out_of_range_is_refused_in_the_line_the_page_shows(tmp_path: Path) -> None:
    section = _section(SIMULATOR)
    [command] = [
        line for b in shell_blocks(section, SIMULATOR) for line in b.splitlines() if "mu=-1" in line
    ]
    [shown] = re.findall(r"```text\n(.*?)\n```", section, flags=re.S)
    _setup(tmp_path)
    done = run_bash(command, tmp_path, timeout=60)
    assert done.returncode == 2
    # the run's banner, then the refusal: one line, no traceback
    assert [x for x in done.stdout.splitlines() if not x.startswith("fedforge: my_fedprox")] == [
        shown
    ]
    assert shown.startswith("fedforge: error: config field 'plugin_options.my_fedprox.mu'")


def _section(title: str) -> str:
    text = TUTORIAL.read_text()
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start : end if end >= 0 else None]


def test_the_simulator_commands_run_and_resume_as_written(
    tmp_path: Path, mnist_dir: Path, run_stopped: RunStopped
) -> None:
    lines = [line for b in shell_blocks(TUTORIAL.read_text(), SIMULATOR) for line in b.splitlines()]
    [run_line] = [x for x in lines if x.startswith("fedforge run") and "mu=-1" not in x]
    [resume_line] = [x for x in lines if x.startswith("fedforge resume")]
    _setup(tmp_path)
    done = run_bash(run_line + " -s rounds=3 -q", tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout
    [whole] = (tmp_path / "runs").iterdir()
    with RunStore.open(whole, read_only=True) as store:
        assert store.status == "finished"
        assert store.config().algorithm == "my_fedprox" and len(store.rounds()) == 3

    # the same run stopped by SIGTERM in its second round, then resumed as the page says
    cfg = override(fedforge.load(EXAMPLES / "my_fedprox.yaml"), {"rounds": 3})
    stopped = run_stopped(override(cfg, {"runs_dir": str(tmp_path / "stopped")}), None, 1)
    assert stopped.stopped == "SIGTERM" and len(stopped.rounds) == 2
    resume = resume_line.replace("runs/RUN", str(stopped.run_dir))
    resumed = run_bash(resume + " -q", tmp_path, timeout=120)
    assert resumed.returncode == 0, resumed.stdout
    assert torch.equal(load_final(stopped.run_dir)["params"], load_final(whole)["params"])


@pytest.mark.slow  # three processes that load torch and MNIST: about 15 s
def test_the_deployment_commands_run_as_written(tmp_path: Path, mnist_dir: Path) -> None:
    [example, *_] = shell_blocks(TUTORIAL.read_text(), DEPLOY)
    for command in ("fedforge certs", "fedforge server --plugin", "fedforge client --plugin"):
        assert command in example
    example = example.replace("50051", str(free_port()))
    example = example.replace("fedforge server ", "fedforge server --set rounds=2 ")
    example = re.sub(r"^wait\b", WAIT_EACH, example, flags=re.M)
    _setup(tmp_path)
    done = run_bash(example, tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout
    [ran] = (tmp_path / "runs").iterdir()
    with RunStore.open(ran, read_only=True) as store:
        assert store.status == "finished", done.stdout
        assert store.config().algorithm == "my_fedprox" and len(store.rounds()) == 2
