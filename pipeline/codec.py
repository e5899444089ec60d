"""Wire codec: a msgpack envelope plus one frame per array buffer. No pickle, ever.

A message on the wire is ``[envelope, buffer_0, buffer_1, ...]`` (the bus puts routing or
topic frames in front). The envelope is msgpack of::

    {"k": kind, "s": sender, "n": sequence, "t": send time, "v": schema version, "p": payload}

Arrays inside the payload are replaced by a msgpack extension holding ``(frame index, dtype,
shape, is_torch)``; their bytes travel as separate frames that zmq sends without copying.
Tuples are kept apart from lists by another extension so nested tuples round-trip.

:func:`decode` trusts nothing: any malformed, truncated or unknown message raises
:class:`ProtocolError` with a one-line reason, which receivers count and log.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import warnings
from typing import Any, NamedTuple

import msgpack
import numpy as np

from pipeline.messages import SCHEMA_VERSION, message_class

# Arrays decoded from zmq frames are read-only views; torch warns about that on every
# conversion. Receivers that need to write copy explicitly.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
warnings.filterwarnings("ignore", message="The given buffer is not writable")

_EXT_ARRAY = 1
_EXT_TUPLE = 2
_ALLOWED_KINDS = frozenset("biuf")
_BF16 = "bf16"
# Every tuple level is a nested msgpack call, and each unpacker keeps ~40 KB of state on the C
# stack: a couple of hundred levels overflow it and the process dies (SIGSEGV) instead of raising.
MAX_TUPLE_DEPTH = 32


class ProtocolError(Exception):
    """A frame sequence that is not a valid message of a known kind."""


class Envelope(NamedTuple):
    kind: str
    sender: str
    seq: int
    sent_at: float
    message: Any


def encode(msg: Any, sender: str = "", seq: int = 0) -> list:
    """Frames for ``msg`` (a registered message dataclass). Array buffers are not copied."""
    buffers: list = []
    depth = 0

    def default(obj):
        nonlocal depth
        if isinstance(obj, np.ndarray):
            return _array_ext(obj, buffers, is_torch=False)
        torch = sys.modules.get("torch")  # a process without torch has no tensors to send
        if torch is not None and isinstance(obj, torch.Tensor):
            return _tensor_ext(obj, buffers)
        if isinstance(obj, tuple):
            if depth >= MAX_TUPLE_DEPTH:
                raise TypeError(f"tuples nested deeper than {MAX_TUPLE_DEPTH} cannot travel")
            depth += 1
            try:
                return msgpack.ExtType(_EXT_TUPLE, _pack(list(obj)))
            finally:
                depth -= 1
        if isinstance(obj, np.generic):
            return obj.item()
        raise TypeError(f"cannot encode {type(obj).__name__} in message {msg.KIND!r}")

    def _pack(obj):
        return msgpack.packb(obj, default=default, use_bin_type=True, strict_types=True)

    payload = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
    envelope = {
        "k": msg.KIND,
        "s": sender,
        "n": seq,
        "t": time.time(),
        "v": SCHEMA_VERSION,
        "p": payload,
    }
    return [_pack(envelope), *buffers]


def _array_ext(arr: np.ndarray, buffers: list, is_torch: bool, dtype_tag: str | None = None):
    if arr.dtype.kind not in _ALLOWED_KINDS:
        raise TypeError(f"arrays of dtype {arr.dtype} cannot travel on the wire")
    if not arr.flags.c_contiguous:  # np.ascontiguousarray would turn 0-d into 1-d
        arr = arr.copy(order="C")
    index = len(buffers)
    # A 0-d or empty array still gets a frame so frame indices stay simple.
    buffers.append(arr.reshape(-1).view(np.uint8) if arr.size else b"")
    meta = [index, dtype_tag or arr.dtype.str, list(arr.shape), is_torch]
    return msgpack.ExtType(_EXT_ARRAY, msgpack.packb(meta, use_bin_type=True))


def _tensor_ext(tensor, buffers: list):
    import torch

    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.dtype == torch.bfloat16:
        return _array_ext(tensor.view(torch.int16).numpy(), buffers, True, _BF16)
    return _array_ext(tensor.numpy(), buffers, is_torch=True)


def decode(frames: list) -> Envelope:
    """Parse ``[envelope, *buffers]`` into an :class:`Envelope`; raise ProtocolError if bad."""
    if not frames:
        raise ProtocolError("empty message")
    views = [_as_buffer(f) for f in frames]
    used: set[int] = set()
    depth = 0

    def ext_hook(code, data):
        nonlocal depth
        if code == _EXT_TUPLE:
            if depth >= MAX_TUPLE_DEPTH:
                raise ProtocolError(f"tuples nested deeper than {MAX_TUPLE_DEPTH}")
            depth += 1
            try:
                return tuple(_unpack(data))
            finally:
                depth -= 1
        if code == _EXT_ARRAY:
            return _decode_array(data, views, used)
        raise ProtocolError(f"unknown extension type {code}")

    def _unpack(data):
        return msgpack.unpackb(data, ext_hook=ext_hook, raw=False, strict_map_key=False)

    try:
        envelope = _unpack(views[0])
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises a zoo of types on garbage
        raise ProtocolError(f"undecodable envelope: {type(exc).__name__}: {exc}") from None
    if not isinstance(envelope, dict) or not {"k", "s", "n", "t", "v", "p"} <= envelope.keys():
        raise ProtocolError("envelope is not a map with keys k, s, n, t, v, p")
    kind, version, payload = envelope["k"], envelope["v"], envelope["p"]
    # type() first: an array here would make ``!=`` ambiguous instead of False.
    if type(version) is not int or version != SCHEMA_VERSION:
        raise ProtocolError(f"schema version {_short(version)}, expected {SCHEMA_VERSION}")
    cls = message_class(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message kind {_short(kind)}")
    if not isinstance(payload, dict):
        raise ProtocolError(f"{kind}: payload is not a map")
    if len(used) != len(views) - 1:
        raise ProtocolError(f"{kind}: {len(views) - 1} buffer frames but {len(used)} referenced")
    names = {f.name for f in dataclasses.fields(cls)}
    if payload.keys() != names:
        missing, extra = sorted(names - payload.keys()), sorted(payload.keys() - names)
        raise ProtocolError(f"{kind}: fields do not match (missing {missing}, unexpected {extra})")
    _check_field_types(cls, payload)
    sender, seq, sent_at = envelope["s"], envelope["n"], envelope["t"]
    if not isinstance(sender, str) or not isinstance(seq, int) or not isinstance(sent_at, float):
        raise ProtocolError(f"{kind}: bad sender/sequence/time in envelope")
    return Envelope(kind, sender, seq, sent_at, cls(**payload))


def _short(value) -> str:
    """A one-line, bounded repr of a hostile value for an error message."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _as_buffer(frame):
    if isinstance(frame, bytes):
        return frame
    buffer = getattr(frame, "buffer", None)  # zmq.Frame received with copy=False
    if buffer is not None:
        return buffer
    try:
        return memoryview(frame).cast("B")
    except TypeError:
        raise ProtocolError(f"frame of type {type(frame).__name__} is not a buffer") from None


def _decode_array(data, views, used):
    try:
        index, dtype_tag, shape, is_torch = msgpack.unpackb(data, raw=False)
    except Exception:
        raise ProtocolError("malformed array descriptor") from None
    if (not isinstance(dtype_tag, str) or not isinstance(shape, list)
            or not all(type(d) is int for d in shape) or not isinstance(is_torch, bool)):
        raise ProtocolError("malformed array descriptor")
    shape = tuple(shape)
    if type(index) is not int or not 0 <= index < len(views) - 1 or index in used:
        raise ProtocolError(f"array refers to missing or reused frame {index!r}")
    if any(d < 0 for d in shape):
        raise ProtocolError(f"negative array dimension in {shape}")
    bf16 = dtype_tag == _BF16
    if bf16 and not is_torch:
        raise ProtocolError("bfloat16 travels only as a torch tensor")
    try:
        dtype = np.dtype("<i2" if bf16 else dtype_tag)
    except TypeError:
        raise ProtocolError(f"unknown dtype {dtype_tag!r}") from None
    if dtype.kind not in _ALLOWED_KINDS:
        raise ProtocolError(f"dtype {dtype} not allowed on the wire")
    used.add(index)
    buffer = views[index + 1]
    count = math.prod(shape)  # Python ints: a hostile shape cannot overflow into a match
    if len(buffer) != count * dtype.itemsize:
        raise ProtocolError(
            f"array frame has {len(buffer)} bytes, shape {shape} of {dtype} needs "
            f"{count * dtype.itemsize}"
        )
    arr = np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)
    if not is_torch:
        return arr
    import torch  # only processes that receive tensors pay for importing torch

    tensor = torch.from_numpy(arr)
    return tensor.view(torch.bfloat16) if bf16 else tensor


_SIMPLE_TYPES = {"int": (int,), "float": (float, int), "str": (str,), "bool": (bool,),
                 "dict": (dict,), "list": (list,), "bytes": (bytes,)}


def _check_field_types(cls, payload: dict) -> None:
    """Check the fields annotated with simple types; ``Any`` fields are left to the handler."""
    for f in dataclasses.fields(cls):
        expected = _SIMPLE_TYPES.get(f.type if isinstance(f.type, str) else f.type.__name__)
        value = payload[f.name]
        if expected is None:
            continue
        if not isinstance(value, expected) or (expected == (int,) and isinstance(value, bool)):
            raise ProtocolError(
                f"{cls.KIND}: field {f.name!r} should be {f.type}, got {type(value).__name__}"
            )
