"""Collectors (DESIGN idea 7): a round's uploads arrive one at a time, in any
order, and a collector turns them into the aggregate and its accounting.

- ``StreamingMean``: a running weighted sum, O(model) memory (``streaming.py``);
- ``GatheredCohort``: the accepted updates as one ``[K, P]`` tensor for the cohort
  stages and the robust rules (``gathered.py``);
- ``HierarchicalMean``: each client's edge first, then the edges' means
  (``hierarchical.py``);
- ``SecureSum``: secure aggregation's four phases, the masked inputs and their
  unmasked sum (``secure.py``; it imports ``cryptography``, so only runs that
  mask import it).

Every plain upload passes the same intake (``intake.py``): one per client asked
to train, decoded and checked, its weight bounded, through the per-upload
stages. Secure aggregation's masked inputs cannot be read: ``SecureSum`` checks
their form and sender, and bounds their weights the same way.
"""

from fedforge.server.collectors.base import Collected, Collector, DenseCost, Phase, RoundLog
from fedforge.server.collectors.gathered import GatheredCohort
from fedforge.server.collectors.hierarchical import HierarchicalMean
from fedforge.server.collectors.streaming import StreamingMean

__all__ = [
    "Collected",
    "Collector",
    "DenseCost",
    "GatheredCohort",
    "HierarchicalMean",
    "Phase",
    "RoundLog",
    "StreamingMean",
]
