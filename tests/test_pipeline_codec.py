"""Wire codec: exact round trips (hypothesis), zero-copy sends, and garbage that must only ever
raise :class:`codec.ProtocolError`; plus a malformed message on a live reliable subscription."""

from __future__ import annotations

import asyncio
import contextlib
import re
import struct

import msgpack
import numpy as np
import pytest
import torch
import zmq
import zmq.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pipeline import batch_codec, codec
from pipeline.bus import Bus, TopicSpec
from pipeline.messages import SCHEMA_VERSION, Batch, ControlReply, Credit, Hello, Join, Record
from pipeline.sockets import SocketFactory

DTYPES = [np.bool_, np.uint8, np.int32, np.int64, np.float16, np.float32, np.float64]
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)

# Decoded tensors are read-only views of received frames (the codec says so); pytest resets the
# codec's own filter for this warning in every test.
pytestmark = pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")


# --- strategies ----------------------------------------------------------------------------------


@st.composite
def numpy_arrays(draw):
    dtype = draw(st.sampled_from(DTYPES))
    arr = draw(hnp.arrays(dtype, SHAPES))
    view = draw(st.sampled_from(["as_is", "step", "reverse", "transpose"]))
    if arr.ndim and view == "step":
        arr = arr[::2]
    elif arr.ndim and view == "reverse":
        arr = arr[::-1]  # negative strides
    elif view == "transpose":
        arr = arr.T
    return arr


@st.composite
def torch_tensors(draw):
    dtype = draw(st.sampled_from([*DTYPES, "bfloat16"]))
    base = draw(hnp.arrays(np.float32 if dtype == "bfloat16" else dtype, SHAPES))
    tensor = torch.from_numpy(base.copy())
    if dtype == "bfloat16":
        tensor = tensor.to(torch.bfloat16)
    if tensor.dim() and draw(st.booleans()):
        tensor = tensor[::2]
    if tensor.dim() >= 2 and draw(st.booleans()):
        tensor = tensor.transpose(0, -1)  # non-contiguous
    return tensor


leaves = st.one_of(
    numpy_arrays(), torch_tensors(),
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8),
    st.floats(allow_nan=False),
)
nests = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=6), children, max_size=3),
    ),
    max_leaves=8,
)


def assert_same(sent, got, path="data"):
    """Exact equality: container types (tuple vs list), dtype, shape and every byte."""
    if isinstance(sent, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: {type(got).__name__}, not a tensor"
        assert got.dtype == sent.dtype and tuple(got.shape) == tuple(sent.shape), path
        assert _tensor_bytes(got) == _tensor_bytes(sent), path
    elif isinstance(sent, np.ndarray):
        assert type(got) is np.ndarray, f"{path}: {type(got).__name__}, not an ndarray"
        assert got.dtype == sent.dtype and got.shape == sent.shape, path
        assert got.tobytes() == sent.tobytes(), path
    elif isinstance(sent, dict):
        assert type(got) is dict and list(got) == list(sent), path
        for key in sent:
            assert_same(sent[key], got[key], f"{path}[{key!r}]")
    elif isinstance(sent, list | tuple):
        assert type(got) is type(sent) and len(got) == len(sent), path
        for i, (a, b) in enumerate(zip(sent, got, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    else:
        assert type(got) is type(sent) and got == sent, path


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return tensor.numpy().tobytes()


@contextlib.contextmanager
def inline_max(nbytes: int):
    """Arrays below ``nbytes`` travel inside the envelope; 0 sends every array as a frame."""
    saved, codec.INLINE_MAX = codec.INLINE_MAX, nbytes
    try:
        yield
    finally:
        codec.INLINE_MAX = saved


def roundtrip(msg, copy_frames: bool, framed: bool = False):
    with inline_max(0 if framed else codec.INLINE_MAX):
        frames = codec.encode(msg, "tester.0", 7)
    if copy_frames:  # what a receiver gets off a socket: independent bytes
        frames = [bytes(memoryview(f).cast("B")) if not isinstance(f, bytes) else f
                  for f in frames]
    return codec.decode(frames)


# --- round trips ---------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(origin=st.integers(-(2**63), 2**63 - 1), data=nests, copy_frames=st.booleans(),
       framed=st.booleans())
def test_record_roundtrip_is_exact(origin, data, copy_frames, framed):
    envelope = roundtrip(Record(origin=origin, data=data), copy_frames, framed)
    assert envelope.kind == "record" and envelope.sender == "tester.0" and envelope.seq == 7
    assert isinstance(envelope.sent_at, float)
    assert envelope.message.origin == origin
    assert_same(data, envelope.message.data)


@pytest.mark.parametrize("framed", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (5,), (2, 3, 4)])
def test_every_dtype_and_shape_roundtrips(dtype, shape, framed):
    arr = np.asarray(np.arange(int(np.prod(shape))).reshape(shape) % 3).astype(dtype)
    tensor = torch.from_numpy(arr.copy())
    data = {"np": arr, "torch": tensor, "pair": (arr, [tensor])}
    assert_same(data, roundtrip(Record(1, data), copy_frames=True, framed=framed).message.data)


@pytest.mark.parametrize("framed", [False, True])
def test_bfloat16_and_scalar_tensors_roundtrip(framed):
    data = (torch.tensor(1.5, dtype=torch.bfloat16), torch.zeros(0, 2, dtype=torch.bfloat16),
            torch.randn(3, 4).to(torch.bfloat16).t(), torch.tensor(3), np.float32(2.5))
    got = roundtrip(Record(0, data), copy_frames=True, framed=framed).message.data
    assert_same(data[:4], got[:4])
    assert got[4] == 2.5 and isinstance(got[4], float)  # numpy scalars travel as Python numbers


def test_torch_tensor_with_grad_is_sent_detached():
    tensor = torch.randn(3, requires_grad=True)
    got = roundtrip(Record(0, tensor), copy_frames=True).message.data
    assert isinstance(got, torch.Tensor) and not got.requires_grad
    assert torch.equal(got, tensor.detach())


def test_unsendable_payloads_fail_on_encode():
    for bad in (np.array(["a"]), np.zeros(2, complex), object(), {1, 2}):
        with pytest.raises(TypeError):
            codec.encode(Record(0, bad))


@pytest.mark.parametrize("as_buffer", [bytes, bytearray, memoryview])
def test_an_envelope_inside_a_larger_buffer_decodes(as_buffer):
    """The bus decodes envelopes after a transport header and back to back in a batch."""
    data = {"small": np.arange(5, dtype=np.int16), "big": np.arange(codec.INLINE_MAX)}
    first, *buffers = codec.encode(Record(3, data), "s", 1)
    second = codec.encode(Record(4, None), "s", 2)[0]
    joined = as_buffer(b"HEAD" + first + second + b"TAIL")
    got = codec.decode([joined, *buffers], 4, 4 + len(first)).message
    assert got.origin == 3
    assert_same(data, got.data)
    assert codec.decode([joined], 4 + len(first), len(joined) - 4).message == Record(4, None)
    with pytest.raises(codec.ProtocolError):
        codec.decode([joined], 4 + len(first), len(joined))


# --- zero copy -----------------------------------------------------------------------------------


def test_large_numpy_array_is_not_copied_on_encode():
    big = np.arange(1 << 20, dtype=np.float64)  # 8 MiB
    frames = codec.encode(Record(1, {"x": big, "y": (big[:codec.INLINE_MAX // 8],)}))
    assert len(frames) == 3
    assert np.shares_memory(frames[1], big)
    assert np.shares_memory(frames[2], big)


def test_small_arrays_travel_inside_the_envelope():
    small = np.arange(codec.INLINE_MAX // 8 - 1, dtype=np.float64)  # just below the limit
    data = {"np": small, "torch": torch.from_numpy(small)[::3], "big": np.zeros(codec.INLINE_MAX)}
    frames = codec.encode(Record(1, data))
    assert len(frames) == 2  # envelope + the one large array
    assert_same(data, codec.decode(frames).message.data)


def test_large_torch_tensor_is_not_copied_on_encode():
    big = torch.arange(1 << 20, dtype=torch.float32)
    frames = codec.encode(Record(1, [big, big.to(torch.bfloat16)]))
    assert np.shares_memory(frames[1], big.numpy())


def test_decoded_array_is_a_view_of_the_received_frame():
    big = np.arange(1 << 16, dtype=np.int64)
    frames = [bytes(f) if isinstance(f, bytes) else bytearray(f)
              for f in codec.encode(Record(1, big))]
    got = codec.decode(frames).message.data
    assert np.shares_memory(got, np.frombuffer(frames[1], np.uint8))


# --- garbage -------------------------------------------------------------------------------------
#
# Envelopes forged by hand, byte by byte, from the layout in pipeline.codec's docstring: the
# helpers below are a second, independent writer of the format.

HEADER = struct.Struct("<BBHIIqd")  # version, kind len, sender len, table len, body len, seq, time
DTYPE_CODES = {"|b1": 0, "|u1": 1, "|i1": 2, "<u2": 3, "<i2": 4, "<f2": 5, "<u4": 6, "<i4": 7,
               "<f4": 8, "<u8": 9, "<i8": 10, "<f8": 11}
TORCH, BF16, FRAMED = 1, 2, 4
REF = msgpack.ExtType(1, b"")  # stands for the next array of the table


def descriptor(dtype="<i8", shape=(1,), flags=0, code=None, ndim=None) -> bytes:
    code = DTYPE_CODES[dtype] if code is None else code
    ndim = len(shape) if ndim is None else ndim
    return struct.pack(f"<3B{len(shape)}Q", code, flags, ndim, *shape)


def forge(body=None, *, kind="record", sender="x", seq=1, sent_at=1.5, version=SCHEMA_VERSION,
          table=(), inline=b"", raw_body=None, lengths=None) -> bytes:
    """An envelope; ``body`` is packed with msgpack unless ``raw_body`` gives its bytes, and
    ``lengths`` (kind, sender, table, body) forges the header's length fields."""
    kind_b = kind if isinstance(kind, bytes) else kind.encode()
    sender_b = sender if isinstance(sender, bytes) else sender.encode()
    table_b = b"".join(table)
    body_b = raw_body if raw_body is not None else msgpack.packb(
        [1, None] if body is None else body)
    lengths = lengths or (len(kind_b), len(sender_b), len(table_b), len(body_b))
    return HEADER.pack(version, *lengths, seq, sent_at) + kind_b + sender_b + table_b + body_b \
        + inline


def _record_with(data, table=(), inline=b"", *buffers) -> list:
    return [forge([1, data], table=table, inline=inline), *buffers]


def _valid_frames() -> list:
    """Two arrays in frames of their own, two inside the envelope."""
    n = codec.INLINE_MAX // 8 + 3
    data = {"a": np.arange(2 * n, dtype=np.int32).reshape(2, n),
            "b": (torch.ones(codec.INLINE_MAX // 4), [1, "x"]),
            "c": np.arange(6, dtype=np.int16).reshape(3, 2),
            "d": torch.ones(2, dtype=torch.bfloat16)}
    return [bytes(memoryview(f).cast("B")) for f in codec.encode(Record(5, data), "s", 3)]


def assert_protocol_error(frames, match: str | None = None):
    with pytest.raises(codec.ProtocolError, match=match) as info:
        codec.decode(frames)
    assert "\n" not in str(info.value)


def test_a_hand_built_envelope_decodes_like_an_encoded_one():
    inline = np.arange(6, dtype=np.int16).reshape(3, 2)
    framed = np.arange(4, dtype=np.float32)
    table = [descriptor("<i2", (3, 2)), descriptor("<f4", (4,), FRAMED)]
    body = [7, {"s": msgpack.ExtType(2, msgpack.packb([REF, "x"])), "f": REF}]
    frames = [forge(body, kind="record", sender="me", seq=9, sent_at=2.5, table=table,
                    inline=inline.tobytes()), framed.tobytes()]
    envelope = codec.decode(frames)
    assert envelope[:4] == ("record", "me", 9, 2.5)
    assert envelope.message.origin == 7
    assert_same({"s": (inline, "x"), "f": framed}, envelope.message.data)

    # ... and the encoder writes exactly that (but for the send time).
    with inline_max(16):
        encoded = codec.encode(Record(7, {"s": (inline, "x"), "f": framed}), "me", 9)
    assert len(encoded) == 2 and bytes(encoded[1]) == framed.tobytes()
    assert encoded[0][:HEADER.size - 8] == frames[0][:HEADER.size - 8]
    assert encoded[0][HEADER.size:] == frames[0][HEADER.size:]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=4))
def test_random_frames_only_raise_protocol_error(frames):
    with contextlib.suppress(codec.ProtocolError):  # and nothing else
        codec.decode(frames)


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_mutated_envelopes_only_raise_protocol_error(data):
    frames = _valid_frames()
    envelope = bytearray(frames[0])
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(envelope) - 1))
        envelope[pos] = data.draw(st.integers(0, 255))
    with contextlib.suppress(codec.ProtocolError):  # and nothing else
        codec.decode([bytes(envelope), *frames[1:]])


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_forged_header_lengths_only_raise_protocol_error(data):
    frames = _valid_frames()
    envelope = bytearray(frames[0])
    field = data.draw(st.sampled_from([(1, "B"), (2, "H"), (4, "I"), (8, "I")]))
    offset, fmt = field
    struct.pack_into("<" + fmt, envelope, offset,
                     data.draw(st.integers(0, 2 ** (8 * struct.calcsize(fmt)) - 1)))
    with contextlib.suppress(codec.ProtocolError):  # and nothing else
        codec.decode([bytes(envelope), *frames[1:]])


@settings(max_examples=300, deadline=None)
@given(st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
              st.text(max_size=4), st.binary(max_size=4),
              st.sampled_from([REF, msgpack.ExtType(2, b"\x90"), msgpack.ExtType(1, b"x")])),
    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=2), c,
                                                                  max_size=4)),
    max_leaves=10))
def test_wellformed_msgpack_of_the_wrong_shape_only_raises_protocol_error(value):
    for kind in ("record", "hello", "bus.credit", "control.reply"):
        for candidate in (value, [value], [1, value], [value, value, value]):
            for table, inline in (((), b""), ((descriptor(),), b"\0" * 8)):
                with contextlib.suppress(codec.ProtocolError):  # and nothing else
                    codec.decode([forge(candidate, kind=kind, table=table, inline=inline)])


def test_every_truncation_of_the_envelope_is_a_protocol_error():
    frames = _valid_frames()
    for cut in range(len(frames[0])):
        assert_protocol_error([frames[0][:cut], *frames[1:]])


def test_truncated_buffer_frames_are_protocol_errors():
    frames = _valid_frames()
    for i in range(1, len(frames)):
        for cut in (0, len(frames[i]) - 1):
            broken = list(frames)
            broken[i] = frames[i][:cut]
            assert_protocol_error(broken, "bytes")


def test_wrong_frame_counts_and_lengths():
    frames = _valid_frames()
    assert_protocol_error([])
    assert_protocol_error(frames[:-1], "missing or reused frame")
    assert_protocol_error(frames[:1], "missing or reused frame")
    assert_protocol_error([*frames, b""], "buffer frames but")
    assert_protocol_error([frames[0], frames[1] + b"\0", *frames[2:]], "bytes")
    assert_protocol_error([frames[0], *frames[2:], frames[1]])  # buffers swapped
    assert_protocol_error([forge(), b"\0"], "buffer frames but 0")


def test_unknown_kind_and_schema_versions():
    assert_protocol_error([forge(kind="no.such.kind")], "unknown message kind")
    assert_protocol_error([forge(kind=b"\xff\xfe")], "unknown message kind")
    assert_protocol_error([forge(kind="")], "unknown message kind")
    for version in (0, 1, SCHEMA_VERSION + 1, 255):
        assert_protocol_error([forge(version=version)], "schema version")
    legacy = msgpack.packb({"k": "record", "s": "x", "n": 1, "t": 1.0, "v": 1,
                            "p": {"origin": 1, "data": None}})
    assert_protocol_error([legacy], "schema version")  # the msgpack-map envelope of version 1


def test_envelope_structure_errors():
    good = forge()
    assert codec.decode([good]).message == Record(1, None)
    for cut in (0, 1, HEADER.size - 1):
        assert_protocol_error([good[:cut]], "shorter than its header")
    assert_protocol_error([good + b"\0"], "after its inline arrays")
    assert_protocol_error([forge(lengths=(6, 1, 0, 99))], "shorter than its header says")
    assert_protocol_error([forge(lengths=(7, 1, 0, 3))])
    assert_protocol_error([forge(sender=b"\xff")], "sender")
    assert_protocol_error([forge({"origin": 1, "data": None})], "not a list of the 2 fields")
    assert_protocol_error([forge("record")], "not a list")
    assert_protocol_error([forge(raw_body=b"\xc1")], "undecodable body")
    assert_protocol_error([forge(raw_body=msgpack.packb([1, None]) + b"\0")], "undecodable")
    assert_protocol_error(["not a buffer"], "not a buffer")
    assert_protocol_error(_record_with(REF, [descriptor(flags=FRAMED)], b"", "not a buffer"),
                          "not a buffer")
    assert_protocol_error([forge([1, msgpack.ExtType(9, b"")])], "extension")
    assert_protocol_error([forge([1, msgpack.ExtType(3, b"\0\0")])], "extension")


def test_array_references_must_match_the_table():
    one = (descriptor(),)
    assert_protocol_error([forge([1, REF])], "past a table of 0")
    assert_protocol_error([forge([1, [REF, REF]], table=one, inline=b"\0" * 8)], "past a table")
    assert_protocol_error([forge([1, None], table=one, inline=b"\0" * 8)],
                          "1 arrays described but 0 referenced")
    assert_protocol_error([forge([1, msgpack.ExtType(1, b"\0")], table=one, inline=b"\0" * 8)],
                          "payload")


@pytest.mark.parametrize("body,match", [
    ([1], "fields"),
    ([1, None, 3], "fields"),
    ([], "fields"),
    (["1", None], "origin"),
    ([1.0, None], "origin"),
    ([True, None], "origin"),
    ([None, None], "origin"),
])
def test_record_fields_are_checked(body, match):
    assert_protocol_error([forge(body)], match)


@pytest.mark.parametrize("cls,body,match", [
    (Hello, ["a", "12", {}], "pid"),
    (Hello, ["a", 12, []], "endpoints"),
    (Hello, [3, 12, {}], "instance"),
    (Join, ["t", "g", "i", "5", 0], "credit"),
    (Join, ["t", "g", "i", 5, 1.5], "credit_bytes"),
    (Credit, ["t", None], "acked"),
    (ControlReply, [1, {}, ""], "ok"),
    (ControlReply, [True, {}, b"x"], "reason"),
])
def test_simple_field_types_are_checked(cls, body, match):
    assert_protocol_error([forge(body, kind=cls.KIND)], match)


@pytest.mark.parametrize("code", [21, 22, 100, 255])
def test_unknown_dtype_codes_are_protocol_errors(code):
    assert_protocol_error(_record_with(REF, [descriptor(code=code)], b"\0" * 8), "dtype code")


@pytest.mark.parametrize("table,buffers,match", [
    ([descriptor(flags=FRAMED)], [], "missing or reused frame"),
    ([descriptor(flags=FRAMED)], [b"\0" * 7], "bytes"),  # frame too short
    ([descriptor(flags=FRAMED)], [b"\0" * 9], "bytes"),  # too long
    ([descriptor(shape=(2,), flags=FRAMED)], [b"\0" * 8], "bytes"),
    ([descriptor(shape=(2**62, 4), flags=FRAMED)], [b"\0" * 8], "too large"),  # 2**64 wraps to 0
    ([descriptor(shape=(2**64 - 1,), flags=FRAMED)], [b"\0" * 8], "too large"),
    ([descriptor(shape=(0, 2**63), flags=FRAMED)], [b""], "too large"),
    ([descriptor(shape=(0, 2**61, 8), flags=FRAMED)], [b""], "too large"),
    ([descriptor(flags=8 | FRAMED)], [b"\0" * 8], "flags"),
    ([descriptor(flags=128)], [], "flags"),
    ([descriptor("<i2", (4,), BF16 | FRAMED)], [b"\0" * 8], "bfloat16"),  # not a tensor
    ([descriptor("<f2", (4,), BF16 | TORCH | FRAMED)], [b"\0" * 8], "bfloat16"),  # not int16
    ([descriptor(code=16, flags=TORCH | FRAMED)], [b"\0" * 4], "byte order"),  # >i4 tensor
    ([descriptor(shape=(1,) * 33, flags=FRAMED)], [b"\0" * 8], "dimensions"),
    ([descriptor(shape=(1,), ndim=2, flags=FRAMED)], [b"\0" * 8], "truncated"),
    ([descriptor(flags=FRAMED)[:-1]], [b"\0" * 8], "truncated"),
    ([b"\x0a\x04"], [b"\0" * 8], "truncated"),
])
def test_bad_framed_arrays_are_protocol_errors(table, buffers, match):
    assert_protocol_error(_record_with(REF, table, b"", *buffers), match)


@pytest.mark.parametrize("table,inline,match", [
    ([descriptor(shape=(2,))], b"\0" * 8, "past the end"),  # bytes too short
    ([descriptor(shape=(1,))], b"\0" * 9, "after its inline arrays"),  # too long
    ([descriptor(shape=(2**62, 4))], b"\0" * 8, "too large"),
    ([descriptor(shape=(2**63,))], b"\0" * 8, "too large"),
    ([descriptor(flags=TORCH | BF16)], b"\0" * 8, "bfloat16"),
    ([descriptor(shape=(1,), ndim=3)], b"\0" * 8, "truncated"),
])
def test_bad_inline_arrays_are_protocol_errors(table, inline, match):
    assert_protocol_error(_record_with(REF, table, inline), match)


def test_two_arrays_cannot_share_a_frame():
    table = [descriptor(flags=FRAMED), descriptor(flags=FRAMED)]
    assert_protocol_error(_record_with([REF, REF], table, b"", b"\0" * 8), "missing or reused")


def test_deep_tuple_nesting_is_a_protocol_error_not_a_crash():
    # Each tuple level is a nested msgpack call with ~40 KB of C stack: ~200 levels used to
    # kill the receiving process with SIGSEGV. Now the depth is bounded on both sides.
    deep = msgpack.ExtType(2, msgpack.packb([]))
    for _ in range(3000):
        deep = msgpack.ExtType(2, msgpack.packb([deep]))
    assert_protocol_error(_record_with(deep), "nested deeper")

    nested = ()
    for _ in range(codec.MAX_TUPLE_DEPTH - 1):
        nested = (nested,)
    assert_same(nested, roundtrip(Record(0, nested), copy_frames=True).message.data)
    with pytest.raises(TypeError, match="nested deeper"):
        codec.encode(Record(0, (nested,)))


# --- a malformed message on a live reliable subscription ----------------------------------------


U64 = struct.Struct("<Q")


def _delivery(routing_id: bytes, counter: int, frames: list) -> list:
    return [routing_id, b"D" + U64.pack(counter) + bytes(frames[0]), *frames[1:]]


async def _malformed_over_the_wire(tmp_path) -> None:
    """A raw ROUTER plays the publisher (protocol in pipeline.bus): deliveries are
    ``[routing id, b"D" + u64 delivery counter + envelope, *buffers]``."""
    ctx = zmq.asyncio.Context()
    raw = ctx.socket(zmq.ROUTER)
    raw.linger = 0
    endpoint = f"ipc://{tmp_path}/numbers"
    raw.bind(endpoint)
    bus = Bus("sink.0~0", "sink", {"numbers": TopicSpec("reliable", 100)}, {}, {},
              sockets=SocketFactory(ctx))
    try:
        bus.set_peers({"numbers": [endpoint]}, {})
        sub = bus.subscriber("numbers")
        routing_id, *join = await raw.recv_multipart()
        assert isinstance(codec.decode(join).message, Join)

        big = np.arange(codec.INLINE_MAX)  # large enough to travel in a frame of its own
        good = codec.encode(Record(1, big), "source.0~0", 1)
        garbage = [
            [b"\x00\xff garbage"],  # undecodable envelope
            [forge(kind="no.such.kind")],
            [*good[:1]],  # its buffer frame is missing
            [good[0], good[1], b"extra"],
        ]
        delivery = 0
        for frames in garbage:
            delivery += 1
            await raw.send_multipart(_delivery(routing_id, delivery, frames))
        delivery += 1
        await raw.send_multipart(_delivery(routing_id, delivery, good))

        envelope = await sub.recv()  # the subscriber survived the garbage
        assert envelope.message.origin == 1
        np.testing.assert_array_equal(envelope.message.data, big)
        assert sub.stats.malformed == len(garbage)
        assert sub.stats.gaps == 0 and sub.stats.received == 1

        # Malformed messages are acknowledged (credit comes back), so nothing stalls.
        acked = 0
        while acked < len(garbage):
            _, *frames = await raw.recv_multipart()
            credit = codec.decode(frames).message
            assert isinstance(credit, Credit) and credit.topic == "numbers"
            acked += credit.acked
        assert acked == len(garbage)

        # ... and it keeps working afterwards.
        delivery += 1
        await raw.send_multipart(
            _delivery(routing_id, delivery, codec.encode(Record(2, (1, [2.5])), "source.0~0", 2)))
        envelope = await sub.recv()
        assert envelope.message.origin == 2 and envelope.message.data == (1, [2.5])
        assert sub.stats.malformed == len(garbage) and sub.stats.gaps == 0
    finally:
        bus.close()
        raw.close(linger=0)
        ctx.term()  # hangs (and times out) if any socket was left open


@pytest.mark.timeout(60)
def test_malformed_message_is_counted_and_the_subscriber_keeps_working(tmp_path):
    asyncio.run(asyncio.wait_for(_malformed_over_the_wire(tmp_path), 30))


async def _bad_framing_over_the_wire(tmp_path) -> None:
    ctx = zmq.asyncio.Context()
    raw = ctx.socket(zmq.ROUTER)
    raw.linger = 0
    endpoint = f"ipc://{tmp_path}/numbers"
    raw.bind(endpoint)
    bus = Bus("sink.0~0", "sink", {"numbers": TopicSpec("reliable", 100)}, {}, {},
              sockets=SocketFactory(ctx))
    try:
        bus.set_peers({"numbers": [endpoint]}, {})
        sub = bus.subscriber("numbers")
        routing_id, *_ = await raw.recv_multipart()
        await raw.send_multipart([routing_id, b"D"])  # no delivery counter at all
        await raw.send_multipart([routing_id, b"D\x01", *codec.encode(Record(0, None))])  # short counter
        await raw.send_multipart([routing_id, b"D" + U64.pack(1)])  # counter, no envelope
        good = codec.encode(Record(1, None), "source.0~0", 2)
        await raw.send_multipart(_delivery(routing_id, 2, good))
        envelope = await asyncio.wait_for(sub.recv(), 2)
        assert envelope.message.origin == 1
        assert sub.stats.malformed == 3 and sub.stats.gaps == 0
    finally:
        bus.close()
        raw.close(linger=0)
        ctx.term()


@pytest.mark.timeout(60)
def test_bad_framing_is_counted_and_the_subscriber_keeps_working(tmp_path):
    asyncio.run(asyncio.wait_for(_bad_framing_over_the_wire(tmp_path), 30))


async def _garbage_control_to_publisher(tmp_path) -> None:
    ctx = zmq.asyncio.Context()
    endpoint = f"ipc://{tmp_path}/numbers"
    pub_bus = Bus("source.0~0", "source", {"numbers": TopicSpec("reliable", 100)},
                  {"numbers": endpoint}, {"numbers": ["sink"]}, sockets=SocketFactory(ctx))
    sub_bus = Bus("sink.0~0", "sink", {"numbers": TopicSpec("reliable", 100)}, {}, {},
                  sockets=SocketFactory(ctx))
    raw = ctx.socket(zmq.DEALER)
    raw.linger = 0
    try:
        pub = pub_bus.publisher("numbers")
        raw.connect(pub.endpoint)
        await raw.send_multipart([b"\xc1 not msgpack"])
        await raw.send_multipart([forge([1], kind="bus.join")])
        sub_bus.set_peers({"numbers": [pub.endpoint]}, {})
        sub = sub_bus.subscriber("numbers")
        for i in range(1, 51):
            await pub.send(Record(i, np.full(3, i)))
        for i in range(1, 51):
            assert (await sub.recv()).message.origin == i
        assert pub.stats.malformed == 2
        assert sub.stats.gaps == 0 and sub.stats.malformed == 0
    finally:
        pub_bus.close()
        sub_bus.close()
        raw.close(linger=0)
        ctx.term()


@pytest.mark.timeout(60)
def test_garbage_control_messages_do_not_disturb_a_reliable_publisher(tmp_path):
    asyncio.run(asyncio.wait_for(_garbage_control_to_publisher(tmp_path), 30))


def test_a_batch_round_trips_its_messages_in_order_with_their_arrays():
    big = np.arange(codec.INLINE_MAX, dtype=np.uint8)  # a framed array among inline ones
    msgs = [Record(1, np.arange(3.0)), Record(2, big), Record(3, None)]
    # as wire_messages would batch them, framed array included (send_many sends that alone)
    frames = codec.encode(Batch([["record", m.origin, m.data] for m in msgs]), "source.0~0", 9)
    assert len(frames) == 2
    envelope = codec.decode(frames)
    items = batch_codec.unbatch(envelope)
    assert [e.kind for e in items] == ["record"] * 3
    assert [(e.sender, e.seq) for e in items] == [("source.0~0", 9)] * 3
    for got, want in zip(items, msgs, strict=True):
        assert got.message.origin == want.origin
        if want.data is None:
            assert got.message.data is None
        else:
            np.testing.assert_array_equal(got.message.data, want.data)


@pytest.mark.parametrize("items, reason", [
    ([], "empty batch"),
    ([["no_such_kind", 1]], "batch item of kind"),
    ([["batch", []]], "batch item of kind"),
    ([[1, 2]], "not a [kind, *fields] list"),
    (["record"], "not a [kind, *fields] list"),
    ([["record", "one", None]], "field 'origin' should be int"),
    ([["record", 1]], "body is not a list of the 2 fields"),
])
def test_a_batch_with_a_bad_item_is_refused_with_a_reason(items, reason):
    envelope = codec.decode(codec.encode(Batch(items), "source.0~0", 1))
    with pytest.raises(codec.ProtocolError, match=re.escape(reason)):
        batch_codec.unbatch(envelope)


def test_a_batch_cannot_hold_a_batch():
    with pytest.raises(TypeError, match="a batch cannot hold a batch"):
        batch_codec.wire_messages([Batch([["record", 1, None]])])


def test_a_message_is_built_by_filling_its_dict_with_the_dataclass_signature():
    """pipeline.messages gives plain frozen message dataclasses a faster ``__init__``: the same
    signature, defaults, equality and frozenness as the dataclass's own."""
    import dataclasses

    from pipeline.messages import message

    @message("test_fast_init")
    class Fast:
        a: int
        b: str = "x"
        c: float | None = None

    @message("test_field_names_init")
    class Named:  # fields named like the parameters and locals a generated __init__ might use
        self: int
        state: str

    @message("test_factory_init")
    class Factory:
        a: int
        b: list = dataclasses.field(default_factory=list)

    assert "_state_" in Fast.__init__.__code__.co_varnames  # the generated one
    assert "_state_" not in Factory.__init__.__code__.co_varnames  # the dataclass's own
    assert Named(1, "s").__dict__ == {"self": 1, "state": "s"} == Named(self=1, state="s").__dict__
    assert Fast(1) == Fast(a=1, b="x", c=None) and Fast(1, "y", 2).c == 2
    assert Fast(1).__dict__ == {"a": 1, "b": "x", "c": None}
    assert Factory(1).b == [] and Factory(1).b is not Factory(1).b
    with pytest.raises(TypeError):
        Fast()
    with pytest.raises(TypeError):
        Fast(1, d=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Fast(1).a = 2
    assert codec.decode(codec.encode(Fast(7, "z", 1.5))).message == Fast(7, "z", 1.5)
