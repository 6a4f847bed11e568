"""Alerts on a run: rules watched after every recorded round (the ``alerts:``
config section), fired once when their condition becomes true, acted on by a
command or a URL, recorded in the run store's ``alerts`` table.

``rules.py`` evaluates (facts in, firings out, no I/O), ``actions.py`` acts,
``monitor.py`` links them to a run store; the round loop calls the monitor,
so the simulator and a deployment server both alert.
"""

from fedforge.alerts.actions import alert_payload
from fedforge.alerts.monitor import Monitor, stored_facts
from fedforge.alerts.rules import Firing, RoundFacts, Watch, evaluate

__all__ = ["Firing", "Monitor", "RoundFacts", "Watch", "alert_payload", "evaluate", "stored_facts"]
