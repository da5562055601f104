"""The 9P2000 codec: round trips, agreement with plan9port's C codec (via python-9p), malformed frames, fuzz."""

import asyncio

import py9p
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ollie.vfs import ninep as n

STAT = n.Stat(
    type=1,
    dev=2,
    qid=n.Qid(n.QTDIR, 7, 1 << 40),
    mode=n.DMDIR | 0o755,
    atime=10,
    mtime=20,
    length=0,
    name="s",
    uid="ollie",
    gid="ollie",
    muid="",
)
QID = n.Qid(n.QTFILE, 3, 42)

EVERY_MESSAGE = [
    n.Tversion(65536, "9P2000", tag=n.NOTAG),
    n.Rversion(8192, "9P2000", tag=n.NOTAG),
    n.Tauth(5, "glenda", "secret"),
    n.Rauth(n.Qid(n.QTAUTH, 0, 1)),
    n.Tattach(0, n.NOFID, "glenda", ""),
    n.Rattach(QID),
    n.Rerror("file does not exist"),
    n.Tflush(17),
    n.Rflush(),
    n.Twalk(0, 1, ["s", "1", "state"]),
    n.Twalk(0, 1, []),
    n.Rwalk([QID, QID]),
    n.Topen(1, n.ORDWR | n.OTRUNC),
    n.Ropen(QID, 8168),
    n.Tcreate(1, "notes.md", 0o644, n.OWRITE),
    n.Rcreate(QID, 0),
    n.Tread(1, 1 << 33, 8168),
    n.Rread(b"idle\n"),
    n.Twrite(1, 0, b"\x00\xffbinary"),
    n.Rwrite(9),
    n.Tclunk(1),
    n.Rclunk(),
    n.Tremove(1),
    n.Rremove(),
    n.Tstat(1),
    n.Rstat(STAT),
    n.Twstat(1, STAT),
    n.Rwstat(),
]


@pytest.mark.parametrize("msg", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_round_trip_and_plan9port_agree(msg):
    for i, m in enumerate(EVERY_MESSAGE):
        m.tag = m.tag if m.tag == n.NOTAG else i
    frame = n.encode(msg)
    assert n.decode(frame) == msg
    # plan9port's convM2S/convS2M (bundled in python-9p) must read our frame and write the same bytes back
    assert py9p.encode_message(py9p.decode_message(frame)) == frame


def test_every_message_type_is_covered():
    assert {type(m).TYPE for m in EVERY_MESSAGE} == set(range(100, 128)) - {106}


def test_stat_layout_matches_plan9port():
    raw = STAT.encode()
    theirs = py9p.decode_dir(raw)
    assert (theirs.name, theirs.uid, theirs.mode, theirs.qid.path) == ("s", "ollie", n.DMDIR | 0o755, 1 << 40)
    assert py9p.encode_dir(theirs) == raw
    assert n.Stat.decode(raw) == STAT
    assert n.decode_stats(raw + raw) == [STAT, STAT]


def test_unchanged_stat_is_all_ones_but_the_change():
    st_ = n.Stat.decode(n.Stat.unchanged(name="x").encode())
    assert (st_.mode, st_.length, st_.qid.path, st_.name, st_.uid) == (0xFFFFFFFF, 2**64 - 1, 2**64 - 1, "x", "")


def frame(type_, body=b"", tag=1, size=None):
    raw = bytes([type_]) + tag.to_bytes(2, "little") + body
    return (size if size is not None else len(raw) + 4).to_bytes(4, "little") + raw


def s(text: bytes) -> bytes:
    return len(text).to_bytes(2, "little") + text


@pytest.mark.parametrize(
    "raw, why",
    [
        (b"", "shorter than a header"),
        (b"\x07\x00\x00\x00\x64\x00", "shorter than a header"),
        (frame(120, b"\x01\x00\x00\x00", size=99), "says 99 bytes"),
        (frame(106), "unknown message type 106"),  # Terror does not exist
        (frame(0), "unknown message type 0"),
        (frame(255), "unknown message type 255"),
        (frame(120, b"\x01\x00\x00"), "truncated"),
        (frame(120, b"\x01\x00\x00\x00\x00"), "trailing"),
        (frame(100, b"\x00\x20\x00\x00" + b"\x10\x00abc"), "truncated"),  # string longer than the frame
        (frame(100, b"\x00\x20\x00\x00" + s(b"\xff\xfe")), "not UTF-8"),
        (frame(110, b"\0" * 8 + (17).to_bytes(2, "little") + s(b"a") * 17), "exceed the limit of 16"),
        (frame(111, (17).to_bytes(2, "little") + b"\0" * 13 * 17), "exceed the limit of 16"),
        (frame(118, b"\0" * 12 + (1 << 31).to_bytes(4, "little")), "truncated"),  # count beyond the frame
        (frame(125, s(STAT.encode()[:-1])), "truncated"),  # stat[n] shorter than the entry says
        (frame(125, s(STAT.encode() + b"x")), "trailing"),  # stat[n] longer than the entry
        (frame(126, b"\1\0\0\0" + s(b"\x05\x00" + STAT.encode()[2:])), "truncated"),  # inner size too small
    ],
)
def test_malformed_frames_raise_protocol_error(raw, why):
    with pytest.raises(n.ProtocolError, match=why):
        n.decode(raw)


@pytest.mark.parametrize(
    "msg",
    [n.Tclunk(1 << 32), n.Tflush(-1), n.Twalk(0, 1, ["x"] * 17), n.Rerror("x" * 70000), n.Tclunk(1, tag=1 << 16)],
    ids=["fid", "negative", "walk", "string", "tag"],
)
def test_encoding_out_of_range_values_is_refused(msg):
    with pytest.raises(n.ProtocolError):
        n.encode(msg)


async def feed(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_read_frame_enforces_msize_before_reading_the_body():
    ok = n.encode(n.Tclunk(3))
    assert await n.read_frame(await feed(ok + ok), 8192) == ok
    with pytest.raises(n.ProtocolError, match="exceeds msize 8192"):
        await n.read_frame(await feed((8193).to_bytes(4, "little")), 8192)
    with pytest.raises(n.ProtocolError, match="shorter than a header"):
        await n.read_frame(await feed((3).to_bytes(4, "little")), 8192)
    with pytest.raises(EOFError):
        await n.read_frame(await feed(ok[:5]), 8192)


def decoded_or_protocol_error(raw: bytes) -> None:
    try:
        msg = n.decode(raw)
    except n.ProtocolError:
        return
    assert n.encode(msg) == raw  # whatever decodes is canonical: it encodes back to the same bytes


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(raw):
    decoded_or_protocol_error(raw)


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(EVERY_MESSAGE), st.data())
def test_fuzz_mutated_valid_frames(msg, data):
    raw = bytearray(n.encode(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(4, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(7, len(raw)))
    raw = raw[:cut]
    if data.draw(st.booleans()):  # keep the size honest so the body parser is what gets exercised
        raw[0:4] = len(raw).to_bytes(4, "little")
    decoded_or_protocol_error(bytes(raw))
