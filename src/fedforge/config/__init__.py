"""Typed, frozen run configuration: YAML in, validated, every error naming the field."""

from fedforge.config.noniid import (
    LocalConfig,
    ScaffoldConfig,
    StragglerConfig,
    SyntheticConfig,
)
from fedforge.config.parse import dump, from_dict, load, override, parse_override, to_dict
from fedforge.config.privacy import PrivacyConfig
from fedforge.config.schema import (
    AggregatorName,
    Algorithm,
    AttackName,
    CommunicationConfig,
    Config,
    Dataset,
    DownlinkCodec,
    DType,
    Engine,
    ModelName,
    PartitionConfig,
    PartitionKind,
    RobustConfig,
    ServerOptimizerConfig,
    ServerOptimizerKind,
    UplinkCodec,
)

__all__ = [
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
