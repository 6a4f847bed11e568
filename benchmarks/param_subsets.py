"""Parameter subsets on feature-shift MNIST: FedAvg (share everything), FedBN
(Li et al. 2021: share all but batch norm) and "share only batch norm" (every
convolution and dense layer stays with its client, only the normalisation
layers' affine parameters and running statistics are averaged), each scored on
the clients' own held-out slices in their own domain.

FedBN's argument is that batch norm is where the feature shift lives, so it is
the part to keep local; sharing only batch norm does the opposite: each client
trains its own feature extractor and classifier from the common initial model
on its ~200 (full) or ~250 (--quick) examples, and averages the one part whose
statistics differ most across domains.

The setting is benchmarks/fedbn_shift.py's (its ``config`` and ``figures``,
the same seeds, domains and holdout); the third arm is ``algorithm: fedavg``
with ``local_params.kinds: [weight]``. Full mode: 30 clients, 100 rounds;
``--quick``: 12 clients, 10 rounds. Records under benchmarks/results/param_subsets.

Last line: ``RESULT subset_bn_only_mean=... subset_bn_only_worst_client=...
subset_fedavg_mean=... subset_fedbn_mean=... ...`` (last evaluation, averaged
over seeds) and the bytes of one client's upload in each arm, measured: a
client of seed 0 trains one round and its message is counted.

    OMP_NUM_THREADS=1 FEDFORGE_DATA=/work/shared/data python benchmarks/param_subsets.py [--quick]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from _common import print_settings, result_line, run_record
from fedbn_shift import DOMAINS, config, figures, parse_args
from fedforge.client.runtime import ClientTask, encode_payload
from fedforge.config import Config, override
from fedforge.data.federated import load_federated_data
from fedforge.data.shift import assign_domains
from fedforge.server.experiment import build

# arm: (algorithm, local_params)
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "fedavg": ("fedavg", {}),
    "fedbn": ("fedbn", {}),
    "bn_only": ("fedavg", {"kinds": ["weight"]}),
}


def arm_config(arm: str, seed: int, args: Any) -> Config:
    algorithm, local = ARMS[arm]
    cfg = config(algorithm, seed, args)
    changes: dict[str, Any] = {"name": f"param-subsets-{arm}-s{seed}"}
    if local:
        changes["local_params"] = local
    return override(cfg, changes)


def upload_bytes(cfg: Config, data: Any) -> int:
    """The bytes of client 0's first update under ``cfg``: its message as the
    client runtime encodes it for the wire."""
    exp = build(cfg, data)
    runtime = exp.engine.runtime  # type: ignore[attr-defined]
    payload = encode_payload(exp.initial_params, 0)
    return len(runtime.run(ClientTask(0, 0, exp.algorithm.plan(0), cfg.seed), payload))


def main() -> None:
    args = parse_args("param_subsets", __doc__ or "")
    arms = {a: arm_config(a, 0, args) for a in ARMS}
    print_settings("feature-shift MNIST, cnn_bn, parameter subsets", arms["fedavg"], arms)
    rows: list[tuple[int, str, dict[str, Any]]] = []
    for seed in range(args.seeds):
        data = load_federated_data(arm_config("fedavg", seed, args))
        domains = assign_domains(args.clients, DOMAINS, seed)
        for arm in ARMS:
            rec = run_record(arm_config(arm, seed, args), data, args.places)
            rows.append((seed, arm, figures(rec, domains)))
            print(f"{arm} seed {seed}: done ({rec['status']})", flush=True)
    head = f"{'arm':>8} {'seed':>4} {'mean':>6} {'p10':>6} {'worst':>6} " + " ".join(
        f"{d[:8]:>8}" for d in DOMAINS
    )
    print(head)
    print("-" * len(head))
    for seed, arm, f in rows:
        print(
            f"{arm:>8} {seed:>4} {f['mean']:>6.4f} {f['p10']:>6.4f} {f['worst']:>6.4f} "
            + " ".join(f"{f[d]:>8.4f}" for d in DOMAINS)
        )
    result: dict[str, Any] = {}
    for arm in ("bn_only", "fedavg", "fedbn"):
        for key, name in (("mean", "mean"), ("worst", "worst_client")):
            result[f"subset_{arm}_{name}"] = float(
                np.mean([f[key] for _, a, f in rows if a == arm])
            )
    data = load_federated_data(arm_config("fedavg", 0, args))
    for arm in ARMS:
        result[f"subset_{arm}_upload_bytes"] = upload_bytes(arm_config(arm, 0, args), data)
    result.update(subset_rounds=args.rounds, subset_clients=args.clients, subset_seeds=args.seeds)
    print(result_line(result))


if __name__ == "__main__":
    main()
