"""A run's config in words, as the CLI and ``fedforge show`` print it: what it
trains, how its data is spread over clients, its local step sizes."""

from __future__ import annotations

from fedforge.config import task as task_rules
from fedforge.config.schema import Config


def describe_task(cfg: Config) -> str:
    """What the run trains, as the CLI and ``show`` print it: a task of the
    caller's by its name, else the model and data set."""
    if cfg.task is not None and cfg.task not in task_rules.BUILT_IN_TASKS:
        return f"task {cfg.task}"
    return f"{cfg.model} on {cfg.dataset}"


def describe_split(cfg: Config) -> str:
    """How the run's data is spread over clients, as the CLI and ``show`` print it,
    and how it drifts across rounds when it does."""
    split = _split(cfg)
    if not cfg.drift.on:
        return split
    d = cfg.drift
    if d.kind == "label_mix":
        return (
            f"{split}, drifting: the label mix favours {d.groups} class groups in turn "
            f"({d.strength:g}x), {d.every} rounds each"
        )
    return f"{split}, drifting: {d.groups} label maps in turn, {d.every} rounds each"


def _split(cfg: Config) -> str:
    if cfg.dataset == "synthetic":  # its users are its clients: no partition
        syn = cfg.synthetic
        return "Synthetic-IID users" if syn.iid else f"Synthetic({syn.alpha}, {syn.beta}) users"
    part = cfg.partition
    if cfg.dataset == "shakespeare":
        return (
            "one client a speaking role" if part.kind == "natural" else "iid over the roles' text"
        )
    detail = {
        "shards": f"{part.shards_per_client} shards/client",
        "dirichlet": f"alpha={part.alpha}",
        "hsu": f"alpha={part.alpha}",
        "quantity": f"sigma={part.sigma}",
    }.get(part.kind)
    return f"{part.kind} partition" + (f" ({detail})" if detail else "")


def step_sizes(cfg: Config) -> str:
    """The local step sizes a run uses, as the CLI and ``fedforge show`` print them:
    ``lr=...``, or Per-FedAvg's inner and outer steps and its meta-steps."""
    if cfg.algorithm != "perfedavg":
        return f"lr={cfg.lr}"
    pfa = cfg.perfedavg
    return f"alpha={pfa.alpha} beta={pfa.outer_lr(cfg.lr)} steps={pfa.steps}"
