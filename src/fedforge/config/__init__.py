"""Typed, frozen run configuration: YAML in, validated, every error naming the
field. ``Config`` (schema.py) holds the run's fields and one section per
feature (data.py, local.py, aggregation.py, evaluation.py, communication.py,
privacy.py, robust.py); each section checks its own fields, compat.py how they combine."""

from fedforge.config.aggregation import AggregationConfig, WeightRule
from fedforge.config.alerts import AlertKind, AlertRule, AlertsConfig
from fedforge.config.communication import CommunicationConfig, DownlinkCodec, UplinkCodec
from fedforge.config.data import (
    Dataset,
    InputScaling,
    PartitionConfig,
    PartitionKind,
    SyntheticConfig,
)
from fedforge.config.describe import describe_split, describe_task, step_sizes
from fedforge.config.drift import DriftConfig
from fedforge.config.evaluation import DiagnosticsConfig, EvaluationConfig, PersonalEvalConfig
from fedforge.config.local import (
    FedProxConfig,
    LocalConfig,
    PerFedAvgConfig,
    ScaffoldConfig,
    StragglerConfig,
)
from fedforge.config.parse import dump, from_dict, load, override, parse_override, to_dict
from fedforge.config.privacy import PrivacyConfig
from fedforge.config.robust import AggregatorName, AttackName, RobustConfig
from fedforge.config.schema import (
    AlgorithmName,
    Config,
    DType,
    EngineName,
    ModelName,
    check,
)
from fedforge.config.server_optimizer import ServerOptimizerConfig, ServerOptimizerKind

__all__ = [
    "check",
    "describe_split",
    "describe_task",
    "step_sizes",
    "AggregationConfig",
    "AggregatorName",
    "AlertKind",
    "AlertRule",
    "AlertsConfig",
    "AlgorithmName",
    "AttackName",
    "CommunicationConfig",
    "Config",
    "DType",
    "Dataset",
    "DownlinkCodec",
    "DriftConfig",
    "EngineName",
    "EvaluationConfig",
    "FedProxConfig",
    "InputScaling",
    "ModelName",
    "PartitionConfig",
    "PartitionKind",
    "PerFedAvgConfig",
    "PersonalEvalConfig",
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
    "WeightRule",
    "dump",
    "from_dict",
    "load",
    "override",
    "parse_override",
    "to_dict",
]
