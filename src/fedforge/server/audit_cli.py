"""``fedforge audit-membership RUN``: the loss-threshold membership-inference
attack (Yeom et al. 2018) on a stored run's final model, its ROC AUC and best
threshold's advantage. The audit itself is ``server/audit.py``; this reads the
run store, read-only, and prints one line."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from fedforge.report.run_args import add_run_lookup, open_run


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``audit-membership`` subcommand."""
    audit = sub.add_parser(
        "audit-membership",
        help="loss-threshold membership inference on a run's final model: attack AUC",
    )
    add_run_lookup(audit)
    audit.add_argument(
        "--examples", type=int, default=10_000, help="members and as many non-members (10,000)"
    )
    audit.add_argument("--seed", type=int, default=0, help="which rows are drawn")


def cmd_audit_membership(args: argparse.Namespace) -> int:
    from fedforge.server.audit import audit_run  # torch: only when run

    if args.examples < 1:
        raise SystemExit(f"fedforge: --examples {args.examples} is invalid; must be >= 1")
    with open_run(args) as store:
        run_dir = store.path
    a = audit_run(run_dir, args.examples, args.seed)
    print(
        f"membership inference (loss threshold, Yeom et al. 2018) on {run_dir.name}: "
        f"AUC {a.auc:.4f}, advantage {a.advantage:.4f} ({a.members} members, mean loss "
        f"{a.member_loss:.4f}; {a.nonmembers} held-out, mean loss {a.nonmember_loss:.4f})"
    )
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "audit-membership": cmd_audit_membership
}
