"""Data sources and partitioners for stamen (no Flower imports).

This package is named ``datasets`` and shadows HuggingFace ``datasets`` whenever
the app directory is on ``sys.path``; never import the HuggingFace package here.
"""

from datasets.base import ArraySource, ClientSplit, DataUnavailableError, NotEnoughDataError
from datasets.feature_shift import FEATURE_SHIFTS
from datasets.local import (
    USER_DATASETS,
    LocalDataError,
    class_counts,
    parse_channel_values,
    parse_classes,
    parse_shape,
)
from datasets.partition import PAPER_VARIANTS, PARTITIONERS, POOLED, PartitionSpec, partition
from datasets.registry import (
    APP_DATA,
    DATASETS,
    EMNIST_SPLITS,
    GENERATED,
    NATURAL,
    NEEDS_DATA_DIR,
    ClientData,
    DataSpec,
    dataset_shape,
    load_client_data,
    load_node_data,
    load_partition,
    load_source,
)
from datasets.validation import hold_out_validation

__all__ = [
    "APP_DATA",
    "DATASETS",
    "EMNIST_SPLITS",
    "FEATURE_SHIFTS",
    "GENERATED",
    "NATURAL",
    "NEEDS_DATA_DIR",
    "PAPER_VARIANTS",
    "PARTITIONERS",
    "POOLED",
    "ArraySource",
    "ClientData",
    "ClientSplit",
    "DataSpec",
    "DataUnavailableError",
    "LocalDataError",
    "USER_DATASETS",
    "class_counts",
    "load_node_data",
    "parse_channel_values",
    "parse_classes",
    "parse_shape",
    "dataset_shape",
    "NotEnoughDataError",
    "PartitionSpec",
    "hold_out_validation",
    "load_client_data",
    "load_partition",
    "load_source",
    "partition",
]
