"""The log wire format: round trips, incremental decoding, and hostile input."""

from __future__ import annotations

import math
import struct

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from corral._logs._wire import (
    MAX_FRAME,
    PROTOCOL_VERSION,
    FrameDecoder,
    Hello,
    Message,
    Record,
    WireError,
    encode,
)

pytestmark = pytest.mark.timeout(120)

_raw = msgspec.msgpack.Encoder()

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
texts = st.text(max_size=200)

hellos = st.builds(Hello, v=st.just(PROTOCOL_VERSION), secret=texts, source=texts, pid=INT64)
records = st.builds(
    Record,
    created=st.floats(allow_nan=False),
    level=INT64,
    levelname=texts,
    name=texts,
    msg=st.text(max_size=2000),
    exc_text=st.none() | texts,
    stack_info=st.none() | texts,
    pid=INT64,
    thread_name=texts,
    process_name=texts,
    pathname=texts,
    lineno=INT64,
    func_name=texts,
)
messages = st.one_of(hellos, records)


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def decode_all(data: bytes) -> list[Message]:
    decoder = FrameDecoder()
    out = decoder.feed(data)
    decoder.eof()
    return out


# -- the schema, pinned to bytes --------------------------------------------------------


def test_golden_frames() -> None:
    # These bytes are the specification in miniature: a change to the field order, the
    # tags or the framing breaks this test, and every sender written from the docs.
    hello = Hello(v=1, secret="s3", source="web", pid=7)
    assert encode(hello) == bytes.fromhex("00000010") + (b"\x95\xa5hello\x01\xa2s3\xa3web\x07")
    rec = Record(created=1.5, level=20, levelname="INFO", name="a", msg="hi")
    payload = (
        b"\x9e\xa6record\xcb" + struct.pack(">d", 1.5) + b"\x14\xa4INFO\xa1a\xa2hi"
        b"\xc0\xc0\x00\xa0\xa0\xa0\x00\xa0"
    )
    assert encode(rec) == frame(payload)
    assert decode_all(frame(payload)) == [rec]


def test_trailing_fields_may_be_omitted_and_extra_ones_are_ignored() -> None:
    short = _raw.encode(["record", 2, 30, "WARNING", "x", "m"])
    (rec,) = decode_all(frame(short))
    assert rec == Record(created=2.0, level=30, levelname="WARNING", name="x", msg="m")
    assert rec.exc_text is None and rec.pid == 0 and rec.func_name == ""
    longer = _raw.encode(
        [
            "record",
            2.0,
            30,
            "WARNING",
            "x",
            "m",
            None,
            None,
            5,
            "t",
            "p",
            "f",
            3,
            "fn",
            "a field from the future",
            [1, {"nested": True}],
        ]
    )
    (rec,) = decode_all(frame(longer))
    assert isinstance(rec, Record)
    assert rec.pid == 5 and rec.func_name == "fn"
    hello = _raw.encode(["hello", PROTOCOL_VERSION, "s", "src", 9, "future"])
    assert decode_all(frame(hello)) == [Hello(v=PROTOCOL_VERSION, secret="s", source="src", pid=9)]


# -- round trips ------------------------------------------------------------------------


@pytest.mark.slow
@given(messages)
def test_round_trip(msg: Message) -> None:
    data = encode(msg)
    (length,) = struct.unpack(">I", data[:4])
    assert length == len(data) - 4
    assert decode_all(data) == [msg]


def test_nan_and_infinite_timestamps_survive() -> None:
    for created in (math.nan, math.inf, -math.inf):
        (rec,) = decode_all(encode(Record(created, 20, "INFO", "n", "m")))
        assert isinstance(rec, Record)
        assert math.isnan(rec.created) if math.isnan(created) else rec.created == created


@pytest.mark.slow
@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(st.lists(messages, max_size=30), st.data())
def test_split_anywhere(msgs: list[Message], data: st.DataObject) -> None:
    stream = b"".join(encode(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=40), label="cuts"))
    decoder = FrameDecoder()
    out: list[Message] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        out += decoder.feed(stream[start:cut])
        start = cut
    decoder.eof()
    assert out == msgs
    assert decoder.buffered == 0


def test_byte_by_byte() -> None:
    msgs: list[Message] = [
        Hello(PROTOCOL_VERSION, "secret", "src", 1),
        *(Record(float(i), 20, "INFO", "n", f"message {i}") for i in range(20)),
    ]
    stream = b"".join(encode(m) for m in msgs)
    decoder = FrameDecoder()
    out: list[Message] = []
    for i in range(len(stream)):
        out += decoder.feed(stream[i : i + 1])
    decoder.eof()
    assert out == msgs


# -- hostile input ----------------------------------------------------------------------


def feed_chunks(chunks: list[bytes], max_frame: int = MAX_FRAME) -> None:
    """Feed chunks; every outcome must be messages or a WireError, nothing else."""
    decoder = FrameDecoder(max_frame)
    try:
        for chunk in chunks:
            for msg in decoder.feed(chunk):
                assert isinstance(msg, (Hello, Record))
        decoder.eof()
    except WireError as exc:
        assert str(exc)
        assert all(isinstance(m, (Hello, Record)) for m in exc.messages)
        # A failed decoder stays failed.
        with pytest.raises(WireError):
            decoder.feed(b"")
        with pytest.raises(WireError):
            decoder.eof()


@pytest.mark.slow
@settings(max_examples=500)
@given(st.lists(st.binary(max_size=300), max_size=10), st.integers(1, 1000))
@example([b"\x00\x00\x00\x01\xc1"], MAX_FRAME)
@example([b"\x00\x00\x00\x00"], MAX_FRAME)
@example([b"\xff\xff\xff\xff"], MAX_FRAME)
def test_arbitrary_bytes(chunks: list[bytes], max_frame: int) -> None:
    feed_chunks(chunks, max_frame)


_leaves = (
    st.none()
    | st.booleans()
    | INT64
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.sampled_from(["hello", "record", "result"])
)


def _containers(inner: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=5), inner, max_size=6)


# Values nested three deep (deeper nesting has a test of its own): built level by level, which
# costs a fraction of what st.recursive's redraws over its leaf limit did for the same shapes.
msgpack_values = _leaves | _containers(_leaves | _containers(_leaves | _containers(_leaves)))


@pytest.mark.slow
@settings(max_examples=500)
@given(st.lists(msgpack_values, max_size=5))
def test_arbitrary_msgpack_in_good_frames(values: list[object]) -> None:
    # Well-framed, well-formed MessagePack that mostly does not fit the schema.
    feed_chunks([b"".join(frame(_raw.encode(v)) for v in values)])


@pytest.mark.slow
@given(
    st.sampled_from(["hello", "record"]),
    st.lists(msgpack_values, max_size=16),
)
def test_arbitrary_fields_after_a_valid_tag(tag: str, fields: list[object]) -> None:
    feed_chunks([frame(_raw.encode([tag, *fields]))])


def test_deep_nesting_is_a_wire_error() -> None:
    # msgspec raises RecursionError for this, even in fields it would ignore.
    fields = ["record", 1.0, 20, "INFO", "n", "m", None, None, 1, "t", "p", "f", 1, "fn"]
    head = _raw.encode(fields)[1:]  # without the "array of 14" byte
    deep = b"\x9f" + head + b"\x91" * 200_000 + b"\xc0"  # a 15th, absurdly nested field
    with pytest.raises(WireError, match=r"nested too deeply|undecodable"):
        decode_all(frame(deep))
    with pytest.raises(WireError):
        decode_all(frame(b"\x91" * 200_000 + b"\xc0"))


def test_oversized_prefix_is_rejected_before_the_payload() -> None:
    decoder = FrameDecoder(max_frame=1000)
    good = encode(Record(1.0, 20, "INFO", "n", "ok"))
    assert decoder.feed(good) == [Record(1.0, 20, "INFO", "n", "ok")]
    assert decoder.feed(b"\x00\x00") == []  # half a prefix: nothing to judge yet
    with pytest.raises(WireError, match="1001 bytes exceeds the limit of 1000") as info:
        decoder.feed(b"\x03\xe9")  # 1001: rejected with no payload byte seen
    assert info.value.messages == []
    assert decoder.buffered == 0
    with pytest.raises(WireError, match="exceeds the limit of 1048576"):
        FrameDecoder().feed(struct.pack(">I", MAX_FRAME + 1))
    # Exactly at the limit is fine.
    at_limit = Record(1.0, 20, "INFO", "n", "x")
    size = len(encode(at_limit)) - 4
    FrameDecoder(max_frame=size).feed(encode(at_limit))


def test_truncated_frame_at_eof() -> None:
    data = encode(Record(1.0, 20, "INFO", "n", "message"))
    for cut in range(1, len(data)):
        decoder = FrameDecoder()
        assert decoder.feed(data[:cut]) == []
        with pytest.raises(WireError, match="middle of a frame"):
            decoder.eof()
    decoder = FrameDecoder()
    decoder.feed(data)
    decoder.eof()  # a whole frame: fine


def test_good_messages_before_an_error_are_kept() -> None:
    good = [Record(float(i), 20, "INFO", "n", str(i)) for i in range(3)]
    data = b"".join(encode(m) for m in good) + frame(b"\xc1garbage")
    with pytest.raises(WireError, match="undecodable payload") as info:
        FrameDecoder().feed(data)
    assert info.value.messages == good


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (["record", "not a float", 20, "INFO", "n", "m"], "does not match the schema"),
        (["record", 1.0, True, "INFO", "n", "m"], "does not match the schema"),
        (["record", 1.0, 20, "INFO"], "does not match the schema"),
        (["result", 1, 2, 3], "does not match the schema"),
        ({"tag": "record"}, "does not match the schema"),
        ("just a string", "does not match the schema"),
        (["hello", 2, "s", "src", 1], "unsupported protocol version 2"),
        (["hello", 99, {"a": "different"}, "shape"], "unsupported protocol version 99"),
        (["hello", 0], "unsupported protocol version 0"),
        (["hello", "1", "s", "src", 1], "does not match the schema"),
    ],
)
def test_wrong_schema(value: object, reason: str) -> None:
    with pytest.raises(WireError, match=reason):
        decode_all(frame(_raw.encode(value)))


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xc1", "undecodable payload"),
        (b"\x95\xa5hello\x01", "undecodable payload"),  # MessagePack cut short
        (encode(Hello(1, "s", "x", 1))[4:] + b"\x00", "undecodable payload"),  # trailing
        (b"\x96\xa6record\xcb\x00", "undecodable payload"),  # truncated float
        # Not UTF-8 (an encoded surrogate) where a string belongs.
        (b"\x96\xa6record\xcb" + b"\0" * 8 + b"\x14\xa1I\xa1n\xa2\xed\xa0", "undecodable"),
    ],
)
def test_undecodable(payload: bytes, reason: str) -> None:
    with pytest.raises(WireError, match=reason):
        decode_all(frame(payload))


def test_empty_frame() -> None:
    with pytest.raises(WireError, match="empty frame"):
        FrameDecoder().feed(b"\x00\x00\x00\x00")


def test_wire_error_is_a_value_error() -> None:
    assert issubclass(WireError, ValueError)
    with pytest.raises(ValueError):
        FrameDecoder().feed(b"\xff\xff\xff\xff")


def test_max_frame_argument_checked() -> None:
    with pytest.raises(ValueError):
        FrameDecoder(0)
    with pytest.raises(ValueError):
        FrameDecoder(2**32)


def test_a_large_frame_gets_a_buffer_of_its_own() -> None:
    # A frame of LARGE_FRAME bytes or more is gathered into one buffer of its
    # full size (not a buffer grown, and copied, as it comes), split anywhere.
    from corral._launch import _link
    from corral._logs._wire import LARGE_FRAME

    small = _link.encode(_link.WorkerResult(0, memoryview(b"small")))
    big_payload = bytes(range(256)) * (3 * LARGE_FRAME // 256)
    big = _link.encode(_link.WorkerResult(1, memoryview(big_payload)))
    data = small + big + small + big
    decoder = FrameDecoder(_link.MAX_LINK_FRAME, _link.decoder())
    out: list[object] = []
    for start in range(0, len(data), 65531):
        out += decoder.feed(data[start : start + 65531])
        assert decoder.buffered <= len(big)
    decoder.eof()
    payloads = [bytes(m.payload) for m in out]  # type: ignore[attr-defined]
    assert payloads == [b"small", big_payload, b"small", big_payload]
    # Cut short in the middle of a large frame: a truncated stream.
    decoder = FrameDecoder(_link.MAX_LINK_FRAME, _link.decoder())
    assert decoder.feed(big[: LARGE_FRAME // 2]) == []
    assert decoder.buffered == LARGE_FRAME // 2
    with pytest.raises(WireError, match="middle of a frame"):
        decoder.eof()
