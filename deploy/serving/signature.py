"""The serving signature of an exported model, read from its `saved_model.pb` without
TensorFlow (publishing never loads it, see deploy/cloud/storage.py): the names and dtypes of the
`serving_default` inputs and outputs, which Vertex Explainable AI's metadata names.

The file is a `SavedModel` protocol buffer; only the few fields on the way to the signature are
decoded (field numbers from tensorflow/core/protobuf/{saved_model,meta_graph}.proto), every
other field is skipped by its wire type.
"""

from __future__ import annotations

import dataclasses

from deploy.cloud import api, storage

SERVING_TAG = "serve"
SIGNATURE = "serving_default"
# tensorflow/core/framework/types.proto
DTYPES = {1: "float32", 2: "float64", 3: "int32", 7: "string", 9: "int64", 10: "bool"}

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
# SavedModel.meta_graphs; MetaGraphDef.meta_info_def, .signature_def; MetaInfoDef.tags;
# SignatureDef.inputs, .outputs; TensorInfo.name, .dtype; map entries' key and value.
_META_GRAPHS, _META_INFO, _SIGNATURE_DEF, _TAGS = 2, 1, 5, 4
_INPUTS, _OUTPUTS, _NAME, _DTYPE, _KEY, _VALUE = 1, 2, 1, 2, 1, 2


@dataclasses.dataclass(frozen=True)
class Tensor:
    name: str  # the graph tensor, e.g. "serving_default_age:0"
    dtype: str  # a DTYPES value, or "dtype <n>"


@dataclasses.dataclass(frozen=True)
class Signature:
    """`serving_default`'s inputs and outputs, keyed by their names in the signature."""

    inputs: dict[str, Tensor]
    outputs: dict[str, Tensor]


def read(model_dir: str, *, client=None) -> Signature:
    """The `serving_default` signature of the SavedModel in `model_dir` (local or gs://);
    DeployError when there is no model there or it has no such signature."""
    path = model_dir.rstrip("/") + "/saved_model.pb"
    try:
        data = storage.read_bytes(path, client=client)
    except Exception as e:  # a missing object or file, no permission, ...
        raise api.cannot_read(e)(
            f"--model_dir {model_dir}: cannot read {path} ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else 'no detail'}). Point --model_dir at "
            "the exported model (JOB_DIR/model)."
        ) from None
    try:
        return parse(data)
    except ValueError as e:
        raise api.DeployError(f"--model_dir {model_dir}: {e}") from None


def parse(data: bytes) -> Signature:
    """The `serving_default` signature of the `serve` meta graph of a serialized SavedModel."""
    for meta_graph in _fields(data, _META_GRAPHS):
        tags = [
            bytes(tag).decode()
            for info in _fields(meta_graph, _META_INFO)
            for tag in _fields(info, _TAGS)
        ]
        if SERVING_TAG not in tags:
            continue
        for entry in _fields(meta_graph, _SIGNATURE_DEF):
            if _string(entry, _KEY) == SIGNATURE:
                definition = _first(entry, _VALUE)
                return Signature(
                    inputs=_tensor_map(definition, _INPUTS),
                    outputs=_tensor_map(definition, _OUTPUTS),
                )
        raise ValueError(f"the SavedModel has no '{SIGNATURE}' signature")
    raise ValueError(f"the SavedModel has no meta graph tagged '{SERVING_TAG}'")


def _tensor_map(definition: memoryview, field: int) -> dict[str, Tensor]:
    tensors = {}
    for entry in _fields(definition, field):
        info = _first(entry, _VALUE)
        dtype = next(iter(_fields(info, _DTYPE)), 0)
        tensors[_string(entry, _KEY)] = Tensor(
            _string(info, _NAME), DTYPES.get(int(dtype), f"dtype {dtype}")
        )
    return dict(sorted(tensors.items()))


def _first(message: memoryview, field: int) -> memoryview:
    return next(iter(_fields(message, field)), memoryview(b""))


def _string(message: memoryview, field: int) -> str:
    return bytes(_first(message, field)).decode()


def _fields(message: bytes | memoryview, wanted: int) -> list:
    """The values of field `wanted` in a serialized message: views of length-delimited fields,
    ints for varints. Other fields are skipped without copying (the graph is most of it)."""
    view = memoryview(message)
    found: list = []
    i, end = 0, len(view)
    while i < end:
        key, i = _varint(view, i)
        field, wire = key >> 3, key & 7
        value: int | memoryview
        if wire == _VARINT:
            value, i = _varint(view, i)
        elif wire == _LEN:
            size, i = _varint(view, i)
            value, i = view[i : i + size], i + size
        elif wire in (_I64, _I32):
            size = 8 if wire == _I64 else 4
            value, i = view[i : i + size], i + size
        else:
            raise ValueError(f"not a SavedModel (wire type {wire} before byte {i})")
        if i > end:
            raise ValueError("not a SavedModel (truncated)")
        if field == wanted:
            found.append(value)
    return found


def _varint(data: memoryview, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data):
            raise ValueError("not a SavedModel (truncated)")
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return value, i
        shift += 7
