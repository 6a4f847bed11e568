"""Issue 3's engine contract at full size, on real MNIST (``make test-slow``).

The default suite checks the contract on small synthetic federations; here it
runs the benchmark's own setting: 100 clients of MNIST (IID, or quantity-skewed
with a lognormal spread of sizes), B = 10, E = 1, 3 rounds, float64, so the
clients take tens of steps a round (60 under IID), the regime where float32
trajectories drift apart (by up to 8e-2, the issue measured) and float64 ones
must not (1e-9).
And the server's memory: a cohort of 1,000 needs no more than a cohort of 100,
where keeping the 900 more uploads would need 684 MiB more.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedforge import config as config_mod
from fedforge.data.federated import load_federated_data
from fedforge.server.loop import run

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.mark.parametrize("model", ["2nn", "cnn"])
@pytest.mark.parametrize("partition", ["iid", "quantity"])
def test_vectorized_equals_serial_on_mnist_float64(
    model: str, partition: str, mnist_dir: Path
) -> None:
    cfg = config_mod.Config(
        model=model, num_clients=100, client_fraction=0.05, local_epochs=1, batch_size=10,
        lr=0.05, rounds=3, target_accuracy=None,
        evaluation=config_mod.EvaluationConfig(every=3), dtype="float64",
        data_dir=str(mnist_dir), partition=config_mod.PartitionConfig(kind=partition),
    )  # fmt: skip
    data = load_federated_data(cfg)
    sizes = data.partition.sizes()
    if partition == "quantity":
        assert int(sizes.max()) > 3 * int(sizes.min())  # really uneven
    serial = run(config_mod.override(cfg, {"engine": "serial", "workers": 1}), data, store=False)
    vectorized = run(
        config_mod.override(cfg, {"engine": "vectorized", "workers": 1}), data, store=False
    )
    assert vectorized.summary["engine"] == "vectorized"
    torch.testing.assert_close(vectorized.params, serial.params, rtol=0, atol=1e-9)
    assert vectorized.rounds[-1].test_accuracy == serial.rounds[-1].test_accuracy
    acc = serial.rounds[-1].test_accuracy
    assert acc is not None and acc > 0.5  # the runs really trained


def _run_growth_mib(
    cohort: int, mnist_dir: Path, aggregator: str = "mean", rounds: int = 3
) -> float:
    """In a fresh process: a 2NN federation of 1,000 clients (60 samples each),
    ``rounds`` rounds (three: a round's memory must be reused by the next, which
    once let the peak grow by ~450 MiB, allocator.py) with ``cohort`` clients
    aggregated by ``aggregator``, the bound relative to the round's median norm
    off (with it, the first round holds its updates until their median is known:
    robust/typical_norm.py); how far the
    resident set's peak rises during the run above the resident set once the
    data is loaded (Linux: VmHWM, reset through /proc/self/clear_refs). One torch
    thread, as the suite's other tests."""
    code = f"""
import json, re, torch
torch.set_num_threads(1)
from fedforge import config as c
from fedforge.data.federated import load_federated_data
from fedforge.server.loop import run
def kib(field):
    return int(re.search(field + r':\\s+(\\d+)', open('/proc/self/status').read()).group(1))
cfg = c.Config(model='2nn', num_clients=1000, client_fraction={cohort / 1000}, batch_size=10,
               rounds={rounds}, target_accuracy=None,
               evaluation=c.EvaluationConfig(every={rounds}), engine='vectorized',
               workers=1,
               data_dir={str(mnist_dir)!r},
               robust=c.RobustConfig(aggregator={aggregator!r}, max_norm_multiple=None))
data = load_federated_data(cfg)
with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')
base = kib('VmRSS')
r = run(cfg, data, store=False)
assert r.summary['engine'] == 'vectorized', r.summary['engine']
print(json.dumps({{'growth_mib': (kib('VmHWM') - base) / 1024}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    growth: float = json.loads(out.stdout.strip().splitlines()[-1])["growth_mib"]
    return growth


UPLOADS_MIB = 900 * 199_210 * 4 / 2**20  # 900 more float32 2NN updates: 684 MiB


@pytest.mark.parametrize(("aggregator", "streams"), [("mean", True), ("median", False)])
def test_a_cohort_of_1000_needs_no_more_memory_than_100_when_the_mean_streams(
    aggregator: str, streams: bool, mnist_dir: Path
) -> None:
    """The weighted mean keeps a running sum: O(model). The coordinate-wise median
    needs every update at once, and the same measurement sees it (so it can fail);
    the gathered round holds them once plus the sort's column block (measured
    1.45x the updates; a list of updates and then their stack was 3.35x)."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident set")
    small, large = (_run_growth_mib(c, mnist_dir, aggregator) for c in (100, 1000))
    if streams:
        assert large - small < 0.25 * UPLOADS_MIB, (small, large)  # ~55 MiB, once 105
    else:
        assert 0.8 * UPLOADS_MIB < large - small < 2.0 * UPLOADS_MIB, (small, large)
