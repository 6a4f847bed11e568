"""The index overlap of a round's sparsified uploads (server/index_overlap.py):
the figures of a hand example of 3 clients, and a top-k run's stored rows against
the index sets read from the uploads themselves, streaming and gathered alike."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from tests.conftest import MakeData
from tests.report_pages import read_page
from tests.test_robust_gates import tiny

from fedforge.client.runtime import ClientTask, ClientUpload
from fedforge.communication.bits import decode_indices
from fedforge.communication.sparsify import count_kept
from fedforge.config import override
from fedforge.core import wire
from fedforge.engines.serial import SerialEngine
from fedforge.report.export import gather
from fedforge.report.html import report_html
from fedforge.server.diagnostics import RoundDiagnostics
from fedforge.server.experiment import build
from fedforge.server.index_overlap import IndexOverlap
from fedforge.server.loop import run
from fedforge.store import RunStore

SIZE = 10
SETS = [{0, 1, 2, 3}, {2, 3, 4, 5}, {3, 5, 6, 7}]  # k = 4 each, of P = 10


def _sparse(kept: set[int], size: int = SIZE) -> torch.Tensor:
    x = torch.zeros(size, dtype=torch.float64)
    x[sorted(kept)] = torch.arange(1.0, len(kept) + 1, dtype=torch.float64)
    return x


def test_the_hand_example_of_three_clients() -> None:
    """|S1 & S2| = 2, |S1 & S3| = 1, |S2 & S3| = 2: a mean of 5/3 of k = 4 kept;
    kept by any: 0..7 (8 of 10), by all: 3 alone."""
    overlap = IndexOverlap(SIZE)
    for s in SETS:
        overlap.add(_sparse(s))
    got = overlap.figures()
    assert got["clients"] == 3 and got["kept_mean"] == 4.0
    assert got["pair_overlap"] == pytest.approx((2 + 1 + 2) / 3 / 4)  # 5/12
    assert got["chance"] == pytest.approx(4 / 10)
    assert got["union_fraction"] == pytest.approx(8 / 10)
    assert got["common_fraction"] == pytest.approx(1 / 10)


def test_identical_and_disjoint_sets_and_too_few_uploads() -> None:
    same = IndexOverlap(SIZE)
    for _ in range(3):
        same.add(_sparse({1, 4}))
    assert same.figures()["pair_overlap"] == 1.0 and same.figures()["common_fraction"] == 0.2
    apart = IndexOverlap(SIZE)
    for s in ({0, 1}, {2, 3}, {4, 5}):
        apart.add(_sparse(s))
    assert apart.figures()["pair_overlap"] == 0.0 and apart.figures()["union_fraction"] == 0.6
    alone = IndexOverlap(SIZE)
    alone.add(_sparse({1}))
    assert alone.figures()["pair_overlap"] is None and alone.figures()["kept_mean"] == 1.0
    assert IndexOverlap(SIZE).figures()["kept_mean"] is None


def test_workers_counts_merge_into_the_rounds() -> None:
    """A Ray worker's diagnostics merged into the round's count as if fed there."""
    whole = RoundDiagnostics(SIZE, overlap=True)
    first, second = RoundDiagnostics(SIZE, overlap=True), RoundDiagnostics(SIZE, overlap=True)
    for c, s in enumerate(SETS):
        whole.add(c, _sparse(s), 0.1)
        (first if c == 0 else second).add(c, _sparse(s), 0.1)
    first.merge(second)
    assert first.rows(2)["index_overlap"] == whole.rows(2)["index_overlap"]
    assert "index_overlap" not in RoundDiagnostics(SIZE).rows(2)  # a dense uplink: none


def _pairwise(sets: list[set[int]], size: int) -> tuple[float, float, float, float]:
    """Mean pairwise |S_i & S_j| / k, k / P, union / P, common / P, from the sets."""
    k = sum(len(s) for s in sets) / len(sets)
    pairs = list(itertools.combinations(sets, 2))
    inter = sum(len(a & b) for a, b in pairs) / len(pairs)
    union, common = set().union(*sets), set.intersection(*sets)
    return inter / k, k / size, len(union) / size, len(common) / size


@pytest.mark.parametrize(
    ("aggregator", "local"), [("mean", None), ("median", None), ("mean", "bias")]
)
def test_a_topk_run_stores_the_overlap_of_its_uploads_index_sets(
    make_data: MakeData,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    aggregator: str,
    local: str | None,
) -> None:
    """The streaming mean and the gathered median see the same uploads: the row
    of each round is the figures of the index sets decoded from the uploads.
    With entries kept on the clients (``local_params``), an upload's indices run
    over the shared entries, and so do the fractions."""
    sent: dict[int, list[bytes]] = {}
    honest = SerialEngine.run_cohort

    def cohort(
        self: SerialEngine, tasks: Sequence[ClientTask], payload: bytes
    ) -> Iterator[ClientUpload]:
        for up in honest(self, tasks, payload):
            sent.setdefault(tasks[0].round_idx, []).append(up.data)
            yield up

    monkeypatch.setattr(SerialEngine, "run_cohort", cohort)
    data = make_data([4, 6, 5])
    changes: dict[str, object] = {"communication.uplink": "topk", "communication.fraction": 0.02}
    if local is not None:
        changes["local_params"] = {"names": local}
    cfg = override(tiny(3, rounds=2, tmp=tmp_path, aggregator=aggregator), changes)
    result = run(cfg, data=data)
    size = result.params.numel()
    if local is not None:
        spec = build(cfg, data).spec
        size -= sum(e.numel for e in spec.entries if local in e.name)
    k = count_kept(size, 0.02)
    with RunStore.open(result.run_dir) as store:
        rows = store.read_rows("index_overlap")
    assert [r[0] for r in rows] == [0, 1]
    for r, (_, clients, kept, pair, chance, union, common) in enumerate(rows):
        sets = []
        for data_bytes in sent[r]:
            msg = wire.decode(data_bytes)
            idx = decode_indices(msg.tensors["indices"], msg.meta["index_coding"], k, size)
            sets.append(set(idx.tolist()))
        assert clients == 3 and kept == k
        want = _pairwise(sets, size)
        assert (pair, chance, union, common) == pytest.approx(want, rel=1e-12)
        assert 0 < pair < 1
    with RunStore.open(result.run_dir, read_only=True) as store:
        (tmp_path / "page.html").write_text(report_html(store))
        series = gather(store).series  # and the exports' series
    assert [(x, v) for x, v, _ in series["diagnostics/pair_overlap"]] == [
        (r[0] + 1, r[3]) for r in rows
    ]
    page = read_page(tmp_path / "page.html")  # the report's updates section shows them
    shown = page.data["updates"]["overlap"]
    assert shown["round"] == [1, 2] and shown["pair_overlap"] == [r[3] for r in rows]
    assert shown["union"] == [r[5] for r in rows] and shown["chance"] == [r[4] for r in rows]
    titles = [f["layout"]["title"]["text"] for f in page.figures]
    assert "Index overlap of the uploads" in titles
    last = rows[-1]
    assert f"Index overlap, round 2: 3 uploads of {k} coordinates" in page.text["updates"]
    assert f"shares {last[3]:.3f} of their coordinates" in page.text["updates"]
