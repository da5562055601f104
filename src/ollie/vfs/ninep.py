"""The 9P2000 wire codec: messages, qids and stat entries, as laid out in Plan 9's intro(5).

Every field is little-endian; strings are a 2-byte length then UTF-8. A frame is `size[4] type[1] tag[2]`
followed by the message's fields. Decoding is strictly bounds-checked: a short, long, oversized or
otherwise malformed frame raises ProtocolError and nothing else.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import ClassVar, NoReturn, TypeVar, dataclass_transform

VERSION = "9P2000"
MAX_MSIZE = 65536
IOHDRSZ = 24  # size, type, tag, fid, offset, count: what a Tread/Twrite costs beside its data
MAXWELEM = 16
NOTAG = 0xFFFF
NOFID = 0xFFFFFFFF

QTDIR, QTAPPEND, QTEXCL, QTAUTH, QTTMP, QTFILE = 0x80, 0x40, 0x20, 0x08, 0x04, 0x00
DMDIR, DMAPPEND, DMEXCL, DMAUTH, DMTMP = 0x80000000, 0x40000000, 0x20000000, 0x08000000, 0x04000000
OREAD, OWRITE, ORDWR, OEXEC, OTRUNC, ORCLOSE = 0, 1, 2, 3, 0x10, 0x40

MIN_FRAME = 7  # size[4] type[1] tag[2]


class ProtocolError(ValueError):
    """A frame or field that is not valid 9P2000."""


@dataclass(frozen=True, slots=True)
class Qid:
    type: int = QTFILE
    vers: int = 0
    path: int = 0


@dataclass(slots=True)
class Stat:
    """A directory entry. In Twstat, all-ones integers and empty strings mean "leave unchanged"."""

    type: int = 0
    dev: int = 0
    qid: Qid = field(default_factory=Qid)
    mode: int = 0
    atime: int = 0
    mtime: int = 0
    length: int = 0
    name: str = ""
    uid: str = ""
    gid: str = ""
    muid: str = ""

    @classmethod
    def unchanged(cls, **changes: object) -> Stat:
        """The Twstat "don't touch" entry with only `changes` set (e.g. `name=` for a rename)."""
        blank = cls(
            0xFFFF,
            0xFFFFFFFF,
            Qid(0xFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF),
            0xFFFFFFFF,
            0xFFFFFFFF,
            0xFFFFFFFF,
            0xFFFFFFFFFFFFFFFF,
        )
        for name, value in changes.items():
            setattr(blank, name, value)
        return blank

    def encode(self) -> bytes:
        out = bytearray(2)
        _put_stat_body(out, self)
        out[0:2] = _u(len(out) - 2, 2)
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes) -> Stat:
        r = _Reader(data)
        st = r.stat()
        r.end()
        return st


def decode_stats(data: bytes) -> list[Stat]:
    """The entries of a directory read: stat entries laid end to end."""
    r = _Reader(data)
    out = []
    while r.pos < len(data):
        out.append(r.stat())
    return out


# Field codes: 1/2/4/8 unsigned ints, s string, q qid, D count[4] data, S n[2] stat,
# W nwname[2] names, Q nwqid[2] qids. A message's FORMAT lists its fields after the tag, in order.


@dataclass(slots=True)
class Message:
    TYPE: ClassVar[int]
    FORMAT: ClassVar[str]
    FIELDS: ClassVar[tuple[str, ...]]  # the names FORMAT describes
    tag: int = field(default=0, kw_only=True)


_M = TypeVar("_M", bound=Message)


@dataclass_transform(field_specifiers=(field,))
def _message(type_: int, fmt: str) -> Callable[[type[_M]], type[_M]]:
    """Make the class a dataclass message of 9P type `type_` whose fields `fmt` describes."""

    def wrap(cls: type[_M]) -> type[_M]:
        cls = dataclass(slots=True)(cls)
        cls.TYPE, cls.FORMAT, cls.FIELDS = type_, fmt, tuple(f.name for f in fields(cls) if f.name != "tag")
        if len(fmt) != len(cls.FIELDS):
            raise TypeError(f"{cls.__name__}: format {fmt!r} does not match its fields")
        _BY_TYPE[type_] = cls
        return cls

    return wrap


_BY_TYPE: dict[int, type[Message]] = {}


@_message(100, "4s")
class Tversion(Message):
    msize: int
    version: str


@_message(101, "4s")
class Rversion(Message):
    msize: int
    version: str


@_message(102, "4ss")
class Tauth(Message):
    afid: int
    uname: str
    aname: str


@_message(103, "q")
class Rauth(Message):
    aqid: Qid


@_message(104, "44ss")
class Tattach(Message):
    fid: int
    afid: int
    uname: str
    aname: str


@_message(105, "q")
class Rattach(Message):
    qid: Qid


@_message(107, "s")
class Rerror(Message):
    ename: str


@_message(108, "2")
class Tflush(Message):
    oldtag: int


@_message(109, "")
class Rflush(Message):
    pass


@_message(110, "44W")
class Twalk(Message):
    fid: int
    newfid: int
    wname: list[str]


@_message(111, "Q")
class Rwalk(Message):
    wqid: list[Qid]


@_message(112, "41")
class Topen(Message):
    fid: int
    mode: int


@_message(113, "q4")
class Ropen(Message):
    qid: Qid
    iounit: int


@_message(114, "4s41")
class Tcreate(Message):
    fid: int
    name: str
    perm: int
    mode: int


@_message(115, "q4")
class Rcreate(Message):
    qid: Qid
    iounit: int


@_message(116, "484")
class Tread(Message):
    fid: int
    offset: int
    count: int


@_message(117, "D")
class Rread(Message):
    data: bytes


@_message(118, "48D")
class Twrite(Message):
    fid: int
    offset: int
    data: bytes


@_message(119, "4")
class Rwrite(Message):
    count: int


@_message(120, "4")
class Tclunk(Message):
    fid: int


@_message(121, "")
class Rclunk(Message):
    pass


@_message(122, "4")
class Tremove(Message):
    fid: int


@_message(123, "")
class Rremove(Message):
    pass


@_message(124, "4")
class Tstat(Message):
    fid: int


@_message(125, "S")
class Rstat(Message):
    stat: Stat


@_message(126, "4S")
class Twstat(Message):
    fid: int
    stat: Stat


@_message(127, "")
class Rwstat(Message):
    pass


# Encoding


def _u(value: int, width: int) -> bytes:
    try:
        return value.to_bytes(width, "little")  # raises for a negative, too large or non-int value
    except (OverflowError, AttributeError, TypeError):
        raise ProtocolError(f"{value!r} does not fit in {width} unsigned bytes") from None


def _put_str(out: bytearray, s: str) -> None:
    try:
        raw = s.encode()
    except UnicodeEncodeError:  # a name from disk that is not UTF-8 (surrogate-escaped)
        raise ProtocolError(f"{s!r} is not UTF-8") from None
    out += _u(len(raw), 2)
    out += raw


def _put_qid(out: bytearray, q: Qid) -> None:
    out += _u(q.type, 1) + _u(q.vers, 4) + _u(q.path, 8)


def _put_stat_body(out: bytearray, st: Stat) -> None:
    out += _u(st.type, 2) + _u(st.dev, 4)
    _put_qid(out, st.qid)
    out += _u(st.mode, 4) + _u(st.atime, 4) + _u(st.mtime, 4) + _u(st.length, 8)
    for s in (st.name, st.uid, st.gid, st.muid):
        _put_str(out, s)


def _put_field(out: bytearray, code: str, value) -> None:
    if code in "1248":
        out += _u(value, int(code))
    elif code == "s":
        _put_str(out, value)
    elif code == "q":
        _put_qid(out, value)
    elif code == "D":
        out += _u(len(value), 4)
        out += value
    elif code == "S":
        raw = value.encode()
        out += _u(len(raw), 2)
        out += raw
    else:  # W or Q
        if len(value) > MAXWELEM:
            raise ProtocolError(f"{len(value)} path elements exceed the limit of {MAXWELEM}")
        out += _u(len(value), 2)
        for item in value:
            (_put_str if code == "W" else _put_qid)(out, item)


def encode(msg: Message) -> bytes:
    """The frame for `msg`, size prefix included."""
    out = bytearray(4)
    out += _u(msg.TYPE, 1) + _u(msg.tag, 2)
    for code, name in zip(msg.FORMAT, msg.FIELDS, strict=True):
        _put_field(out, code, getattr(msg, name))
    out[0:4] = _u(len(out), 4)
    return bytes(out)


# Decoding


_UINT = {1: struct.Struct("<B"), 2: struct.Struct("<H"), 4: struct.Struct("<I"), 8: struct.Struct("<Q")}


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes, pos: int = 0):
        self.buf, self.pos = buf, pos

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            self._truncated(n)
        chunk = self.buf[self.pos : end]
        self.pos = end
        return chunk

    def u(self, width: int) -> int:
        try:
            (value,) = _UINT[width].unpack_from(self.buf, self.pos)
        except struct.error:
            self._truncated(width)
        self.pos += width
        return value

    def _truncated(self, n: int) -> NoReturn:
        raise ProtocolError(f"truncated: need {n} bytes at offset {self.pos}, have {len(self.buf) - self.pos}")

    def string(self) -> str:
        raw = self.take(self.u(2))
        try:
            return raw.decode()
        except UnicodeDecodeError as e:
            raise ProtocolError(f"string is not UTF-8: {raw[:32]!r}") from e

    def qid(self) -> Qid:
        return Qid(self.u(1), self.u(4), self.u(8))

    def stat(self) -> Stat:
        size = self.u(2)
        body = _Reader(self.take(size))
        st = Stat(
            body.u(2),
            body.u(4),
            body.qid(),
            body.u(4),
            body.u(4),
            body.u(4),
            body.u(8),
            body.string(),
            body.string(),
            body.string(),
            body.string(),
        )
        body.end()
        return st

    def many(self, item) -> list:
        n = self.u(2)
        if n > MAXWELEM:
            raise ProtocolError(f"{n} path elements exceed the limit of {MAXWELEM}")
        return [item() for _ in range(n)]

    def field(self, code: str):
        if code in "1248":
            return self.u(int(code))
        if code == "s":
            return self.string()
        if code == "q":
            return self.qid()
        if code == "D":
            return self.take(self.u(4))
        if code == "S":
            inner = _Reader(self.take(self.u(2)))
            st = inner.stat()
            inner.end()
            return st
        return self.many(self.string if code == "W" else self.qid)

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise ProtocolError(f"{len(self.buf) - self.pos} unexpected trailing bytes")


def decode(frame: bytes) -> Message:
    """The message in one whole frame (size prefix included)."""
    if len(frame) < MIN_FRAME:
        raise ProtocolError(f"frame of {len(frame)} bytes is shorter than a header")
    r = _Reader(frame)
    size = r.u(4)
    if size != len(frame):
        raise ProtocolError(f"frame says {size} bytes but has {len(frame)}")
    type_ = r.u(1)
    cls = _BY_TYPE.get(type_)
    if cls is None:
        raise ProtocolError(f"unknown message type {type_}")
    tag = r.u(2)
    values = [r.field(code) for code in cls.FORMAT]
    r.end()
    return cls(*values, tag=tag)


async def read_frame(reader: asyncio.StreamReader, msize: int) -> bytes:
    """The next whole frame; ProtocolError if its size is impossible or above `msize`.

    Raises asyncio.IncompleteReadError (an EOFError) when the stream ends.
    """
    head = await reader.readexactly(4)
    size = int.from_bytes(head, "little")
    if size < MIN_FRAME:
        raise ProtocolError(f"frame size {size} is shorter than a header")
    if size > msize:
        raise ProtocolError(f"frame size {size} exceeds msize {msize}")
    return head + await reader.readexactly(size - 4)
