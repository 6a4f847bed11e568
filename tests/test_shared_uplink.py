"""The uplink of a model part the clients keep (communication/shared.py): with
FedBN's batch norm or ``local_params`` kept on the clients, an update carries
the shared entries alone, and the server reads the kept ones as zeros."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.conftest import MakeData
from tests.test_param_subsets import BASE as PARAM_SUBSETS_BASE

from fedforge.algorithms.fedbn import local_mask
from fedforge.communication.quantize import Quantize
from fedforge.communication.shared import SharedPart, shared_spec
from fedforge.config import from_dict
from fedforge.core import wire
from fedforge.core.params import ParamSpec
from fedforge.data.federated import FederatedData
from fedforge.models import build_model
from fedforge.pipeline.codec import CodecContext
from fedforge.server.experiment import build
from fedforge.server.loop import run

F64 = torch.float64
BASE: dict[str, Any] = {**PARAM_SUBSETS_BASE, "rounds": 2}


@pytest.fixture
def data(make_data: MakeData, one_thread: None) -> FederatedData:
    return make_data([20, 12, 17, 9, 14], dtype=F64)


def _spec() -> ParamSpec:
    return ParamSpec.of(build_model("cnn_bn", 0, F64), include_buffers=True)


@pytest.mark.parametrize(
    ("extra", "shares"),
    [
        ({"algorithm": "fedbn"}, "weight"),  # FedBN: every weight shared, batch norm kept
        ({"local_params": {"kinds": ["weight"]}}, "batchnorm"),  # share only batch norm
    ],
)
def test_an_update_carries_the_shared_entries_alone(
    data: FederatedData, extra: dict[str, Any], shares: str
) -> None:
    """Each upload is 8 bytes (float64) for each shared entry, plus its header
    (under 1 KiB); the entries counted here from the model's layout."""
    spec = _spec()
    shared = sum(e.numel for e in spec.entries if e.kind == shares)
    result = run(from_dict({**BASE, **extra}), data, store=False)
    for r in result.rounds:
        per_upload = r.bytes_up / r.cohort_size
        assert 8 * shared <= per_upload < 8 * shared + 1024, (per_upload, shared, spec.size)
    if shares == "batchnorm":
        assert result.rounds[0].bytes_up / result.rounds[0].cohort_size < 0.01 * 8 * spec.size


def test_a_per_tensor_codec_sees_the_tensors_it_sends() -> None:
    """int8 with a scale per tensor over the shared part: the same bytes and the
    same decoded values as that codec applied by hand to the shared entries'
    vector with their tensor sizes; zeros where the clients keep theirs."""
    spec = _spec()
    kept = local_mask(spec)
    sent = shared_spec(spec, kept)
    sizes = [e.numel for e in spec.entries if not bool(kept[e.slice].any())]
    assert [e.numel for e in sent.entries] == sizes and sent.size == int((~kept).sum())
    codec = SharedPart.outside(Quantize(8, False, None, sizes), kept)
    delta = torch.randn(spec.size, generator=torch.Generator().manual_seed(3), dtype=F64)
    ctx = CodecContext(0, 1, 2)
    tensors, meta = codec.encode(delta, ctx)
    by_hand = Quantize(8, False, None, sizes)
    want_tensors, want_meta = by_hand.encode(delta[~kept], ctx)
    assert wire.encode(tensors, meta) == wire.encode(want_tensors, want_meta)
    got = codec.decode(tensors, meta, spec.size, F64, ctx)
    assert torch.equal(got[kept], torch.zeros(int(kept.sum()), dtype=F64))
    assert torch.equal(got[~kept], by_hand.decode(want_tensors, want_meta, sent.size, F64, ctx))


def test_error_feedback_keeps_a_residual_of_the_shared_length(data: FederatedData) -> None:
    """Top-k with error feedback under FedBN: the residual table's rows are as long
    as the shared part, and the run's batch norm stays the clients' own."""
    cfg = from_dict(
        {
            **BASE,
            "algorithm": "fedbn",
            "communication": {"uplink": "topk", "fraction": 0.1, "error_feedback": True},
        }
    )
    exp = build(cfg, data)
    kept = local_mask(exp.spec)
    assert exp.communication is not None and exp.communication.client_state is not None
    assert exp.communication.client_state.size == int((~kept).sum())
    result = run(cfg, data, store=False)
    assert torch.equal(result.params[kept], exp.initial_params[kept])
    assert not torch.equal(result.params[~kept], exp.initial_params[~kept])


def test_a_simulated_attacker_re_encodes_through_the_shared_part_without_residuals(
    data: FederatedData,
) -> None:
    """ALIE under FedBN with top-k and error feedback: the server re-encodes each
    attacker's crafted row as the wire would carry it (top-k of the shared
    entries, zeros where the clients keep theirs) and writes no client's
    residual."""
    from fedforge.pipeline.pipeline import CohortUpdates, StageContext
    from fedforge.robust.attacks import Collusion

    cfg = from_dict(
        {
            **BASE,
            "algorithm": "fedbn",
            "communication": {"uplink": "topk", "fraction": 0.1, "error_feedback": True},
            "robust": {"attack": "alie", "attack_fraction": 0.4},
        }
    )
    exp = build(cfg, data)
    (attack,) = [s for s in exp.pipeline.cohort if isinstance(s, Collusion)]
    residual = exp.communication.client_state if exp.communication else None
    assert residual is not None
    kept = local_mask(exp.spec)
    shared = int((~kept).sum())
    g = torch.Generator().manual_seed(5)
    rows = torch.randn(5, exp.spec.size, generator=g, dtype=F64).masked_fill(kept, 0.0)
    cohort = CohortUpdates(list(range(5)), rows, torch.ones(5, dtype=F64))
    out, refused = attack.apply(cohort, StageContext(0, cfg.seed))
    assert refused == [] and residual.written() == []
    bad = [i for i in range(5) if not torch.equal(out.updates[i], rows[i])]
    assert bad and len(bad) < 5  # the attackers' rows replaced, the others kept
    for i in bad:
        row = out.updates[i]
        assert torch.count_nonzero(row[kept]) == 0
        assert torch.count_nonzero(row[~kept]) == max(1, round(0.1 * shared))
