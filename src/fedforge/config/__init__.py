"""Typed, frozen run configuration: YAML in, validated, every error naming the field."""

from fedforge.config.noniid import (
    DiagnosticsConfig,
    LocalConfig,
    ScaffoldConfig,
    StragglerConfig,
    SyntheticConfig,
)
from fedforge.config.parse import dump, from_dict, load, override, parse_override, to_dict
from fedforge.config.privacy import PrivacyConfig
from fedforge.config.robust import AggregatorName, AttackName, RobustConfig
from fedforge.config.schema import (
    Algorithm,
    CommunicationConfig,
    Config,
    Dataset,
    DownlinkCodec,
    DType,
    Engine,
    ModelName,
    PartitionConfig,
    PartitionKind,
    ServerOptimizerConfig,
    ServerOptimizerKind,
    UplinkCodec,
    describe_split,
)

__all__ = [
    "describe_split",
    "AggregatorName",
    "Algorithm",
    "AttackName",
    "CommunicationConfig",
    "Config",
    "DType",
    "Dataset",
    "DownlinkCodec",
    "Engine",
    "ModelName",
    "PartitionConfig",
    "PartitionKind",
    "PrivacyConfig",
    "LocalConfig",
    "DiagnosticsConfig",
    "ScaffoldConfig",
    "StragglerConfig",
    "SyntheticConfig",
    "RobustConfig",
    "ServerOptimizerConfig",
    "ServerOptimizerKind",
    "UplinkCodec",
    "dump",
    "from_dict",
    "load",
    "override",
    "parse_override",
    "to_dict",
]
