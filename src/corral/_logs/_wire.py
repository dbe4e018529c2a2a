"""The log wire format: how a child process sends its log records to the launcher.

Every child that corral starts finds three variables in its environment (see
`corral._logs._server.LogServer.env`):

    CORRAL_LOG_SOCKET   the path of the launcher's Unix stream socket
    CORRAL_LOG_SECRET   a secret, to prove the child was started by this launcher
    CORRAL_SOURCE       the name of the *source* the child speaks for

The child connects to the socket (``AF_UNIX``, ``SOCK_STREAM``) and writes a stream of
*frames*; the launcher only ever reads, and never writes anything back.  When the
child is done -- or dies -- the connection closes, and the launcher reads everything
that was written before it.  This module defines those frames.  It is deliberately
small and boring, so that a sender can be written in any language in an afternoon: the
Python one lives in `corral._logs._child_logging`.


Frames
------

A frame is a 4-byte big-endian unsigned length ``N``, followed by exactly ``N`` bytes of
payload::

    +--------+--------+--------+--------+=================+
    |       N (uint32, big-endian)      |  N bytes payload |
    +--------+--------+--------+--------+=================+

``N`` must be at least 1 and at most the reader's limit, `MAX_FRAME` (1 MiB,
1,048,576 bytes, unless the reader was configured otherwise).  The reader checks the
length as soon as the four prefix bytes arrive and drops the connection if it is too
big, *before* it buffers any of the payload: a broken or hostile sender cannot make the
launcher allocate more than one frame's worth of memory.  There is no padding, no
checksum and no terminator; frames simply follow each other on the stream.

The payload is one MessagePack value (https://msgpack.org): an array whose first
element is a string *tag* naming the kind of message, followed by the message's fields
in the order listed below.  Field names never go on the wire, only positions.  A frame
whose payload is not exactly one well-formed MessagePack value, or whose value does not
match the schema for its tag, is an error: the reader closes the connection (after
delivering every good record that came before it).

Types below are MessagePack types: ``str`` is a UTF-8 string, ``int`` a (signed or
unsigned) integer, ``float`` a float 64 (a float 32 or an integer is accepted as well),
``nil`` is nil.  ``bool`` is *not* an ``int``.


Messages
--------

``hello`` -- must be the first frame on every connection, and only the first::

    ["hello", v, secret, source, pid]

    v       int   protocol version; this module speaks version 1 (`PROTOCOL_VERSION`)
    secret  str   the value of CORRAL_LOG_SECRET, proving the sender was started by
                  this launcher
    source  str   the value of CORRAL_SOURCE: which process the records belong to
    pid     int   the sender's process id

The launcher closes the connection unless the hello arrives within a few seconds and
carries the right secret and a version it speaks.

``record`` -- one log record, i.e. one call to a logger::

    ["record", created, level, levelname, name, msg,
               exc_text, stack_info, pid, thread_name, process_name,
               pathname, lineno, func_name]

    created       float     when the record was made, in seconds since the Unix epoch,
                            by the sender's clock (Python's LogRecord.created)
    level         int       numeric level: 10 DEBUG, 20 INFO, 30 WARNING, 40 ERROR,
                            50 CRITICAL, or any other number
    levelname     str       the level's name as the sender knows it ("INFO")
    name          str       the logger's name ("myapp.db"); "root" for the root logger
    msg           str       the message, already formatted: the launcher never
                            interpolates arguments (Python's record.getMessage())
    exc_text      str|nil   a formatted exception/traceback, or nil
    stack_info    str|nil   a formatted stack, or nil
    pid           int       the process that made the record (0: use the hello's pid)
    thread_name   str       the thread that made the record ("" if unknown)
    process_name  str       a process name, e.g. multiprocessing's ("" if unknown)
    pathname      str       the source file of the logging call ("" if unknown)
    lineno        int       its line number (0 if unknown)
    func_name     str       its function ("" if unknown)

The first five fields are required.  The rest may be left off the end of the array,
and take the defaults shown (nil, 0 or "").  Records on one connection are delivered
in the order they were sent.


Versions and evolution
----------------------

A reader ignores array elements past the fields it knows, and fills in defaults for
trailing fields that are missing.  So, within one protocol version, a message may grow
new fields *at its end* (with defaults), and old and new peers still understand each
other.  Anything else -- a new kind of message (results, say: the tag leaves room for
them), a changed type, a reordering -- needs a new version number in the hello.  A
reader rejects a hello whose version it does not speak, and rejects any tag that its
version does not define.


What this module offers
-----------------------

`encode` turns a message into a complete frame (prefix included), ready for one
``sendall``.  `FrameDecoder` does the reverse, incrementally: `FrameDecoder.feed` takes
bytes as they come off the socket -- split anywhere, many frames at once, or a frame
spread over many chunks -- and returns the messages completed so far;
`FrameDecoder.eof` checks that the stream did not stop in the middle of a frame.  Every
problem with the bytes is reported as a `WireError`, whatever it is; nothing else
escapes the decoder.

Decoding goes through msgspec into the fixed `msgspec.Struct` types below; it builds
strings, numbers and these structs and nothing else.  There is no pickle and no eval
anywhere on this path, so the bytes on the socket cannot make the launcher run code.
"""

from __future__ import annotations

import mmap
import struct
from typing import Any, Final, TypeAlias

import msgspec

from .._sys import _childenv

__all__ = [
    "ENV_SECRET",
    "ENV_SOCKET",
    "ENCODER",
    "ENV_SOURCE",
    "MAX_FRAME",
    "PREFIX",
    "PREFIX_SIZE",
    "PROTOCOL_VERSION",
    "FrameDecoder",
    "Hello",
    "Message",
    "Record",
    "WireError",
    "decode_hello",
    "encode",
]

PROTOCOL_VERSION: Final = 1
"""The protocol version this module speaks; sent in, and required of, every hello."""

MAX_FRAME: Final = 1 << 20
"""Default limit on a frame's payload length, in bytes (1 MiB)."""

ENV_SOCKET: Final = _childenv.LOG_SOCKET
"""Environment variable naming the path of the launcher's log socket."""
ENV_SECRET: Final = _childenv.LOG_SECRET
"""Environment variable holding the secret the hello must carry."""
ENV_SOURCE: Final = _childenv.SOURCE
"""Environment variable holding the source name the hello should carry."""

#: The length prefix of every frame: 4 bytes, big-endian.
PREFIX: Final = struct.Struct(">I")
PREFIX_SIZE: Final = PREFIX.size


class WireError(ValueError):
    """The bytes on a log connection do not follow the wire format.

    Raised by `FrameDecoder` for every kind of problem: a length prefix over the limit,
    a payload that is not MessagePack, a message that does not fit the schema, an
    unsupported protocol version, or a stream that ends in the middle of a frame.

    `messages` holds the good messages that the same call to `FrameDecoder.feed`
    decoded *before* it reached the bad frame, in order, so that a reader can still
    deliver them; it is empty when the error came from `FrameDecoder.eof` or when the
    bad frame was the first one in the chunk.
    """

    def __init__(self, reason: str, messages: list[Message] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.messages: list[Message] = messages if messages is not None else []


# `array_like=True` puts the fields on the wire as a positional array instead of a map
# with names: smaller frames and faster (de)coding.  `gc=False` keeps these instances
# out of the cyclic garbage collector: they only ever hold strings and numbers, so they
# cannot be part of a cycle, and skipping the GC bookkeeping makes them cheaper.  The
# tag is the first element of the array.


class Hello(msgspec.Struct, tag="hello", array_like=True, frozen=True, gc=False):
    """First frame of every connection: who is speaking, and the proof it may."""

    v: int
    secret: str
    source: str
    pid: int


class Record(msgspec.Struct, tag="record", array_like=True, frozen=True, gc=False):
    """One log record, with its message already formatted."""

    created: float
    level: int
    levelname: str
    name: str
    msg: str
    exc_text: str | None = None
    stack_info: str | None = None
    pid: int = 0
    thread_name: str = ""
    process_name: str = ""
    pathname: str = ""
    lineno: int = 0
    func_name: str = ""


Message: TypeAlias = Hello | Record
"""Every kind of message that version 1 of the protocol defines."""


class _HelloHead(msgspec.Struct, tag="hello", array_like=True, gc=False):
    # Just enough of a hello to read its version number; later elements are ignored.
    # Used only after a frame has failed to decode, to tell "this is a hello from a
    # protocol version we do not speak" apart from plain garbage.
    v: int


# Module-level codecs: building them once is what makes each call cheap.
ENCODER: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(Message)
_hello_head_decoder: Final = msgspec.msgpack.Decoder(_HelloHead)


def encode(msg: Message) -> bytes:
    """Return the complete frame for *msg*: the 4-byte length prefix, then the payload.

    The result is ready to be written with a single ``sendall``.  This function does
    not enforce any size limit; a sender that may produce huge messages should check
    ``len(frame) - 4`` against `MAX_FRAME` itself (the Python sender truncates).
    """
    # Measured: encoding then concatenating beats encoding into a pre-sized bytearray
    # and converting that to bytes.
    payload = ENCODER.encode(msg)
    return PREFIX.pack(len(payload)) + payload


def _describe(payload: memoryview, exc: Exception) -> str:
    """Turn a failure to decode *payload* into the reason a WireError should give."""
    if isinstance(exc, msgspec.ValidationError):
        # Well-formed MessagePack, wrong shape.  Is it a hello from another version?
        # (Its other fields might not fit version 1's hello at all, so it is read with a
        # struct that knows only the version.)
        try:
            head = _hello_head_decoder.decode(payload)
        except (msgspec.DecodeError, RecursionError):
            pass
        else:
            if head.v != PROTOCOL_VERSION:
                return _unsupported(head.v)
        return f"message does not match the schema: {exc}"
    if isinstance(exc, RecursionError):
        return "undecodable payload: MessagePack data nested too deeply"
    return f"undecodable payload: {exc}"


def _unsupported(version: int) -> str:
    return f"unsupported protocol version {version} (this side speaks version {PROTOCOL_VERSION})"


#: A frame at least this big is gathered into a buffer of its own, allocated
#: at its full size when its length prefix comes: the buffer of smaller ones
#: grows as bytes come, and growing to hundreds of megabytes copies it again
#: and again, on the event loop.
LARGE_FRAME: Final = 1 << 20


class FrameDecoder:
    """Incremental reader for a stream of frames.

    Feed it bytes as they arrive, in chunks of any size split at any point; it returns
    each message as soon as its last byte has been fed.  It buffers at most one
    incomplete frame (never more than ``4 + max_frame`` bytes) plus whatever complete
    frames the current chunk holds.

    After it has raised `WireError` the decoder is *failed*: the stream can no longer be
    trusted to be in step with the frame boundaries, so every later call to `feed` or
    `eof` raises `WireError` again.
    """

    def __init__(
        self,
        max_frame: int = MAX_FRAME,
        decoder: msgspec.msgpack.Decoder[Any] | None = None,
    ) -> None:
        if not 1 <= max_frame <= 0xFFFFFFFF:
            raise ValueError(f"max_frame must be between 1 and 2**32 - 1, not {max_frame}")
        self.max_frame: Final = max_frame
        self._decoder = decoder if decoder is not None else _decoder
        self._buf = bytearray()
        #: A large frame on its way: its payload, allocated once at its full
        #: size (anonymous memory: no zeroing up front, its pages come as its
        #: bytes do), and how much of it has come (see :data:`LARGE_FRAME`).
        self._large: mmap.mmap | None = None
        self._large_have = 0
        self._failed: str | None = None

    @property
    def buffered(self) -> int:
        """Number of bytes held for a frame not yet complete."""
        if self._large is not None:
            return PREFIX_SIZE + self._large_have
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message]:
        """Add *data* to the stream and return the messages it completed, in order.

        Raises `WireError` at the first bad frame; the error's ``messages`` attribute
        holds the good messages from this call that came before it.  An over-long
        length prefix is rejected as soon as its four bytes are in, whether or not any
        of its payload has arrived.
        """
        if self._failed is not None:
            raise WireError(f"decoder already failed: {self._failed}")
        messages: list[Message] = []
        if self._large is not None:
            data = self._fill_large(data, messages)
            if self._large is not None:
                return messages  # all of it went into the large frame
        buf = self._buf
        buf += data
        pos = 0
        end = len(buf)
        # The loop runs once per record: what it calls is bound to locals.
        unpack = PREFIX.unpack_from
        decode = self._decoder.decode
        append = messages.append
        max_frame = self.max_frame
        try:
            with memoryview(buf) as view:
                while end - pos >= PREFIX_SIZE:
                    (length,) = unpack(buf, pos)
                    if length > max_frame:
                        raise WireError(
                            f"frame of {length} bytes exceeds the limit of {self.max_frame} bytes"
                        )
                    if length == 0:
                        raise WireError("empty frame (length prefix 0)")
                    start = pos + PREFIX_SIZE
                    stop = start + length
                    if stop > end:
                        if length >= LARGE_FRAME:
                            # Its payload gets a buffer of its own, of its full
                            # size at once, instead of this one growing (and
                            # being copied) again and again as it comes.
                            self._large = mmap.mmap(-1, length)
                            self._large_have = end - start
                            self._large[: end - start] = view[start:end]
                            pos = end
                        break  # The rest of this frame has not arrived yet.
                    try:
                        msg = decode(view[start:stop])
                    except (msgspec.DecodeError, RecursionError) as exc:
                        raise WireError(_describe(view[start:stop], exc)) from None
                    if type(msg) is Hello and msg.v != PROTOCOL_VERSION:
                        raise WireError(_unsupported(msg.v))
                    append(msg)
                    pos = stop
        except WireError as exc:
            self._fail(exc, messages)
            raise
        # The view is released, so the buffer may be resized again (unless a
        # message holds a view into it: then it is theirs, and we take a new one).
        try:
            del buf[:pos]
        except BufferError:
            self._buf = bytearray(buf[pos:])
        return messages

    def _fill_large(
        self, data: bytes | bytearray | memoryview, messages: list[Message]
    ) -> bytes | bytearray | memoryview:
        """Copy ``data`` into the large frame on its way; what is left of it after that frame."""
        large = self._large
        assert large is not None
        have = self._large_have
        take = min(len(large) - have, len(data))
        with memoryview(data) as chunk:
            large[have : have + take] = chunk[:take]
            rest = bytes(chunk[take:])
        self._large_have = have + take
        if self._large_have == len(large):
            self._large = None
            try:
                # Decoded from its own buffer: a message may keep views into it.
                messages.append(self._decode(memoryview(large)))
            except WireError as exc:
                self._fail(exc, messages)
                raise
        return rest

    def _fail(self, exc: WireError, messages: list[Message]) -> None:
        self._failed = exc.reason
        # Not buf.clear(): slices of the view may live on in the traceback.
        self._buf = bytearray()
        self._large = None
        exc.messages = messages

    def eof(self) -> None:
        """Declare the end of the stream; raise `WireError` if it ended mid-frame."""
        if self._failed is not None:
            raise WireError(f"decoder already failed: {self._failed}")
        if self._large is not None:
            detail = f"got {self._large_have} of {len(self._large)} payload bytes"
            self._failed = "truncated frame"
            self._large = None
            raise WireError(f"stream ended in the middle of a frame ({detail})")
        if self._buf:
            got = len(self._buf)
            if got < PREFIX_SIZE:
                detail = f"got {got} of the 4 length-prefix bytes"
            else:
                (length,) = PREFIX.unpack_from(self._buf, 0)
                detail = f"got {got - PREFIX_SIZE} of {length} payload bytes"
            self._failed = "truncated frame"
            self._buf.clear()
            raise WireError(f"stream ended in the middle of a frame ({detail})")

    def _decode(self, payload: memoryview) -> Message:
        try:
            msg = self._decoder.decode(payload)
        except (msgspec.DecodeError, RecursionError) as exc:
            # ValidationError is a subclass of DecodeError.  RecursionError comes from
            # absurdly nested arrays, even inside fields that would be ignored.
            raise WireError(_describe(payload, exc)) from None
        if type(msg) is Hello and msg.v != PROTOCOL_VERSION:
            raise WireError(_unsupported(msg.v))
        return msg


#: The largest hello a reader accepts (a hello carries a secret and a source
#: name of at most 1,024 characters): all a peer may send before its secret is checked.
MAX_HELLO: Final = 8 * 1024


def decode_hello(payload: bytes | bytearray | memoryview) -> Hello:
    """Decode the payload of a connection's first frame, which must be a hello.

    Raises `WireError` if it is not a well-formed hello of this protocol version.
    """
    try:
        msg = _decoder.decode(payload)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise WireError(_describe(memoryview(payload), exc)) from None
    if type(msg) is not Hello:
        raise WireError("the first message is not a hello")
    if msg.v != PROTOCOL_VERSION:
        raise WireError(_unsupported(msg.v))
    return msg
