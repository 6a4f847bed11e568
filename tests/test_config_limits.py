"""Config files and --set values that YAML reads into shapes no config has: a list
as a key, nesting thousands deep, an alias bomb, an alias inside its own anchor.
Each is one ConfigError naming the file or field and the limit, never a traceback."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fedforge.config import Config, from_dict, load, parse_override
from fedforge.config.bounds import integer_fields
from fedforge.config.parse import MAX_DEPTH, MAX_VALUES
from fedforge.config.ranges import declared_bounds
from fedforge.core.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("key", ["? [a, b]\n: 1\n", "? {a: 1}\n: 1\n", "[lr]: 0.1\n"])
def test_a_list_or_mapping_as_a_key_is_a_config_error(tmp_path: Path, key: str) -> None:
    with pytest.raises(ConfigError, match=r"cfg\.yaml.* as a key; keys must be field names"):
        load(write(tmp_path, key))


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5000])
def test_deep_nesting_in_a_file_names_the_file_and_the_limit(tmp_path: Path, depth: int) -> None:
    for text in (
        "lr: " + "[" * depth + "]" * depth + "\n",
        "lr: " + "{a: " * depth + "1" + "}" * depth + "\n",
    ):
        with pytest.raises(ConfigError, match=rf"cfg\.yaml.*deeper than {MAX_DEPTH} levels"):
            load(write(tmp_path, text))


def test_deep_nesting_in_an_override_names_the_field_and_the_limit() -> None:
    with pytest.raises(ConfigError, match=rf"override 'lr'.*deeper than {MAX_DEPTH} levels"):
        parse_override("lr=" + "[" * 5000 + "]" * 5000)
    assert parse_override("lr=[[1]]") == ("lr", [[1]])  # shallow nesting is still read


def test_an_alias_bomb_is_refused_fast_unexpanded(tmp_path: Path) -> None:
    """Nine levels of ten aliases each: 10^9 values if expanded."""
    text = "name: [&a0 [x, x, x, x, x, x, x, x, x, x]"
    text += "".join(f", &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)) + "]\n"
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=f"expand to more than {MAX_VALUES:,} values"):
        load(write(tmp_path, text))
    with pytest.raises(ConfigError, match="override 'name'.*expand to more than"):
        parse_override("name=" + text[len("name: ") :])
    assert time.perf_counter() - start < 2


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="alias refers to the node that holds it"):
        load(write(tmp_path, "name: &a [x, *a]\n"))


def test_shared_aliases_within_the_limit_are_read(tmp_path: Path) -> None:
    text = "partition: &p {kind: dirichlet, alpha: 0.3}\nname: run\n"
    assert load(write(tmp_path, text)).partition.alpha == 0.3
    merged = "x: &base {alpha: 0.3, kind: dirichlet}\n"
    with pytest.raises(ConfigError, match="unknown config field 'x'"):
        load(write(tmp_path, merged + "partition: {<<: *base}\n"))


def test_a_long_unknown_key_is_quoted_short(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load(write(tmp_path, "k" * 100_000 + ": 1\n"))
    assert len(str(exc.value)) < 1500


def test_a_huge_bad_value_is_quoted_short(tmp_path: Path) -> None:
    """Four levels of YAML aliases make a 10^4-item list of a 200-byte file (more
    are refused unexpanded: test_config_limits.py), eight levels of shared Python
    lists a 10^8-item one: the error quotes its start, it does not print gigabytes."""
    nest = "name: [&a0 [x, x, x, x, x, x, x, x, x, x]"
    nest += "".join(f", &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 4)) + "]\n"
    with pytest.raises(ConfigError) as exc:
        load(write(tmp_path, nest))
    message = str(exc.value)
    assert message.startswith("config field 'name' = [['x', 'x'") and len(message) < 300
    value: list[Any] = ["x"] * 10
    for _ in range(7):
        value = [value] * 10
    with pytest.raises(ConfigError) as exc:
        from_dict({"name": value})
    message = str(exc.value)
    assert message.startswith("config field 'name' = [[[[...]") and len(message) < 300


# --- every integer field's range -----------------------------------------------


def _nested(name: str, value: object) -> dict[str, Any]:
    """``{"a": {"b": value}}`` for the dotted name ``a.b``."""
    out: dict[str, Any] = {}
    node = out
    *sections, last = name.split(".")
    for section in sections:
        node = node.setdefault(section, {})
    node[last] = value
    return out


BOUNDS = declared_bounds(Config)


def test_every_integer_field_has_a_range() -> None:
    assert set(integer_fields(Config)) == set(BOUNDS)


def _with(name: str, value: int) -> dict[str, Any]:
    """A config holding ``value`` in field ``name``, with what that field needs
    to be read at all (tiers: secure aggregation)."""
    if name == "privacy.tiers.high_clients":
        tiers = {"secagg": True, "tiers": {"high_clients": [value]}}
        return {"privacy": tiers, "communication": {"clip_norm": 1.0}}
    return _nested(name, value)


@pytest.mark.parametrize("name", sorted(BOUNDS))
@pytest.mark.parametrize("past", [1, 2**63])
def test_a_value_past_a_fields_range_is_one_line(name: str, past: int) -> None:
    """``robust.norm_window: 2**63`` once ended in an OverflowError, ``batch_size:
    2**63`` in a ValueError from torch: each field past its greatest value is one
    line naming the field, the value and the range."""
    low, high, _ = BOUNDS[name]
    value = high + past
    with pytest.raises(ConfigError) as exc:
        from_dict(_with(name, value))
    text = str(exc.value)
    assert "\n" not in text and f"'{name}' = " in text and str(value) in text
    if name not in OWN_RANGE:
        assert f"must be an integer in [{low:,}, {high:,}]" in text


# fields whose section checks the same range in its own words first
OWN_RANGE = {
    "privacy.secagg_frac_bits",
    "privacy.secagg_neighbours",
    "deployment.chunk_kib",
    "deployment.pending_per_address",
    "threads",
}


def test_the_refused_window_fits_the_run() -> None:
    """A window of upload rounds longer than the run never fills, so the stop on
    refused updates never fires: 60% attackers once ran all 40 rounds of a run
    with refused_window 10^9."""
    with pytest.raises(
        ConfigError, match=r"'robust.refused_window' = 41 .*\[1, 40\]: the run has 40"
    ):
        from_dict({"rounds": 40, "robust": {"refused_window": 41}})
    with pytest.raises(ConfigError, match=r"= 21 .*\[1, 20\]: the run has 20 upload rounds"):
        from_dict(
            {"rounds": 40, "communication": {"upload_every": 2}, "robust": {"refused_window": 21}}
        )
    assert from_dict({"rounds": 40, "robust": {"refused_window": 40}}).robust.refused_window == 40
    assert from_dict({"rounds": 3}).robust.refused_window == 10  # the default stands
    off = {"max_refused_fraction": None, "refused_window": 1000}
    assert from_dict({"rounds": 40, "robust": off}).robust.refused_window == 1000


@pytest.mark.parametrize("field", ["robust.norm_window", "batch_size"])
def test_the_command_refuses_a_huge_integer_in_one_line(tmp_path: Path, field: str) -> None:
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "fedforge.cli", "run", "--set", f"{field}={2**63}"]
    proc = subprocess.run(
        [*cmd, "--runs-dir", str(runs), "-q"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"'{field}' = {2**63} is invalid: must be an integer in" in lines[0]
    assert not runs.exists()
