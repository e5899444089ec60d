"""Wire codec: a msgpack envelope plus one frame per large array buffer. No pickle, ever.

A message on the wire is ``[envelope, buffer_0, buffer_1, ...]`` (the bus puts routing or
topic frames in front). The envelope is msgpack of::

    {"k": kind, "s": sender, "n": sequence, "t": send time, "v": schema version, "p": payload}

Arrays inside the payload are replaced by a msgpack extension. An array of at least
:data:`INLINE_MAX` bytes becomes ``(frame index, dtype, shape, is_torch)`` and its bytes travel
as a separate frame that zmq sends without copying; a smaller one carries its bytes inside the
extension (one copy, but no frame: a frame costs more than copying a few KiB). Tuples are kept
apart from lists by another extension so nested tuples round-trip.

:func:`decode` trusts nothing: any malformed, truncated or unknown message raises
:class:`ProtocolError` with a one-line reason, which receivers count and log.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import struct
import sys
import threading
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

_EXT_ARRAY = 1  # (frame index, dtype, shape, is_torch); the bytes are frame ``index + 1``
_EXT_TUPLE = 2
_EXT_INLINE = 3  # u16 descriptor length, msgpack (dtype, shape, is_torch), the array's bytes
_ALLOWED_KINDS = frozenset("biuf")
_BF16 = "bf16"
_U16 = struct.Struct("<H")
# msgpack.ExtType's __new__ re-checks its arguments in Python on every array; ours are right.
_ext = functools.partial(tuple.__new__, msgpack.ExtType)
_ENVELOPE_KEYS = frozenset("ksntvp")
# Arrays below this many bytes travel inside the envelope. Read at every encode, so tests can
# force either path.
INLINE_MAX = 16 << 10
_CACHE_SIZE = 256  # per-thread caches of array descriptors (bounded: a peer may send anything)
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


class _Encoder(threading.local):
    """Reusable msgpack packers, one set per thread.

    Why: ``msgpack.packb`` builds a new Packer (and its buffer) on every call, which costs more
    than packing a small message; reusing one makes encode several times cheaper. The
    ``default`` hook needs the message's buffer list, so the state lives here, per thread.
    """

    def __init__(self):
        self.buffers: list = []
        self.kind = ""
        self.depth = 0
        self.packer = msgpack.Packer(default=self.default, use_bin_type=True,
                                     strict_types=True, autoreset=True)
        self.meta = msgpack.Packer(use_bin_type=True, autoreset=True)
        self.inline_heads: dict[tuple, bytes] = {}  # (dtype, shape, is_torch) -> ext head

    def default(self, obj):
        if isinstance(obj, np.ndarray):
            return self.array_ext(obj, is_torch=False)
        torch = sys.modules.get("torch")  # a process without torch has no tensors to send
        if torch is not None and isinstance(obj, torch.Tensor):
            return _tensor_ext(obj, self)
        if isinstance(obj, tuple):
            if self.depth >= MAX_TUPLE_DEPTH:
                raise TypeError(f"tuples nested deeper than {MAX_TUPLE_DEPTH} cannot travel")
            self.depth += 1
            try:  # the main packer is busy with the outer object: nest with a fresh one
                return msgpack.ExtType(_EXT_TUPLE, msgpack.packb(
                    list(obj), default=self.default, use_bin_type=True, strict_types=True))
            finally:
                self.depth -= 1
        if isinstance(obj, np.generic):
            return obj.item()
        raise TypeError(f"cannot encode {type(obj).__name__} in message {self.kind!r}")

    def array_ext(self, arr: np.ndarray, is_torch: bool, dtype_tag: str | None = None):
        if arr.dtype.kind not in _ALLOWED_KINDS:
            raise TypeError(f"arrays of dtype {arr.dtype} cannot travel on the wire")
        if arr.nbytes < INLINE_MAX:
            key = (dtype_tag or arr.dtype.str, arr.shape, is_torch)
            head = self.inline_heads.get(key)
            if head is None:
                if len(self.inline_heads) >= _CACHE_SIZE:
                    self.inline_heads.clear()
                meta = self.meta.pack(key)
                head = self.inline_heads[key] = _U16.pack(len(meta)) + meta
            # tobytes() is C order for any layout, so strides need no special case.
            return _ext((_EXT_INLINE, head + arr.tobytes()))
        if not arr.flags.c_contiguous:  # np.ascontiguousarray would turn 0-d into 1-d
            arr = arr.copy(order="C")
        index = len(self.buffers)
        # A 0-d or empty array still gets a frame so frame indices stay simple.
        self.buffers.append(arr.reshape(-1).view(np.uint8) if arr.size else b"")
        meta = (index, dtype_tag or arr.dtype.str, arr.shape, is_torch)
        return _ext((_EXT_ARRAY, self.meta.pack(meta)))


_encoder = _Encoder()


def encode(msg: Any, sender: str = "", seq: int = 0) -> list:
    """Frames for ``msg`` (a registered message dataclass). Large array buffers are not
    copied; arrays below :data:`INLINE_MAX` bytes are copied into the envelope."""
    enc = _encoder
    enc.buffers, enc.kind, enc.depth = [], msg.KIND, 0
    payload = {name: getattr(msg, name) for name in _field_info(type(msg))[2]}
    envelope = {
        "k": msg.KIND,
        "s": sender,
        "n": seq,
        "t": time.time(),
        "v": SCHEMA_VERSION,
        "p": payload,
    }
    try:
        head = enc.packer.pack(envelope)
    except BaseException:
        enc.packer.reset()  # a failed pack leaves partial bytes behind
        raise
    buffers, enc.buffers = enc.buffers, []
    return [head, *buffers]


def _tensor_ext(tensor, enc: _Encoder):
    import torch

    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.dtype == torch.bfloat16:
        return enc.array_ext(tensor.view(torch.int16).numpy(), True, _BF16)
    return enc.array_ext(tensor.numpy(), is_torch=True)


class _Decoder(threading.local):
    """Per-thread decoding state: the message's buffers, the ext hook bound once, and a cache
    of checked inline-array descriptors (the same few shapes arrive over and over)."""

    def __init__(self):
        self.views: list = []
        self.used: set[int] = set()
        self.depth = 0
        self.hook = self.ext_hook
        self.inline_specs: dict[bytes, tuple] = {}

    def unpack(self, data):
        return msgpack.unpackb(data, ext_hook=self.hook, raw=False, strict_map_key=False)

    def ext_hook(self, code, data):
        if code == _EXT_INLINE:
            return self.inline(data)
        if code == _EXT_TUPLE:
            if self.depth >= MAX_TUPLE_DEPTH:
                raise ProtocolError(f"tuples nested deeper than {MAX_TUPLE_DEPTH}")
            self.depth += 1
            try:
                return tuple(self.unpack(data))
            finally:
                self.depth -= 1
        if code == _EXT_ARRAY:
            return _decode_array(data, self.views, self.used)
        raise ProtocolError(f"unknown extension type {code}")

    def inline(self, data: bytes):
        start = 2 + (_U16.unpack_from(data)[0] if len(data) >= 2 else 0)
        head = data[:start]
        spec = self.inline_specs.get(head)
        if spec is None:
            try:
                dtype_tag, shape, is_torch = msgpack.unpackb(data[2:start], raw=False)
            except Exception:
                raise ProtocolError("malformed array descriptor") from None
            spec = (*_array_spec(dtype_tag, shape, is_torch), is_torch)
            if len(self.inline_specs) >= _CACHE_SIZE:
                self.inline_specs.clear()
            self.inline_specs[head] = spec
        dtype, shape, bf16, count, is_torch = spec
        if len(data) - start != count * dtype.itemsize:
            _check_length(len(data) - start, shape, dtype, count)
        arr = np.frombuffer(data, dtype=dtype, count=count, offset=start).reshape(shape)
        return _as_tensor(arr, bf16) if is_torch else arr


_decoder = _Decoder()


def decode(frames: list, offset: int = 0, end: int | None = None) -> Envelope:
    """Parse ``[envelope, *buffers]`` into an :class:`Envelope`; raise ProtocolError if bad.

    Frames may be ``bytes`` or ``zmq.Frame`` (received with ``copy=False``) or any buffer.
    The envelope is bytes ``offset:end`` of the first frame (after a transport header, or one
    of several envelopes in a batch).
    """
    if not frames:
        raise ProtocolError("empty message")
    dec = _decoder
    dec.views = views = [f if type(f) is bytes else _as_buffer(f) for f in frames]
    dec.used = used = set()
    dec.depth = 0
    try:
        envelope = dec.unpack(memoryview(views[0])[offset:end]
                              if offset or end is not None else views[0])
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises a zoo of types on garbage
        raise ProtocolError(f"undecodable envelope: {type(exc).__name__}: {exc}") from None
    finally:
        dec.views = []  # do not keep the frames alive
    if type(envelope) is not dict or not envelope.keys() >= _ENVELOPE_KEYS:
        raise ProtocolError("envelope is not a map with keys k, s, n, t, v, p")
    kind, version, payload = envelope["k"], envelope["v"], envelope["p"]
    # type() first: an array here would make ``!=`` ambiguous instead of False.
    if type(version) is not int or version != SCHEMA_VERSION:
        raise ProtocolError(f"schema version {_short(version)}, expected {SCHEMA_VERSION}")
    cls = message_class(kind) if type(kind) is str else None
    if cls is None:
        raise ProtocolError(f"unknown message kind {_short(kind)}")
    if type(payload) is not dict:
        raise ProtocolError(f"{kind}: payload is not a map")
    if len(used) != len(views) - 1:
        raise ProtocolError(f"{kind}: {len(views) - 1} buffer frames but {len(used)} referenced")
    names, checks, _ = _field_info(cls)
    if payload.keys() != names:
        missing, extra = sorted(names - payload.keys()), sorted(payload.keys() - names)
        raise ProtocolError(f"{kind}: fields do not match (missing {missing}, unexpected {extra})")
    for name, expected, annotation in checks:
        value = payload[name]
        if type(value) not in expected:
            raise ProtocolError(
                f"{kind}: field {name!r} should be {annotation}, got {type(value).__name__}")
    sender, seq, sent_at = envelope["s"], envelope["n"], envelope["t"]
    if type(sender) is not str or type(seq) is not int or type(sent_at) is not float:
        raise ProtocolError(f"{kind}: bad sender/sequence/time in envelope")
    return Envelope(kind, sender, seq, sent_at, cls(**payload))


def _short(value) -> str:
    """A one-line, bounded repr of a hostile value for an error message."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _as_buffer(frame):
    buffer = getattr(frame, "buffer", None)  # zmq.Frame received with copy=False
    if buffer is not None:
        return buffer
    try:
        return memoryview(frame).cast("B")
    except TypeError:
        raise ProtocolError(f"frame of type {type(frame).__name__} is not a buffer") from None


def _array_spec(dtype_tag, shape, is_torch) -> tuple[np.dtype, tuple, bool, int]:
    """Check a descriptor's (dtype, shape, is_torch); return (dtype, shape, bf16, count)."""
    if (type(dtype_tag) is not str or type(shape) is not list
            or not all(type(d) is int for d in shape) or type(is_torch) is not bool):
        raise ProtocolError("malformed array descriptor")
    shape = tuple(shape)
    if any(d < 0 for d in shape):
        raise ProtocolError(f"negative array dimension in {shape}")
    bf16 = dtype_tag == _BF16
    if bf16 and not is_torch:
        raise ProtocolError("bfloat16 travels only as a torch tensor")
    try:
        dtype = _dtype(dtype_tag)
    except TypeError:
        raise ProtocolError(f"unknown dtype {dtype_tag!r}") from None
    if dtype.kind not in _ALLOWED_KINDS:
        raise ProtocolError(f"dtype {dtype} not allowed on the wire")
    return dtype, shape, bf16, math.prod(shape)  # Python ints: a hostile shape cannot overflow


@functools.lru_cache(maxsize=64)
def _dtype(tag: str) -> np.dtype:
    return np.dtype("<i2" if tag == _BF16 else tag)


def _check_length(nbytes: int, shape, dtype, count: int) -> None:
    if nbytes != count * dtype.itemsize:
        raise ProtocolError(
            f"array frame has {nbytes} bytes, shape {shape} of {dtype} needs "
            f"{count * dtype.itemsize}"
        )


def _decode_array(data, views, used):
    try:
        index, dtype_tag, shape, is_torch = msgpack.unpackb(data, raw=False)
    except Exception:
        raise ProtocolError("malformed array descriptor") from None
    dtype, shape, bf16, count = _array_spec(dtype_tag, shape, is_torch)
    if type(index) is not int or not 0 <= index < len(views) - 1 or index in used:
        raise ProtocolError(f"array refers to missing or reused frame {index!r}")
    used.add(index)
    buffer = views[index + 1]
    _check_length(len(buffer), shape, dtype, count)
    arr = np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)
    return _as_tensor(arr, bf16) if is_torch else arr


def _as_tensor(arr: np.ndarray, bf16: bool):
    import torch  # only processes that receive tensors pay for importing torch

    tensor = torch.from_numpy(arr)
    return tensor.view(torch.bfloat16) if bf16 else tensor


_SIMPLE_TYPES = {"int": (int,), "float": (float, int), "str": (str,), "bool": (bool,),
                 "dict": (dict,), "list": (list,), "bytes": (bytes,)}


@functools.cache
def _field_info(cls) -> tuple[frozenset, tuple, tuple]:
    """Field names, the simple-type checks (``Any`` is left to the handler) and the ordered
    names of a message class. Cached: encode and decode run for every message."""
    checks = []
    for f in dataclasses.fields(cls):
        annotation = f.type if isinstance(f.type, str) else f.type.__name__
        expected = _SIMPLE_TYPES.get(annotation)
        if expected is not None:
            checks.append((f.name, expected, annotation))
    names = tuple(f.name for f in dataclasses.fields(cls))
    return frozenset(names), tuple(checks), names
