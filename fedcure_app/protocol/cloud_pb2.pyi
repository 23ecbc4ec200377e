from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeviceProfile(_message.Message):
    __slots__ = ("name", "f_min_ghz", "f_max_ghz", "cycles_per_sample", "uplink_mbps", "downlink_mbps", "kappa", "jitter")
    class CyclesPerSampleEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    F_MIN_GHZ_FIELD_NUMBER: _ClassVar[int]
    F_MAX_GHZ_FIELD_NUMBER: _ClassVar[int]
    CYCLES_PER_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    UPLINK_MBPS_FIELD_NUMBER: _ClassVar[int]
    DOWNLINK_MBPS_FIELD_NUMBER: _ClassVar[int]
    KAPPA_FIELD_NUMBER: _ClassVar[int]
    JITTER_FIELD_NUMBER: _ClassVar[int]
    name: str
    f_min_ghz: float
    f_max_ghz: float
    cycles_per_sample: _containers.ScalarMap[str, float]
    uplink_mbps: float
    downlink_mbps: float
    kappa: float
    jitter: float
    def __init__(self, name: _Optional[str] = ..., f_min_ghz: _Optional[float] = ..., f_max_ghz: _Optional[float] = ..., cycles_per_sample: _Optional[_Mapping[str, float]] = ..., uplink_mbps: _Optional[float] = ..., downlink_mbps: _Optional[float] = ..., kappa: _Optional[float] = ..., jitter: _Optional[float] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("client_name", "label_counts", "device", "home_edge", "token", "supernode_public_key", "compute_device", "samples_per_s", "num_samples", "model_signature", "histogram_epsilon", "histogram_min_count")
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    LABEL_COUNTS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    HOME_EDGE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SUPERNODE_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_DEVICE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MODEL_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_EPSILON_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_MIN_COUNT_FIELD_NUMBER: _ClassVar[int]
    client_name: str
    label_counts: _containers.RepeatedScalarFieldContainer[int]
    device: DeviceProfile
    home_edge: int
    token: str
    supernode_public_key: str
    compute_device: str
    samples_per_s: float
    num_samples: int
    model_signature: str
    histogram_epsilon: float
    histogram_min_count: int
    def __init__(self, client_name: _Optional[str] = ..., label_counts: _Optional[_Iterable[int]] = ..., device: _Optional[_Union[DeviceProfile, _Mapping]] = ..., home_edge: _Optional[int] = ..., token: _Optional[str] = ..., supernode_public_key: _Optional[str] = ..., compute_device: _Optional[str] = ..., samples_per_s: _Optional[float] = ..., num_samples: _Optional[int] = ..., model_signature: _Optional[str] = ..., histogram_epsilon: _Optional[float] = ..., histogram_min_count: _Optional[int] = ...) -> None: ...

class WithdrawRequest(_message.Message):
    __slots__ = ("client_name", "reason", "token")
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    client_name: str
    reason: str
    token: str
    def __init__(self, client_name: _Optional[str] = ..., reason: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class WithdrawReply(_message.Message):
    __slots__ = ("expected_clients",)
    EXPECTED_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    expected_clients: int
    def __init__(self, expected_clients: _Optional[int] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("client_id", "edge_id", "edge_address", "num_clients", "num_edges")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EDGE_ID_FIELD_NUMBER: _ClassVar[int]
    EDGE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NUM_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    NUM_EDGES_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    edge_id: int
    edge_address: str
    num_clients: int
    num_edges: int
    def __init__(self, client_id: _Optional[int] = ..., edge_id: _Optional[int] = ..., edge_address: _Optional[str] = ..., num_clients: _Optional[int] = ..., num_edges: _Optional[int] = ...) -> None: ...

class ClaimRequest(_message.Message):
    __slots__ = ("client_name", "partition_id", "token")
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    client_name: str
    partition_id: int
    token: str
    def __init__(self, client_name: _Optional[str] = ..., partition_id: _Optional[int] = ..., token: _Optional[str] = ...) -> None: ...

class ClaimReply(_message.Message):
    __slots__ = ("partition_id", "num_partitions", "config_json")
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    partition_id: int
    num_partitions: int
    config_json: str
    def __init__(self, partition_id: _Optional[int] = ..., num_partitions: _Optional[int] = ..., config_json: _Optional[str] = ...) -> None: ...

class ConnectRequest(_message.Message):
    __slots__ = ("edge_id", "address", "token")
    EDGE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    edge_id: int
    address: str
    token: str
    def __init__(self, edge_id: _Optional[int] = ..., address: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("task_id", "coalition", "version", "model", "tau_e", "tau_c", "lr", "batch_size", "client_ids", "frequencies_ghz", "seed", "round", "t_hat_round_s", "evaluate", "client_samples", "max_client_weight", "client_step_bound")
    class FrequenciesGhzEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    class ClientSamplesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COALITION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TAU_E_FIELD_NUMBER: _ClassVar[int]
    TAU_C_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_IDS_FIELD_NUMBER: _ClassVar[int]
    FREQUENCIES_GHZ_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    T_HAT_ROUND_S_FIELD_NUMBER: _ClassVar[int]
    EVALUATE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MAX_CLIENT_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    CLIENT_STEP_BOUND_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    coalition: int
    version: int
    model: bytes
    tau_e: int
    tau_c: int
    lr: float
    batch_size: int
    client_ids: _containers.RepeatedScalarFieldContainer[int]
    frequencies_ghz: _containers.ScalarMap[int, float]
    seed: int
    round: int
    t_hat_round_s: float
    evaluate: bool
    client_samples: _containers.ScalarMap[int, int]
    max_client_weight: float
    client_step_bound: float
    def __init__(self, task_id: _Optional[str] = ..., coalition: _Optional[int] = ..., version: _Optional[int] = ..., model: _Optional[bytes] = ..., tau_e: _Optional[int] = ..., tau_c: _Optional[int] = ..., lr: _Optional[float] = ..., batch_size: _Optional[int] = ..., client_ids: _Optional[_Iterable[int]] = ..., frequencies_ghz: _Optional[_Mapping[int, float]] = ..., seed: _Optional[int] = ..., round: _Optional[int] = ..., t_hat_round_s: _Optional[float] = ..., evaluate: _Optional[bool] = ..., client_samples: _Optional[_Mapping[int, int]] = ..., max_client_weight: _Optional[float] = ..., client_step_bound: _Optional[float] = ...) -> None: ...

class ClientEvaluation(_message.Message):
    __slots__ = ("client_id", "samples", "loss_sum", "correct", "class_correct", "class_total")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    LOSS_SUM_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    CLASS_CORRECT_FIELD_NUMBER: _ClassVar[int]
    CLASS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    samples: int
    loss_sum: float
    correct: int
    class_correct: _containers.RepeatedScalarFieldContainer[int]
    class_total: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, client_id: _Optional[int] = ..., samples: _Optional[int] = ..., loss_sum: _Optional[float] = ..., correct: _Optional[int] = ..., class_correct: _Optional[_Iterable[int]] = ..., class_total: _Optional[_Iterable[int]] = ...) -> None: ...

class EvaluatedRequest(_message.Message):
    __slots__ = ("task_id", "edge_id", "version", "clients", "missing_client_ids", "token")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EDGE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    MISSING_CLIENT_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    edge_id: int
    version: int
    clients: _containers.RepeatedCompositeFieldContainer[ClientEvaluation]
    missing_client_ids: _containers.RepeatedScalarFieldContainer[int]
    token: str
    def __init__(self, task_id: _Optional[str] = ..., edge_id: _Optional[int] = ..., version: _Optional[int] = ..., clients: _Optional[_Iterable[_Union[ClientEvaluation, _Mapping]]] = ..., missing_client_ids: _Optional[_Iterable[int]] = ..., token: _Optional[str] = ...) -> None: ...

class EvaluatedReply(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...

class ClientStat(_message.Message):
    __slots__ = ("client_id", "edge_round", "samples", "seconds", "f_applied_ghz", "loss")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EDGE_ROUND_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    F_APPLIED_GHZ_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    edge_round: int
    samples: int
    seconds: float
    f_applied_ghz: float
    loss: float
    def __init__(self, client_id: _Optional[int] = ..., edge_round: _Optional[int] = ..., samples: _Optional[int] = ..., seconds: _Optional[float] = ..., f_applied_ghz: _Optional[float] = ..., loss: _Optional[float] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("task_id", "edge_id", "model", "num_samples", "stats", "dropped_client_ids", "latency_s", "token", "startup_s")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EDGE_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_CLIENT_IDS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    STARTUP_S_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    edge_id: int
    model: bytes
    num_samples: int
    stats: _containers.RepeatedCompositeFieldContainer[ClientStat]
    dropped_client_ids: _containers.RepeatedScalarFieldContainer[int]
    latency_s: float
    token: str
    startup_s: float
    def __init__(self, task_id: _Optional[str] = ..., edge_id: _Optional[int] = ..., model: _Optional[bytes] = ..., num_samples: _Optional[int] = ..., stats: _Optional[_Iterable[_Union[ClientStat, _Mapping]]] = ..., dropped_client_ids: _Optional[_Iterable[int]] = ..., latency_s: _Optional[float] = ..., token: _Optional[str] = ..., startup_s: _Optional[float] = ...) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("accepted", "version", "detail")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    version: int
    detail: str
    def __init__(self, accepted: _Optional[bool] = ..., version: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class ProgressRequest(_message.Message):
    __slots__ = ("task_id", "edge_id", "edge_round", "tau_e", "training_client_ids", "elapsed_s", "token")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EDGE_ID_FIELD_NUMBER: _ClassVar[int]
    EDGE_ROUND_FIELD_NUMBER: _ClassVar[int]
    TAU_E_FIELD_NUMBER: _ClassVar[int]
    TRAINING_CLIENT_IDS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    edge_id: int
    edge_round: int
    tau_e: int
    training_client_ids: _containers.RepeatedScalarFieldContainer[int]
    elapsed_s: float
    token: str
    def __init__(self, task_id: _Optional[str] = ..., edge_id: _Optional[int] = ..., edge_round: _Optional[int] = ..., tau_e: _Optional[int] = ..., training_client_ids: _Optional[_Iterable[int]] = ..., elapsed_s: _Optional[float] = ..., token: _Optional[str] = ...) -> None: ...

class ProgressReply(_message.Message):
    __slots__ = ("expected",)
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    expected: bool
    def __init__(self, expected: _Optional[bool] = ...) -> None: ...

class MembersRequest(_message.Message):
    __slots__ = ("edge_id", "token")
    EDGE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    edge_id: int
    token: str
    def __init__(self, edge_id: _Optional[int] = ..., token: _Optional[str] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("client_id", "client_name", "supernode_public_key")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    SUPERNODE_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    client_name: str
    supernode_public_key: str
    def __init__(self, client_id: _Optional[int] = ..., client_name: _Optional[str] = ..., supernode_public_key: _Optional[str] = ...) -> None: ...

class MembersReply(_message.Message):
    __slots__ = ("members",)
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("phase", "version", "round", "global_rounds", "clients_registered", "expected_clients", "edges_connected", "num_edges", "in_flight", "progress")
    class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PHASE_UNSPECIFIED: _ClassVar[StatusReply.Phase]
        REGISTERING: _ClassVar[StatusReply.Phase]
        TRAINING: _ClassVar[StatusReply.Phase]
        DONE: _ClassVar[StatusReply.Phase]
    PHASE_UNSPECIFIED: StatusReply.Phase
    REGISTERING: StatusReply.Phase
    TRAINING: StatusReply.Phase
    DONE: StatusReply.Phase
    PHASE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_REGISTERED_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    EDGES_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    NUM_EDGES_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    phase: StatusReply.Phase
    version: int
    round: int
    global_rounds: int
    clients_registered: int
    expected_clients: int
    edges_connected: int
    num_edges: int
    in_flight: _containers.RepeatedScalarFieldContainer[int]
    progress: _containers.RepeatedCompositeFieldContainer[CoalitionProgress]
    def __init__(self, phase: _Optional[_Union[StatusReply.Phase, str]] = ..., version: _Optional[int] = ..., round: _Optional[int] = ..., global_rounds: _Optional[int] = ..., clients_registered: _Optional[int] = ..., expected_clients: _Optional[int] = ..., edges_connected: _Optional[int] = ..., num_edges: _Optional[int] = ..., in_flight: _Optional[_Iterable[int]] = ..., progress: _Optional[_Iterable[_Union[CoalitionProgress, _Mapping]]] = ...) -> None: ...

class CoalitionProgress(_message.Message):
    __slots__ = ("coalition", "edge_round", "tau_e", "training_client_ids", "elapsed_s", "eta_s", "age_s")
    COALITION_FIELD_NUMBER: _ClassVar[int]
    EDGE_ROUND_FIELD_NUMBER: _ClassVar[int]
    TAU_E_FIELD_NUMBER: _ClassVar[int]
    TRAINING_CLIENT_IDS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    ETA_S_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    coalition: int
    edge_round: int
    tau_e: int
    training_client_ids: _containers.RepeatedScalarFieldContainer[int]
    elapsed_s: float
    eta_s: float
    age_s: float
    def __init__(self, coalition: _Optional[int] = ..., edge_round: _Optional[int] = ..., tau_e: _Optional[int] = ..., training_client_ids: _Optional[_Iterable[int]] = ..., elapsed_s: _Optional[float] = ..., eta_s: _Optional[float] = ..., age_s: _Optional[float] = ...) -> None: ...
