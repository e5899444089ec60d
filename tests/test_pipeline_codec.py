"""Wire codec: exact round trips (hypothesis), zero-copy sends, and garbage that must only ever
raise :class:`codec.ProtocolError`; plus a malformed message on a live reliable subscription."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time

import msgpack
import numpy as np
import pytest
import torch
import zmq
import zmq.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pipeline import codec
from pipeline.bus import Bus, TopicSpec
from pipeline.messages import SCHEMA_VERSION, ControlReply, Credit, Hello, Join, Record
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


def _envelope(**changes) -> dict:
    env = {"k": "record", "s": "x", "n": 1, "t": time.time(), "v": SCHEMA_VERSION,
           "p": {"origin": 1, "data": None}}
    env.update(changes)
    return env


def _array_ext(index=0, dtype="<i8", shape=(1,), is_torch=False):
    return msgpack.ExtType(1, msgpack.packb([index, dtype, list(shape), is_torch]))


def _inline_ext(dtype="<i8", shape=(1,), is_torch=False, data=b"\0" * 8):
    meta = msgpack.packb([dtype, list(shape), is_torch])
    return msgpack.ExtType(3, struct.pack("<H", len(meta)) + meta + data)


def _record_with(descriptor, *buffers) -> list:
    return [msgpack.packb(_envelope(p={"origin": 1, "data": descriptor})), *buffers]


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
@given(st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
              st.text(max_size=4), st.binary(max_size=4)),
    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=2), c,
                                                                  max_size=4)),
    max_leaves=10))
def test_wellformed_msgpack_of_the_wrong_shape_only_raises_protocol_error(value):
    for candidate in (value, _envelope(p=value), _envelope(k=value), _envelope(v=value),
                      _envelope(s=value), _envelope(n=value), _envelope(t=value),
                      _envelope(p={"origin": 1, "data": _array_ext(0, value)}),
                      _envelope(p={"origin": 1, "data": _array_ext(0, "<i8", [1], value)})):
        with contextlib.suppress(codec.ProtocolError):  # and nothing else
            codec.decode([msgpack.packb(candidate), b"\0" * 8])


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
    assert_protocol_error(frames[:1])
    assert_protocol_error([*frames, b""], "buffer frames but")
    assert_protocol_error([frames[0], frames[1] + b"\0", *frames[2:]], "bytes")
    assert_protocol_error([frames[0], *frames[2:], frames[1]])  # buffers swapped


def test_unknown_kind_and_schema_versions():
    assert_protocol_error([msgpack.packb(_envelope(k="no.such.kind"))], "unknown message kind")
    assert_protocol_error([msgpack.packb(_envelope(k=7))], "unknown message kind")
    for version in (0, SCHEMA_VERSION + 1, str(SCHEMA_VERSION), float(SCHEMA_VERSION), None,
                    True, [SCHEMA_VERSION]):
        assert_protocol_error([msgpack.packb(_envelope(v=version))], "schema version")
    as_array = _envelope(v=_array_ext(0, "<i8", (2,)))
    assert_protocol_error([msgpack.packb(as_array), b"\0" * 16], "schema version")


def test_envelope_structure_errors():
    assert_protocol_error([msgpack.packb([1, 2, 3])], "envelope")
    assert_protocol_error([msgpack.packb("record")], "envelope")
    for key in "ksntvp":
        env = _envelope()
        del env[key]
        assert_protocol_error([msgpack.packb(env)], "envelope")
    assert_protocol_error([msgpack.packb(_envelope(s=1))], "sender")
    assert_protocol_error([msgpack.packb(_envelope(n="1"))], "sequence")
    assert_protocol_error([msgpack.packb(_envelope(t="now"))], "time")
    assert_protocol_error([msgpack.packb(_envelope(p=[1, None]))], "payload is not a map")
    assert_protocol_error([msgpack.packb(_envelope()), "not a buffer"], "not a buffer")
    unknown_ext = msgpack.packb(_envelope(p={"origin": 1, "data": msgpack.ExtType(9, b"")}))
    assert_protocol_error([unknown_ext], "extension")


@pytest.mark.parametrize("payload,match", [
    ({"origin": 1}, "missing"),
    ({"data": 1}, "missing"),
    ({"origin": 1, "data": 2, "extra": 3}, "unexpected"),
    ({}, "missing"),
    ({"origin": "1", "data": None}, "origin"),
    ({"origin": 1.0, "data": None}, "origin"),
    ({"origin": True, "data": None}, "origin"),
    ({"origin": None, "data": None}, "origin"),
])
def test_record_fields_are_checked(payload, match):
    assert_protocol_error([msgpack.packb(_envelope(p=payload))], match)


@pytest.mark.parametrize("cls,payload,match", [
    (Hello, {"instance": "a", "pid": "12", "endpoints": {}}, "pid"),
    (Hello, {"instance": "a", "pid": 12, "endpoints": []}, "endpoints"),
    (Hello, {"instance": 3, "pid": 12, "endpoints": {}}, "instance"),
    (Join, {"topic": "t", "group": "g", "instance": "i", "credit": "5"}, "credit"),
    (Credit, {"topic": "t", "acked": None}, "acked"),
    (ControlReply, {"ok": 1, "result": {}, "reason": ""}, "ok"),
    (ControlReply, {"ok": True, "result": {}, "reason": b"x"}, "reason"),
])
def test_simple_field_types_are_checked(cls, payload, match):
    assert_protocol_error([msgpack.packb(_envelope(k=cls.KIND, p=payload))], match)


@pytest.mark.parametrize("dtype", ["|O", "O", "<U4", "|S3", "V8", "<M8[ns]", "<m8", "<c16",
                                   "foo", "", "i4,i4", "(2,)i4", None, 5, ["<i8"], {"a": 1}])
def test_bad_dtypes_are_protocol_errors(dtype):
    assert_protocol_error(_record_with(_array_ext(0, dtype, (1,)), b"\0" * 8))


@pytest.mark.parametrize("descriptor", [
    _array_ext(1, "<i8", (1,)),  # index past the buffers
    _array_ext(-1, "<i8", (1,)),
    _array_ext("0", "<i8", (1,)),
    _array_ext(True, "<i8", (1,)),
    _array_ext(0, "<i8", (-1,)),
    _array_ext(0, "<i8", (2,)),  # buffer too short
    _array_ext(0, "<i8", ("1",)),
    _array_ext(0, "<i8", (1.0,)),
    _array_ext(0, "<i8", (2**62, 4)),  # element count overflows int64 to 0 mod 2**64
    _array_ext(0, "<i8", (2**64 - 1,)),
    _array_ext(0, "<i8", (1,), is_torch="yes"),
    _array_ext(0, "bf16", (4,), is_torch=False),  # bfloat16 only exists as a tensor
    msgpack.ExtType(1, b"\x93\x00"),  # truncated descriptor
    msgpack.ExtType(1, msgpack.packb([0, "<i8"])),  # too few descriptor fields
    msgpack.ExtType(1, msgpack.packb({"index": 0})),
    msgpack.ExtType(2, msgpack.packb(5)),  # a "tuple" that is not a sequence
    msgpack.ExtType(2, b"\xc1"),  # never-used msgpack byte
])
def test_bad_array_descriptors_are_protocol_errors(descriptor):
    assert_protocol_error(_record_with(descriptor, b"\0" * 8))


@pytest.mark.parametrize("descriptor", [
    _inline_ext("<i8", (2,)),  # bytes too short
    _inline_ext("<i8", (1,), data=b"\0" * 9),  # too long
    _inline_ext("<i8", (-1,)),
    _inline_ext("<i8", (2**62, 4)),
    _inline_ext("<i8", ("1",)),
    _inline_ext("<i8", (1,), is_torch="yes"),
    _inline_ext("bf16", (4,), is_torch=False, data=b"\0" * 8),
    _inline_ext("|O", (1,)),
    _inline_ext("foo", (1,)),
    _inline_ext(None, (1,)),
    msgpack.ExtType(3, b""),
    msgpack.ExtType(3, b"\x05"),
    msgpack.ExtType(3, b"\xff\xff\x93"),  # descriptor length past the end
    msgpack.ExtType(3, b"\x02\x00\x92\xa3"),  # truncated descriptor
    msgpack.ExtType(3, b"\x03\x00" + msgpack.packb([0, "<i8"])),  # too few fields
])
def test_bad_inline_arrays_are_protocol_errors(descriptor):
    assert_protocol_error(_record_with(descriptor))


def test_the_same_buffer_cannot_back_two_arrays():
    data = [_array_ext(0, "<i8", (1,)), _array_ext(0, "<i8", (1,))]
    assert_protocol_error(_record_with(data, b"\0" * 8), "reused")


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
            [msgpack.packb(_envelope(k="no.such.kind"))],
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
        await raw.send_multipart([msgpack.packb(_envelope(k="bus.join", p={"topic": 1}))])
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
