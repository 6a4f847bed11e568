"""The examples/ files as the tests load them: each imported as ``--plugin
examples/NAME.py`` imports it (once a process), its module returned."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import fedforge

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str) -> ModuleType:
    """``examples/NAME.py``, loaded as a plugin (its components registered)."""
    return sys.modules[fedforge.load_plugin(str(EXAMPLES / f"{name}.py"))]
