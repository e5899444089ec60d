"""Wire codec: a fixed binary header, msgpack for the fields, one frame per large array.
No pickle, ever.

A message on the wire is ``[envelope, buffer_0, buffer_1, ...]`` (the bus puts routing or
topic frames in front). The envelope is, back to back::

    header    _HEADER: u8 schema version, u8 kind length, u16 sender length,
              u32 array-table length, u32 body length, i64 sequence, f64 send time
    kind      utf-8
    sender    utf-8
    arrays    one descriptor per array: u8 dtype code, u8 flags, u8 ndim, ndim x u64 dims
    body      msgpack array of the message's field values, in declaration order
    inline    the bytes of the inline arrays, back to back

Why a fixed header instead of a msgpack map: the map's keys, the per-array extension hooks and
the checks on decoded Python objects cost more than the rest of a small message's trip.

Bodies are packed and unpacked with msgspec's msgpack (same bytes as msgpack-python, about a
third of the time per call for a small body: 0.5 vs 1.4 µs to unpack, 0.6 vs 1.5 µs to pack
the fields of a 64-byte ``Record``). msgspec writes every tuple as a plain array, so a message
whose fields hold anything but scalars, bytes and numpy arrays is packed by msgpack-python,
whose ``default`` hook keeps tuples as tuples.

Each array in the fields is an empty msgpack extension in the body that stands for the next
descriptor of the table, in order. An array of at least :data:`INLINE_MAX` bytes is *framed*
(flag 4): its bytes travel as the next buffer frame, which zmq sends without copying; a smaller
one is *inline*: its bytes follow the body (one copy, but no frame: a frame costs more than
copying a few KiB). Flag 1 marks a torch tensor, flag 2 a bfloat16 tensor (int16 bits).
Tuples are another extension (a nested msgpack array), so nested tuples round-trip.

:func:`decode` trusts nothing: the lengths must add up exactly, every descriptor and frame is
checked, and any malformed, truncated or unknown message raises :class:`ProtocolError` with a
one-line reason, which receivers count and log.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import struct
import sys
import threading
import time
import warnings
from typing import Any, NamedTuple

import msgpack
import msgspec
import numpy as np

from pipeline.messages import SCHEMA_VERSION, WIRE_KINDS, fills_its_dict

# Arrays decoded from zmq frames are read-only views; torch warns about that on every
# conversion. Receivers that need to write copy explicitly.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
warnings.filterwarnings("ignore", message="The given buffer is not writable")

_HEADER = struct.Struct("<BBHIIqd")
_HEADER_SIZE = _HEADER.size
_EXT_ARRAY = 1  # empty: the next descriptor of the array table
_EXT_TUPLE = 2  # a msgpack array
# Every array in a body is this same object: building an ExtType per array costs more than
# packing it.
_ARRAY_REF = msgpack.ExtType(_EXT_ARRAY, b"")
_MS_ARRAY_REF = msgspec.msgpack.Ext(_EXT_ARRAY, b"")
# Field value types msgspec packs exactly as msgpack-python with strict types does (containers
# are not: msgspec writes tuples as lists). A message of only these takes the msgspec path.
_FLAT_TYPES = frozenset({int, float, str, bool, type(None), bytes, np.ndarray})
_TORCH, _BF16, _FRAMED = 1, 2, 4
_FLAGS = _TORCH | _BF16 | _FRAMED
# dtype codes: the position in this tuple. Append only (codes are the wire format).
_DTYPE_NAMES = ("|b1", "|u1", "|i1", "<u2", "<i2", "<f2", "<u4", "<i4", "<f4", "<u8", "<i8",
                "<f8", ">u2", ">i2", ">f2", ">u4", ">i4", ">f4", ">u8", ">i8", ">f8")
_DTYPES = tuple(np.dtype(name) for name in _DTYPE_NAMES)
_CODES = {dtype: code for code, dtype in enumerate(_DTYPES)}
_INT16 = _CODES[np.dtype("<i2")]
MAX_NDIM = 32
_DIM_LIMIT = 1 << 63  # numpy sizes are signed 64-bit
# Arrays below this many bytes travel inside the envelope. Read at every encode, so tests can
# force either path.
INLINE_MAX = 16 << 10
_CACHE_SIZE = 256  # entries per cache of what peers send
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


_new_envelope = functools.partial(tuple.__new__, Envelope)  # skips NamedTuple's Python __new__


class _Spec(NamedTuple):
    """A checked array descriptor."""

    dtype: np.dtype
    shape: tuple
    count: int
    nbytes: int
    flags: int


class _Kind(NamedTuple):
    """What encode and decode need to know about a message class, computed once."""

    name: str
    name_bytes: bytes
    fields: tuple  # names in declaration order
    values: Any  # msg -> tuple of its field values
    checks: tuple  # (index, name, accepted types, annotation) of simply typed fields
    make: Any  # list of field values -> message


_SIMPLE_TYPES = {"int": (int,), "float": (float, int), "str": (str,), "bool": (bool,),
                 "dict": (dict,), "list": (list,), "bytes": (bytes,)}

# Caches shared by every thread (a dict operation is atomic); those filled from what peers send
# are bounded, since a peer may send anything.
_KINDS: dict[type, _Kind] = {}
_NAMES: dict[tuple, tuple] = {}  # (kind bytes, sender) -> (both joined, kind length, sender's)
_SENDERS: dict[bytes, str] = {}
_DESCRIPTORS: dict[tuple, bytes] = {}  # (dtype code, shape, flags) -> descriptor
_SPECS: dict[bytes, _Spec] = {}  # descriptor -> what it was checked to describe
_TABLES: dict[bytes, tuple] = {}  # array table -> its specs
# Per-thread state of the message being encoded or decoded.
_local = threading.local()


def _kind_of(cls) -> _Kind:
    kind = _KINDS.get(cls)
    if kind is not None:
        return kind
    fields = dataclasses.fields(cls)
    names = tuple(f.name for f in fields)
    checks = []
    for index, f in enumerate(fields):
        annotation = f.type if isinstance(f.type, str) else f.type.__name__
        expected = _SIMPLE_TYPES.get(annotation)
        if expected is not None:
            checks.append((index, f.name, expected, annotation))
    if len(names) > 1:
        values = operator.attrgetter(*names)
    else:
        def values(msg):
            return tuple([getattr(msg, name) for name in names])
    kind = _KINDS[cls] = _Kind(cls.KIND, cls.KIND.encode(), names, values, tuple(checks),
                               _maker(cls, fields))
    return kind


def _maker(cls, fields):
    """A function building ``cls`` from its field values, as ``cls(*values)`` does.

    Why: a frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``,
    0.8 µs for two fields; filling the instance's ``__dict__`` directly takes half that, which
    matters per small message received. Only for plain frozen dataclasses (no ``__post_init__``,
    slots, or fields outside ``__init__``); anything else is built by calling the class.
    """
    if not fills_its_dict(cls):
        return lambda values: cls(*values)
    lines = ["def make(values):", "    obj = new(cls)", "    state = obj.__dict__"]
    lines += [f"    state[{f.name!r}] = values[{i}]" for i, f in enumerate(fields)]
    lines.append("    return obj")
    namespace = {"new": object.__new__, "cls": cls}
    exec("\n".join(lines), namespace)  # field names only: identifiers, checked above
    return namespace["make"]


def _names(name: bytes, sender: str) -> tuple:
    sender_bytes = sender.encode()
    return _remember(_NAMES, (name, sender),
                     (name + sender_bytes, len(name), len(sender_bytes)))


def _remember(cache: dict, key, value):
    if len(cache) >= _CACHE_SIZE:
        cache.clear()
    cache[key] = value
    return value


# --- encode --------------------------------------------------------------------------------------


class _Encoder:
    """A reusable msgpack packer and the array lists of the message being encoded (one per
    thread).

    Why: ``msgpack.packb`` builds a new Packer (and its buffer) on every call, which costs more
    than packing a small message; reusing one makes encode several times cheaper. The
    ``default`` hook adds each array to the message's table, so that state lives here.
    """

    __slots__ = ("table", "inline", "frames", "kind", "depth", "packer", "flat")

    def __init__(self):
        self.table: list = []  # descriptors
        self.inline: list = []  # inline arrays' buffers
        self.frames: list = []  # framed arrays' buffers
        self.kind = ""
        self.depth = 0
        self.packer = msgpack.Packer(default=self.default, use_bin_type=True,
                                     strict_types=True, autoreset=True)
        # For messages of _FLAT_TYPES only: the hook sees nothing but numpy arrays.
        self.flat = msgspec.msgpack.Encoder(enc_hook=self.flat_array)

    def flat_array(self, arr):
        self.array(arr, 0)
        return _MS_ARRAY_REF

    def default(self, obj):
        if isinstance(obj, np.ndarray):
            return self.array(obj, 0)
        torch = sys.modules.get("torch")  # a process without torch has no tensors to send
        if torch is not None and isinstance(obj, torch.Tensor):
            return _tensor_ref(obj, self)
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

    def array(self, arr: np.ndarray, flags: int):
        code = _CODES.get(arr.dtype)
        if code is None:
            raise TypeError(f"arrays of dtype {arr.dtype} cannot travel on the wire")
        if arr.nbytes < INLINE_MAX:
            # Joined into the envelope as is when contiguous; tobytes() is C order otherwise.
            self.inline.append(arr if arr.flags.c_contiguous else arr.tobytes())
        else:
            flags |= _FRAMED
            if not arr.flags.c_contiguous:  # np.ascontiguousarray would turn 0-d into 1-d
                arr = arr.copy(order="C")
            # A 0-d or empty array still gets a frame so that frames and descriptors pair up.
            self.frames.append(arr.reshape(-1).view(np.uint8) if arr.size else b"")
        key = (code, arr.shape, flags)
        descriptor = _DESCRIPTORS.get(key)
        if descriptor is None:
            if arr.ndim > MAX_NDIM:
                raise TypeError(f"arrays of more than {MAX_NDIM} dimensions cannot travel")
            descriptor = _remember(_DESCRIPTORS, key, struct.pack(
                f"<3B{arr.ndim}Q", code, flags, arr.ndim, *arr.shape))
        self.table.append(descriptor)
        return _ARRAY_REF


def encode(msg: Any, sender: str = "", seq: int = 0) -> list:
    """Frames for ``msg`` (a registered message dataclass). Large array buffers are not
    copied; arrays below :data:`INLINE_MAX` bytes are copied into the envelope."""
    kind = _KINDS.get(type(msg)) or _kind_of(type(msg))
    try:
        enc = _local.encoder
    except AttributeError:
        enc = _local.encoder = _Encoder()
    enc.kind = kind.name
    values = kind.values(msg)
    try:
        for value in values:
            if type(value) not in _FLAT_TYPES:
                body = enc.packer.pack(list(values))
                break
        else:
            body = enc.flat.encode(values)
    except BaseException:
        enc.packer.reset()  # a failed pack leaves partial bytes behind
        enc.table, enc.inline, enc.frames, enc.depth = [], [], [], 0
        raise
    # kind and sender as they follow the header, with their lengths: one lookup per message
    names = _NAMES.get((kind.name_bytes, sender)) or _names(kind.name_bytes, sender)
    if not enc.table:
        return [b"".join([_HEADER.pack(SCHEMA_VERSION, names[1], names[2], 0, len(body), seq,
                                       time.time()), names[0], body])]
    table, inline, frames = b"".join(enc.table), enc.inline, enc.frames
    enc.table, enc.inline, enc.frames = [], [], []
    envelope = b"".join([_HEADER.pack(SCHEMA_VERSION, names[1], names[2], len(table),
                                      len(body), seq, time.time()),
                         names[0], table, body, *inline])
    return [envelope, *frames] if frames else [envelope]


def _tensor_ref(tensor, enc: _Encoder):
    import torch

    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.dtype == torch.bfloat16:
        return enc.array(tensor.view(torch.int16).numpy(), _TORCH | _BF16)
    return enc.array(tensor.numpy(), _TORCH)


# --- decode --------------------------------------------------------------------------------------


class _Decoder:
    """The arrays of the message being decoded and the ext hook that hands them out in order
    (one per thread)."""

    __slots__ = ("arrays", "next", "depth", "hook", "body")

    def __init__(self):
        self.arrays: list = []
        self.next = 0
        self.depth = 0
        self.hook = self.ext_hook
        self.body = msgspec.msgpack.Decoder(ext_hook=self.hook).decode

    def ext_hook(self, code, data):
        if code == _EXT_ARRAY:
            index = self.next
            if data:
                raise ProtocolError("array reference with a payload")
            if index >= len(self.arrays):
                raise ProtocolError(f"array reference {index} past a table of "
                                    f"{len(self.arrays)}")
            self.next = index + 1
            return self.arrays[index]
        if code == _EXT_TUPLE:
            if self.depth >= MAX_TUPLE_DEPTH:
                raise ProtocolError(f"tuples nested deeper than {MAX_TUPLE_DEPTH}")
            self.depth += 1
            try:
                value = msgspec.msgpack.decode(data, ext_hook=self.hook)
            except ProtocolError:
                raise
            except Exception as exc:
                raise ProtocolError(f"undecodable tuple: {type(exc).__name__}: "
                                    f"{_short(exc)}") from None
            finally:
                self.depth -= 1
            if type(value) is not list:
                raise ProtocolError(f"tuple extension holds a {type(value).__name__}")
            return tuple(value)
        raise ProtocolError(f"unknown extension type {code}")


def decode(frames: list, offset: int = 0, end: int | None = None) -> Envelope:
    """Parse ``[envelope, *buffers]`` into an :class:`Envelope`; raise ProtocolError if bad.

    Frames may be ``bytes`` or ``zmq.Frame`` (received with ``copy=False``) or any buffer.
    The envelope is bytes ``offset:end`` of the first frame (after a transport header, or one
    of several envelopes in a batch).
    """
    if not frames:
        raise ProtocolError("empty message")
    data = frames[0]
    if type(data) is not bytes:
        data = _as_buffer(data)
    if end is None:
        end = len(data)
    if end - offset < _HEADER_SIZE:
        raise ProtocolError(f"envelope of {max(0, end - offset)} bytes is shorter than its header")
    version, kind_len, sender_len, table_len, body_len, seq, sent_at = \
        _HEADER.unpack_from(data, offset)
    if version != SCHEMA_VERSION:
        raise ProtocolError(f"schema version {version}, expected {SCHEMA_VERSION}")
    kind_at = offset + _HEADER_SIZE
    table_at = kind_at + kind_len + sender_len
    body_at = table_at + table_len
    inline_at = body_at + body_len
    if inline_at > end:
        raise ProtocolError(f"envelope of {end - offset} bytes is shorter than its header "
                            f"says ({inline_at - offset} before the inline arrays)")
    # The small parts as bytes (slices of a bytes envelope are bytes already); in a copy,
    # positions are ``offset`` less than in the envelope.
    if type(data) is bytes:
        meta = data
    else:
        meta = bytes(data[offset:inline_at])
        kind_at, table_at, body_at = kind_at - offset, table_at - offset, body_at - offset
    raw = meta[kind_at:kind_at + kind_len]
    cls = WIRE_KINDS.get(raw)
    if cls is None:
        raise ProtocolError(f"unknown message kind {_short(raw)}")
    raw = meta[kind_at + kind_len:table_at]
    sender = _SENDERS.get(raw)
    if sender is None:
        try:
            sender = _remember(_SENDERS, raw, raw.decode())
        except UnicodeDecodeError:
            raise ProtocolError("sender in envelope is not utf-8") from None

    arrays = []
    if table_len:
        inline_at = _decode_arrays(frames, data, meta, table_at, body_at, inline_at, end, arrays)
    elif len(frames) > 1:
        raise ProtocolError(f"{len(frames) - 1} buffer frames but 0 referenced")
    if inline_at != end:
        raise ProtocolError(f"envelope has {end - inline_at} bytes after its inline arrays")

    try:
        dec = _local.decoder
    except AttributeError:
        dec = _local.decoder = _Decoder()
    dec.arrays, dec.next, dec.depth = arrays, 0, 0
    try:
        values = dec.body(meta[body_at:body_at + body_len])
    except ProtocolError:
        raise
    except Exception as exc:  # DecodeError, UnicodeDecodeError, RecursionError...
        raise ProtocolError(f"undecodable body: {type(exc).__name__}: {_short(exc)}") from None
    finally:
        dec.arrays = []  # do not keep the frames alive
    if dec.next != len(arrays):
        raise ProtocolError(f"{len(arrays)} arrays described but {dec.next} referenced")
    kind = _KINDS.get(cls) or _kind_of(cls)
    return _new_envelope((kind.name, sender, seq, sent_at, _checked(kind, values)))


def _checked(kind: _Kind, values) -> Any:
    """The message of ``kind`` built from its decoded field values, once they are checked."""
    if type(values) is not list or len(values) != len(kind.fields):
        raise ProtocolError(f"{kind.name}: body is not a list of the {len(kind.fields)} "
                            f"fields {kind.fields}")
    for index, name, expected, annotation in kind.checks:
        if type(values[index]) not in expected:
            raise ProtocolError(f"{kind.name}: field {name!r} should be {annotation}, "
                                f"got {type(values[index]).__name__}")
    return kind.make(values)


def _decode_arrays(frames, data, meta, at: int, table_end: int, inline_at: int, end: int,
                   arrays: list) -> int:
    """Check the array table ``meta[at:table_end]`` against the frames and the inline bytes
    of ``data``; append the arrays (views, no copies); return where the inline bytes end."""
    table = meta[at:table_end]
    # A peer sends the same few tables over and over: each is parsed and checked once.
    specs, uniform = _TABLES.get(table) or _remember(_TABLES, table, _check_table(table))
    if uniform is not None and len(frames) == 1 and \
            inline_at + uniform.nbytes * len(specs) <= end:
        # Many inline arrays of one dtype and shape back to back (a batch of small messages):
        # one view of them all, then a view per array.
        block = np.frombuffer(data, uniform.dtype, uniform.count * len(specs), inline_at)
        arrays.extend(block.reshape(len(specs), *uniform.shape))
        return inline_at + uniform.nbytes * len(specs)
    frame = 1
    for dtype, shape, count, nbytes, flags in specs:
        if flags & _FRAMED:
            if frame >= len(frames):
                raise ProtocolError(f"array refers to missing or reused frame {frame - 1}")
            buffer = frames[frame]
            if type(buffer) is not bytes:
                buffer = _as_buffer(buffer)
            frame += 1
            if len(buffer) != nbytes:
                raise ProtocolError(f"array frame has {len(buffer)} bytes, shape {shape} of "
                                    f"{dtype} needs {nbytes}")
            arr = np.frombuffer(buffer, dtype, count)
        else:
            if inline_at + nbytes > end:
                raise ProtocolError(f"inline array of {nbytes} bytes, shape {shape} of "
                                    f"{dtype}, runs past the end of the envelope")
            arr = np.frombuffer(data, dtype, count, inline_at)
            inline_at += nbytes
        if len(shape) != 1:
            arr = arr.reshape(shape)
        if flags & _TORCH:
            arr = _as_tensor(arr, flags & _BF16)
        arrays.append(arr)
    if frame != len(frames):
        raise ProtocolError(f"{len(frames) - 1} buffer frames but {frame - 1} referenced")
    return inline_at


def _check_table(table: bytes) -> tuple:
    """The checked specs of an array table (descriptors back to back), and the one spec they
    all share when they are several inline numpy arrays of at least one dimension (else
    None)."""
    specs, at = [], 0
    while at < len(table):
        if at + 3 > len(table) or at + 3 + 8 * table[at + 2] > len(table):
            raise ProtocolError("truncated array descriptor")
        descriptor = table[at:at + 3 + 8 * table[at + 2]]
        at += len(descriptor)
        specs.append(_SPECS.get(descriptor) or _remember(_SPECS, descriptor,
                                                         _check_descriptor(descriptor)))
    first = specs[0] if specs else None
    uniform = first if (len(specs) > 1 and not first.flags and first.shape
                        and all(spec == first for spec in specs)) else None
    return tuple(specs), uniform


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


def _check_descriptor(descriptor: bytes) -> _Spec:
    """Check an array descriptor (code, flags, ndim, dims) and say what it describes."""
    code, flags, ndim = descriptor[0], descriptor[1], descriptor[2]
    if code >= len(_DTYPES):
        raise ProtocolError(f"unknown dtype code {code}")
    if flags & ~_FLAGS:
        raise ProtocolError(f"unknown array flags {flags:#x}")
    if flags & _BF16 and (not flags & _TORCH or code != _INT16):
        raise ProtocolError("bfloat16 travels only as a torch tensor of int16 bits")
    if flags & _TORCH and _DTYPES[code].byteorder == ">":
        raise ProtocolError("torch tensors travel in little-endian byte order")
    if ndim > MAX_NDIM:
        raise ProtocolError(f"array of {ndim} dimensions (at most {MAX_NDIM})")
    shape = struct.unpack_from(f"<{ndim}Q", descriptor, 3)
    dtype = _DTYPES[code]
    count = math.prod(shape)  # Python ints: a hostile shape cannot overflow
    # numpy's sizes are signed 64-bit, also for a shape with a zero in it.
    if any(d >= _DIM_LIMIT for d in shape) or \
            math.prod(d for d in shape if d) * dtype.itemsize >= _DIM_LIMIT:
        raise ProtocolError(f"array shape {shape} is too large")
    return _Spec(dtype, shape, count, count * dtype.itemsize, flags)


_TENSOR_COPY_MAX = 64 << 10


def _as_tensor(arr: np.ndarray, bf16: int):
    """A received array as a torch tensor. torch has no read-only tensors: a small one is
    copied out of the read-only frame, a large one shares it (zero-copy; do not write to it)."""
    import torch  # only processes that receive tensors pay for importing torch

    if arr.flags.writeable:
        tensor = torch.from_numpy(arr)
    elif arr.nbytes < _TENSOR_COPY_MAX:
        tensor = torch.from_numpy(arr.copy())
    else:
        with warnings.catch_warnings():  # torch's "not writable" warning: known and documented
            warnings.simplefilter("ignore", UserWarning)
            tensor = torch.from_numpy(arr)
    return tensor.view(torch.bfloat16) if bf16 else tensor
