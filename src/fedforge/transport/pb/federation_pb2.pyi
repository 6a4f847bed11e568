from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Auth(_message.Message):
    __slots__ = ("client", "nonce", "timestamp", "signature")
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    client: str
    nonce: bytes
    timestamp: float
    signature: bytes
    def __init__(self, client: _Optional[str] = ..., nonce: _Optional[bytes] = ..., timestamp: _Optional[float] = ..., signature: _Optional[bytes] = ...) -> None: ...

class Signed(_message.Message):
    __slots__ = ("auth", "body")
    AUTH_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    auth: Auth
    body: bytes
    def __init__(self, auth: _Optional[_Union[Auth, _Mapping]] = ..., body: _Optional[bytes] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ("client_version",)
    CLIENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    client_version: str
    def __init__(self, client_version: _Optional[str] = ...) -> None: ...

class Plugin(_message.Message):
    __slots__ = ("name", "version", "provides")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROVIDES_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    provides: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., provides: _Optional[str] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("run_name", "config_yaml", "server_version", "data_spec_json", "plugins")
    RUN_NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    DATA_SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    PLUGINS_FIELD_NUMBER: _ClassVar[int]
    run_name: str
    config_yaml: str
    server_version: str
    data_spec_json: str
    plugins: _containers.RepeatedCompositeFieldContainer[Plugin]
    def __init__(self, run_name: _Optional[str] = ..., config_yaml: _Optional[str] = ..., server_version: _Optional[str] = ..., data_spec_json: _Optional[str] = ..., plugins: _Optional[_Iterable[_Union[Plugin, _Mapping]]] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("client_id", "num_examples", "num_eval_examples")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    NUM_EVAL_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    num_examples: int
    num_eval_examples: int
    def __init__(self, client_id: _Optional[int] = ..., num_examples: _Optional[int] = ..., num_eval_examples: _Optional[int] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("members", "plugins")
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    PLUGINS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    plugins: _containers.RepeatedCompositeFieldContainer[Plugin]
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., plugins: _Optional[_Iterable[_Union[Plugin, _Mapping]]] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("client_id", "reason")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    reason: str
    def __init__(self, client_id: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("session", "accepted", "refused")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    session: str
    accepted: _containers.RepeatedScalarFieldContainer[int]
    refused: _containers.RepeatedCompositeFieldContainer[Refusal]
    def __init__(self, session: _Optional[str] = ..., accepted: _Optional[_Iterable[int]] = ..., refused: _Optional[_Iterable[_Union[Refusal, _Mapping]]] = ...) -> None: ...

class PollRequest(_message.Message):
    __slots__ = ("session", "wait_s", "heartbeat")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    session: str
    wait_s: float
    heartbeat: bool
    def __init__(self, session: _Optional[str] = ..., wait_s: _Optional[float] = ..., heartbeat: _Optional[bool] = ...) -> None: ...

class Work(_message.Message):
    __slots__ = ("kind", "client_id", "round_idx", "model_version", "plan_json", "seed", "phase", "message", "payload_id", "payload_size", "deadline_s")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TRAIN: _ClassVar[Work.Kind]
        PHASE: _ClassVar[Work.Kind]
        EVALUATE: _ClassVar[Work.Kind]
        COMMIT: _ClassVar[Work.Kind]
        SERVE: _ClassVar[Work.Kind]
    TRAIN: Work.Kind
    PHASE: Work.Kind
    EVALUATE: Work.Kind
    COMMIT: Work.Kind
    SERVE: Work.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_IDX_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SIZE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    kind: Work.Kind
    client_id: int
    round_idx: int
    model_version: int
    plan_json: str
    seed: int
    phase: str
    message: bytes
    payload_id: str
    payload_size: int
    deadline_s: float
    def __init__(self, kind: _Optional[_Union[Work.Kind, str]] = ..., client_id: _Optional[int] = ..., round_idx: _Optional[int] = ..., model_version: _Optional[int] = ..., plan_json: _Optional[str] = ..., seed: _Optional[int] = ..., phase: _Optional[str] = ..., message: _Optional[bytes] = ..., payload_id: _Optional[str] = ..., payload_size: _Optional[int] = ..., deadline_s: _Optional[float] = ...) -> None: ...

class PollReply(_message.Message):
    __slots__ = ("work", "done", "reason")
    WORK_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    work: _containers.RepeatedCompositeFieldContainer[Work]
    done: bool
    reason: str
    def __init__(self, work: _Optional[_Iterable[_Union[Work, _Mapping]]] = ..., done: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class DownloadRequest(_message.Message):
    __slots__ = ("session", "payload_id")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    session: str
    payload_id: str
    def __init__(self, session: _Optional[str] = ..., payload_id: _Optional[str] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class UploadHeader(_message.Message):
    __slots__ = ("session", "client_id", "round_idx", "model_version", "kind", "phase", "size", "sha256", "timing")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_IDX_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    session: str
    client_id: int
    round_idx: int
    model_version: int
    kind: str
    phase: str
    size: int
    sha256: bytes
    timing: Timing
    def __init__(self, session: _Optional[str] = ..., client_id: _Optional[int] = ..., round_idx: _Optional[int] = ..., model_version: _Optional[int] = ..., kind: _Optional[str] = ..., phase: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[bytes] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("download_s", "train_s")
    DOWNLOAD_S_FIELD_NUMBER: _ClassVar[int]
    TRAIN_S_FIELD_NUMBER: _ClassVar[int]
    download_s: float
    train_s: float
    def __init__(self, download_s: _Optional[float] = ..., train_s: _Optional[float] = ...) -> None: ...

class UploadPart(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: Signed
    data: bytes
    def __init__(self, header: _Optional[_Union[Signed, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadReply(_message.Message):
    __slots__ = ("accepted", "reason")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...
