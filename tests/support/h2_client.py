"""A raw HTTP/2 client for the drain tests: frames read and written by hand.

h2's own client state machine accepts nothing after a GOAWAY, not even the
frames of the streams the server lets finish, and a library client hides
what a drain test must see (which frames came, in what order, whether the
connection ended with a FIN). `H2Client` speaks HTTP/2 with prior knowledge
over any Trio stream: it parses the frames itself, decodes header blocks
with `hpack`, and behaves as a real client does while it reads (it
acknowledges SETTINGS, answers PINGs and gives back the connection's flow
control window for the DATA it received, also after a GOAWAY).
`check_drain` asserts the rules of an HTTP/2 drain on what it received.
"""

from __future__ import annotations

import contextlib
import enum
import struct
from collections.abc import Mapping

import attrs
import hpack
import trio

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
NO_ERROR = 0x0
REFUSED_STREAM = 0x7


class Type(enum.IntEnum):
    DATA = 0x0
    HEADERS = 0x1
    PRIORITY = 0x2
    RST_STREAM = 0x3
    SETTINGS = 0x4
    PUSH_PROMISE = 0x5
    PING = 0x6
    GOAWAY = 0x7
    WINDOW_UPDATE = 0x8
    CONTINUATION = 0x9


END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY = 0x20


@attrs.frozen
class Frame:
    """One frame as it came: its type, flags, stream and payload."""

    type: int
    flags: int
    stream_id: int
    payload: bytes

    def __repr__(self) -> str:
        try:
            name = Type(self.type).name
        except ValueError:
            name = f"type {self.type}"
        head = f"{name} stream={self.stream_id} flags={self.flags:#x}"
        return f"<{head} {self.payload[:24]!r}>"


def encode_frame(kind: Type, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame, serialised."""
    head = struct.pack(">I", len(payload))[1:] + bytes((kind, flags))
    return head + struct.pack(">I", stream_id & 0x7FFFFFFF) + payload


def parse_frames(buffer: bytearray) -> list[Frame]:
    """Take the whole frames out of ``buffer``, leaving a partial one there."""
    frames: list[Frame] = []
    while len(buffer) >= 9:
        length = int.from_bytes(buffer[:3], "big")
        if len(buffer) < 9 + length:
            break
        stream_id = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
        frames.append(
            Frame(buffer[3], buffer[4], stream_id, bytes(buffer[9 : 9 + length]))
        )
        del buffer[: 9 + length]
    return frames


def _unpad(frame: Frame) -> bytes:
    """A DATA or HEADERS frame's payload without its padding (and priority)."""
    payload = frame.payload
    if frame.flags & PADDED:
        padding = payload[0]
        payload = payload[1 : len(payload) - padding]
    if frame.type == Type.HEADERS and frame.flags & PRIORITY:
        payload = payload[5:]
    return payload


@attrs.frozen
class GoAway:
    """A GOAWAY: the last stream it names, and its error code."""

    last_stream_id: int
    error_code: int


@attrs.define
class Reply:
    """One stream's response, as far as it has come."""

    stream_id: int
    path: str
    status: int = 0
    headers: dict[bytes, bytes] = attrs.field(factory=dict[bytes, bytes])
    body: bytes = b""
    ended: bool = False
    """END_STREAM came."""
    reset: int | None = None
    """The error code of the RST_STREAM that came first, if one did."""


@attrs.define(eq=False)
class H2Client:
    """An HTTP/2 client with prior knowledge on one stream (see the module)."""

    stream: trio.abc.Stream
    frames: list[Frame] = attrs.field(factory=list[Frame])
    """Every frame received, in order."""
    replies: dict[int, Reply] = attrs.field(factory=dict[int, Reply])
    eof: bool = False
    """The server closed its side with a FIN."""
    reset: bool = False
    """The connection was reset."""
    _buffer: bytearray = attrs.field(factory=bytearray)
    _encoder: hpack.Encoder = attrs.field(factory=hpack.Encoder)
    _decoder: hpack.Decoder = attrs.field(factory=hpack.Decoder)
    _block: bytearray = attrs.field(factory=bytearray)
    _next_id: int = 1

    @property
    def goaways(self) -> list[GoAway]:
        """The GOAWAYs received, in order."""
        return [
            GoAway(
                int.from_bytes(f.payload[:4], "big") & 0x7FFFFFFF,
                int.from_bytes(f.payload[4:8], "big"),
            )
            for f in self.frames
            if f.type == Type.GOAWAY
        ]

    async def start(self) -> None:
        """Send the preface and empty SETTINGS."""
        await self.stream.send_all(PREFACE + encode_frame(Type.SETTINGS, 0, 0))

    def encode_get(self, path: str) -> bytes:
        """A GET on the next stream, one HEADERS frame that ends it."""
        stream_id = self._next_id
        self._next_id += 2
        self.replies[stream_id] = Reply(stream_id, path)
        block = self._encoder.encode(
            [
                (b":method", b"GET"),
                (b":scheme", b"http"),
                (b":authority", b"127.0.0.1"),
                (b":path", path.encode()),
            ]
        )
        return encode_frame(Type.HEADERS, END_HEADERS | END_STREAM, stream_id, block)

    async def get(self, *paths: str) -> list[int]:
        """Open a stream for each path, in one write; return their ids."""
        first = self._next_id
        await self.stream.send_all(b"".join(self.encode_get(p) for p in paths))
        return list(range(first, self._next_id, 2))

    async def receive(self) -> list[Frame]:
        """Read once; handle and return the whole frames that came (none at EOF)."""
        try:
            data = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            self.reset = True
            return []
        if not data:
            self.eof = True
            return []
        frames, answer = self.feed(data)
        if answer:
            with contextlib.suppress(
                trio.BrokenResourceError, trio.ClosedResourceError
            ):
                await self.stream.send_all(answer)
        return frames

    def feed(self, data: bytes) -> tuple[list[Frame], bytes]:
        """Take in bytes the server sent; return its whole frames, and the answer."""
        self._buffer += data
        frames = parse_frames(self._buffer)
        return frames, b"".join(self._handle(frame) for frame in frames)

    async def read_until_ended(self, *stream_ids: int) -> None:
        """Read until each of ``stream_ids`` has ended or been reset."""
        while not all(
            self.replies[i].ended or self.replies[i].reset is not None
            for i in stream_ids
        ):
            if self.eof or self.reset:
                raise AssertionError(f"closed first: {self.frames}")
            await self.receive()

    async def read_to_the_end(self) -> None:
        """Read until the server closes (FIN or reset)."""
        while not (self.eof or self.reset):
            await self.receive()

    def _handle(self, frame: Frame) -> bytes:
        """Take one frame in; return what a client sends back."""
        self.frames.append(frame)
        reply = self.replies.get(frame.stream_id)
        if frame.type == Type.SETTINGS and not frame.flags & ACK:
            return encode_frame(Type.SETTINGS, ACK, 0)
        if frame.type == Type.PING and not frame.flags & ACK:
            return encode_frame(Type.PING, ACK, 0, frame.payload)
        if frame.type == Type.RST_STREAM and reply is not None:
            if reply.reset is None:
                reply.reset = int.from_bytes(frame.payload, "big")
        elif frame.type in (Type.HEADERS, Type.CONTINUATION):
            self._block += _unpad(frame)
            if frame.flags & END_HEADERS:
                headers = self._decoder.decode(bytes(self._block), raw=True)
                self._block.clear()
                assert reply is not None, f"headers on stream {frame.stream_id}"
                for name, value in headers:
                    if name == b":status":
                        reply.status = int(value)
                    else:
                        reply.headers[bytes(name)] = bytes(value)
            if frame.flags & END_STREAM and reply is not None:
                reply.ended = True
        elif frame.type == Type.DATA:
            assert reply is not None, f"data on stream {frame.stream_id}"
            reply.body += _unpad(frame)
            if frame.flags & END_STREAM:
                reply.ended = True
            if frame.payload:
                # The connection's window back, as a client that reads does.
                increment = struct.pack(">I", len(frame.payload))
                return encode_frame(Type.WINDOW_UPDATE, 0, 0, increment)
        return b""


def check_drain(
    client: H2Client, answered: Mapping[int, bytes], refused: list[int]
) -> None:
    """Assert the rules of an HTTP/2 drain on what ``client`` received.

    The GOAWAYs name the last of ``answered`` and never a higher stream;
    each stream of ``answered`` ends with END_STREAM, with status 200 and
    its body there, or with a 503 from the cut-off; each of ``refused`` is
    reset with REFUSED_STREAM
    and gets nothing else; the last frame is a GOAWAY with NO_ERROR, and a
    FIN follows it.
    """
    frames = client.frames
    goaways = client.goaways
    assert goaways, frames
    assert goaways[0].last_stream_id == max(answered), goaways
    ids = [g.last_stream_id for g in goaways]
    assert ids == sorted(ids, reverse=True), f"last stream ids increase: {goaways}"
    assert all(g.error_code == NO_ERROR for g in goaways), goaways
    for stream_id, body in answered.items():
        reply = client.replies[stream_id]
        assert reply.ended, f"stream {stream_id} never ended: {reply}, {frames}"
        assert reply.reset is None, reply
        assert (reply.status, reply.body) == (200, body) or reply.status == 503, reply
    for stream_id in refused:
        reply = client.replies[stream_id]
        assert reply.reset == REFUSED_STREAM, reply
        assert (reply.status, reply.body, reply.ended) == (0, b"", False), reply
    assert frames[-1].type == Type.GOAWAY, f"after the last GOAWAY: {frames}"
    assert (client.eof, client.reset) == (True, False), "no FIN after the GOAWAY"
