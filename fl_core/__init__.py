"""Federated learning with no privacy knowledge: data, models, client updates, the server loop.

The aggregation seam (:class:`AggregationProtocol`) is where privacy layers plug in.
"""

from fedsec.fl_core.aggregation import (
    AggregateResult,
    AggregationProtocol,
    ClientUpdate,
    PlainAggregation,
)
from fedsec.fl_core.buffers import federate_buffers, restore_buffers
from fedsec.fl_core.client import (
    FedAvg,
    FedProx,
    FedSGD,
    LocalResult,
    LocalTrainer,
    SGDTrainer,
    Strategy,
    ZeroOnFailure,
)
from fedsec.fl_core.data import ArrayDataset, FederatedDataset
from fedsec.fl_core.datasets import DATASET_NAMES, load_federated
from fedsec.fl_core.errors import (
    AggregationError,
    FLError,
    InvalidParameterError,
    NonFiniteError,
    ShapeMismatchError,
    TooFewClientsError,
)
from fedsec.fl_core.execution import ClientFailure, ClientRunner, ClientTask, InProcessRunner
from fedsec.fl_core.history import HistoryRecorder, ResumePoint, RoundObserver, RoundRecord, TrainingResult
from fedsec.fl_core.local import TorchTrainer
from fedsec.fl_core.metrics import Evaluator
from fedsec.fl_core.models import MODEL_NAMES, build_model, evaluate
from fedsec.fl_core.parameters import ParameterLayout, get_vector, set_vector
from fedsec.fl_core.partition import PARTITION_SCHEMES, partition_indices
from fedsec.fl_core.server import FederatedServer, clients_per_round
from fedsec.fl_core.server_optimizers import (
    SERVER_OPTIMIZERS,
    ServerAdam,
    ServerMomentum,
    ServerOptimizer,
    ServerSGD,
    ServerYogi,
    make_server_optimizer,
)

__all__ = [
    "AggregateResult",
    "AggregationError",
    "AggregationProtocol",
    "ArrayDataset",
    "ClientFailure",
    "ClientRunner",
    "ClientTask",
    "ClientUpdate",
    "DATASET_NAMES",
    "Evaluator",
    "FLError",
    "FedAvg",
    "FedProx",
    "FedSGD",
    "FederatedDataset",
    "FederatedServer",
    "HistoryRecorder",
    "InProcessRunner",
    "InvalidParameterError",
    "LocalResult",
    "LocalTrainer",
    "MODEL_NAMES",
    "NonFiniteError",
    "PARTITION_SCHEMES",
    "ParameterLayout",
    "PlainAggregation",
    "ResumePoint",
    "RoundObserver",
    "RoundRecord",
    "SERVER_OPTIMIZERS",
    "ServerAdam",
    "ServerMomentum",
    "ServerOptimizer",
    "ServerSGD",
    "ServerYogi",
    "SGDTrainer",
    "ShapeMismatchError",
    "Strategy",
    "TooFewClientsError",
    "TorchTrainer",
    "TrainingResult",
    "ZeroOnFailure",
    "build_model",
    "clients_per_round",
    "evaluate",
    "federate_buffers",
    "get_vector",
    "load_federated",
    "make_server_optimizer",
    "partition_indices",
    "restore_buffers",
    "set_vector",
]
