"""What a run says of its config in its one-line note, without refusing it: fields
set away from their default that it does not read, fields read against their
algorithm's assumption, and what a figure measures where it could mislead.
Refusing them would break sweeps, which keep one setting for the points that
read it."""

from __future__ import annotations

from fedforge.config.compat import cohort_size
from fedforge.config.data import PartitionConfig, SyntheticConfig
from fedforge.config.local import FedProxConfig
from fedforge.config.moved import moved_note
from fedforge.config.privacy import PrivacyConfig
from fedforge.config.robust import RobustConfig
from fedforge.config.schema import Config
from fedforge.config.server_optimizer import ServerOptimizerConfig
from fedforge.config.task import CLASS_PARTITIONS  # they give clients different labels


def config_notes(cfg: Config, own_split: bool = False) -> list[str]:
    """What a run says of its config in its note: fields set away from their
    default that it does not read (FedProx's mu under another algorithm, a server
    optimizer's field its kind ignores), fields read against their algorithm's
    assumption (SCAFFOLD option II's plain SGD), and what FedBN's and a
    feature-shifted run's global accuracy measure; and the new spelling of a
    field it gave the old way (``mu``: ``fedprox.mu``). Not refused (a sweep over
    the algorithm or the kind keeps one setting for the points that read it).
    ``own_split``: the data came with its own split (the partition fields unread)."""
    out = [note] if (note := moved_note(cfg)) else []
    mu = cfg.fedprox.mu
    if cfg.algorithm != "fedprox" and mu not in (0.0, FedProxConfig().mu):
        out.append(f"fedprox.mu = {mu} is ignored by algorithm '{cfg.algorithm}'")
    so, default = cfg.server_optimizer, ServerOptimizerConfig()
    used = {  # the fields each kind reads, besides lr
        "sgd": ("momentum",),
        "adagrad": ("beta1", "tau", "bias_correction"),
        "adam": ("beta1", "beta2", "tau", "bias_correction"),
        "yogi": ("beta1", "beta2", "tau", "bias_correction"),
    }
    for name in ("momentum", "beta1", "beta2", "tau", "bias_correction"):
        value = getattr(so, name)
        if so.kind not in used:  # a plugin's: which fields it reads is its own
            break
        if name not in used[so.kind] and value != getattr(default, name):
            out.append(f"server_optimizer.{name} = {value} is ignored by kind '{so.kind}'")
    loc = cfg.local
    if (
        cfg.algorithm == "scaffold"
        and cfg.scaffold.option == "II"
        and (loc.momentum or loc.weight_decay)
    ):
        out.append(
            "scaffold.option 'II' estimates the client's corrected gradient as its "
            "displacement / (steps * lr), which assumes plain local SGD: with "
            f"local.momentum = {loc.momentum}, local.weight_decay = {loc.weight_decay} "
            "the control variates carry them too (option 'I' does not)"
        )
    if loc.lr_rule_scales_bounds and not _norm_bounded(cfg):
        out.append(
            "local.lr_rule_scales_bounds = true scales no bound: robust.max_norm_multiple "
            "and communication.clip_multiple are null (or secure aggregation hides the norms)"
        )
    if (note := _few_norms_note(cfg, own_split)) is not None:
        out.append(note)
    out += _robust_notes(cfg.robust)
    syn, syn_default = cfg.synthetic, SyntheticConfig()
    if cfg.dataset == "synthetic" and syn.iid:
        for name in ("alpha", "beta"):
            if getattr(syn, name) != getattr(syn_default, name):
                out.append(f"synthetic.{name} = {getattr(syn, name)} is ignored by synthetic.iid")
    p, p_default = cfg.privacy, PrivacyConfig()
    tiers = p.tiers.enabled
    if p.dp == "none" and not tiers:  # the noise, its accounting and its budget
        names = ("noise_multiplier", "accountant", "delta", "target_epsilon", "adaptive_clip")
        for name in (*names, "secret_noise", "trusted_server_noise"):
            if getattr(p, name) != getattr(p_default, name):
                out.append(f"privacy.{name} = {getattr(p, name)} is ignored with privacy.dp 'none'")
    else:
        if not p.secret_noise:
            out.append(
                "the privacy noise is derived from the run seed (reproducible): whoever "
                "knows the seed can subtract it; privacy.secret_noise = true draws it from "
                "the OS (the default of `fedforge server` runs)"
            )
        if p.trusted_server_noise and p.secret_noise is not False:
            out.append(
                "privacy.trusted_server_noise = True is ignored unless privacy.secret_noise "
                "= false (it allows seed-derived noise in a `fedforge server` run)"
            )
    agg = cfg.aggregation
    if agg.weight_cap is not None and agg.weights not in ("capped", "quality", "class"):
        out.append(
            f"aggregation.weight_cap = {agg.weight_cap} is ignored by aggregation.weights "
            f"'{agg.weights}' (central DP's cap is privacy.weight_cap)"
        )
    if cfg.algorithm == "fedbn":
        out.append(
            "fedbn: the global test accuracy (and target_accuracy) is of the shared layers "
            "with the initial batch norm, a model no client uses; each client's own "
            "model is evaluated with evaluation.clients"
        )
    shift = cfg.partition.feature_shift
    if any(domain != "none" for domain in shift):
        where = f"domain 'none', one of {len(shift)}" if "none" in shift else "no client's domain"
        out.append(
            f"partition.feature_shift = [{', '.join(shift)}]: the global test accuracy (and "
            f"target_accuracy) is of the unshifted test set ({where}); evaluation.clients scores "
            "each client in its own domain"
        )
    return out


def _norm_bounded(cfg: Config) -> bool:
    """Whether a bound relative to recent norms is in force: the server's or the
    clients' clip (secure aggregation refuses the clip and hides the norms)."""
    secagg = cfg.privacy.secagg
    return not secagg and (
        cfg.robust.max_norm_multiple is not None or cfg.communication.clip_multiple is not None
    )


SMALL_COHORT = 5  # fewer updates a server step than this: the norm gate's median is of few


def _few_norms_note(cfg: Config, own_split: bool) -> str | None:
    """The relative norm bound over few updates a step of label-skewed clients: its
    median is of few updates, each following its client's labels, and an honest
    client holding other labels can pass it (McMahan's CNN on shards at one
    client a round, refused and stopped at round 1,148). Said where the config's
    partition splits the data (not synthetic data, not data with its own split)."""
    r, kind, asyn = cfg.robust, cfg.partition.kind, cfg.asynchronous
    split_here = cfg.dataset != "synthetic" and not own_split and kind in CLASS_PARTITIONS
    if r.max_norm_multiple is None or cfg.privacy.secagg or not split_here:
        return None
    k = (
        asyn.buffer_size_of(cfg.num_clients, cfg.client_fraction)
        if asyn.buffered
        else cohort_size(cfg.num_clients, cfg.client_fraction)
    )
    if k >= SMALL_COHORT:
        return None
    stops = (
        ", and refused updates stop the run (robust.max_refused_fraction)"
        if r.max_refused_fraction is not None
        else ""
    )
    return (
        f"robust.max_norm_multiple = {r.max_norm_multiple:g} judges each update against the "
        f"median of the updates of the last {r.norm_window} server steps, {k} a step: on "
        f"label-skewed clients (partition.kind '{kind}') an honest client holding other "
        f"labels can pass it{stops}; where no client is hostile set "
        "robust.max_norm_multiple: null, else a larger multiple or cohort"
    )


# the partition fields that split a data set the config loads
_SPLIT_FIELDS = ("kind", "shards_per_client", "alpha", "sigma", "min_size")


def own_split_note(cfg: Config) -> str | None:
    """What a run on data given with its own split over clients says of the
    partition fields that would have split a loaded data set (None: all default)."""
    part, default = cfg.partition, PartitionConfig()
    changed = [
        f"partition.{n} = {getattr(part, n)!r}"
        for n in _SPLIT_FIELDS
        if getattr(part, n) != getattr(default, n)
    ]
    if not changed:
        return None
    return (
        f"{', '.join(changed)} ignored: the data came with its own split over clients "
        "(to split your labels this way: fedforge.data.dirichlet(labels, num_clients, "
        "alpha, numpy.random.default_rng(seed)) and the other partitioners of fedforge.data)"
    )


# the robust aggregators that read each field (robust.py builds them)
_ROBUST_READERS = {
    "byzantine": ("krum", "multi_krum", "bulyan"),
    "trim_fraction": ("trimmed_mean",),
    "multi_krum_m": ("multi_krum",),
    "norm_bound": ("norm_bound", "centred_clip"),
    "norm_window": ("norm_bound", "centred_clip"),
    "centred_clip_iterations": ("centred_clip",),
    "geomed_max_iter": ("geometric_median",),
    "geomed_tol": ("geometric_median",),
}


def _robust_notes(r: RobustConfig) -> list[str]:
    """Robust aggregator settings that the configured aggregator does not read
    (e.g. robust.byzantine under the median, which assumes no f)."""
    default = RobustConfig()
    return [
        f"robust.{name} = {getattr(r, name)} is ignored by robust.aggregator '{r.aggregator}'"
        for name, readers in _ROBUST_READERS.items()
        if r.aggregator not in readers
        and getattr(r, name) != getattr(default, name)
        and not (name == "norm_window" and r.max_norm_multiple is not None)
    ]
