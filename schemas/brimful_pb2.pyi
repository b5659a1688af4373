from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InputTensor(_message.Message):
    __slots__ = ("datatype", "shape", "bytes_contents", "raw_contents")
    DATATYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    BYTES_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    RAW_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    datatype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    bytes_contents: _containers.RepeatedScalarFieldContainer[bytes]
    raw_contents: bytes
    def __init__(self, datatype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., bytes_contents: _Optional[_Iterable[bytes]] = ..., raw_contents: _Optional[bytes] = ...) -> None: ...

class TaskRequest(_message.Message):
    __slots__ = ("task_id", "model", "submitted_at_ms", "inputs", "deadline_at_ms", "tenant", "no_cache", "low_priority", "callback_url")
    class InputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: InputTensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[InputTensor, _Mapping]] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    NO_CACHE_FIELD_NUMBER: _ClassVar[int]
    LOW_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_URL_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    model: str
    submitted_at_ms: int
    inputs: _containers.MessageMap[str, InputTensor]
    deadline_at_ms: int
    tenant: str
    no_cache: bool
    low_priority: bool
    callback_url: str
    def __init__(self, task_id: _Optional[str] = ..., model: _Optional[str] = ..., submitted_at_ms: _Optional[int] = ..., inputs: _Optional[_Mapping[str, InputTensor]] = ..., deadline_at_ms: _Optional[int] = ..., tenant: _Optional[str] = ..., no_cache: _Optional[bool] = ..., low_priority: _Optional[bool] = ..., callback_url: _Optional[str] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("at_ms", "error_class", "error_message")
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    at_ms: int
    error_class: str
    error_message: str
    def __init__(self, at_ms: _Optional[int] = ..., error_class: _Optional[str] = ..., error_message: _Optional[str] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("request", "error_class", "error_message", "attempts", "batch_id", "batch_task_ids", "model", "model_version", "source_partition", "source_offset", "failed_at_ms", "raw_request")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_PARTITION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FAILED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    RAW_REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: TaskRequest
    error_class: str
    error_message: str
    attempts: _containers.RepeatedCompositeFieldContainer[Attempt]
    batch_id: str
    batch_task_ids: _containers.RepeatedScalarFieldContainer[str]
    model: str
    model_version: str
    source_partition: int
    source_offset: int
    failed_at_ms: int
    raw_request: bytes
    def __init__(self, request: _Optional[_Union[TaskRequest, _Mapping]] = ..., error_class: _Optional[str] = ..., error_message: _Optional[str] = ..., attempts: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ..., batch_id: _Optional[str] = ..., batch_task_ids: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ..., source_partition: _Optional[int] = ..., source_offset: _Optional[int] = ..., failed_at_ms: _Optional[int] = ..., raw_request: _Optional[bytes] = ...) -> None: ...
