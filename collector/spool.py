"""The spool's file format and its one writer: whole records or nothing.

A record is framed so that replay can tell a complete one from anything else, and find the
next complete one after damage: ``MAGIC``, kind, received (Unix ns), body length, crc32 of
the body, then a crc32 of those header bytes, then the body. A header whose own checksum
holds gives a length that can be trusted; a body whose checksum holds is the body that was
acknowledged. Segments written before this framing (no magic, no header checksum) are
still read, up to their first bad record.

``SegmentFile.append`` writes one record and, when the write fails or is short (a full
disk, a quota, an I/O error, a failed fsync), truncates the file back to the end of the
last complete record before raising: the caller answers 503, and the file holds only what
was acknowledged. ``DiskState`` makes a full disk a state rather than an error per request.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("parallax.collector")

MAGIC = b"\x8aPXR"  # never a v1 record's first byte (a kind, 1–3)
_HEAD = struct.Struct("<4sBQII")  # magic, kind, received_ns, body length, crc32(body)
_HEAD_CRC = struct.Struct("<I")  # crc32 of the _HEAD bytes
HEADER_SIZE = _HEAD.size + _HEAD_CRC.size
_V1 = struct.Struct("<BQII")  # the framing before MAGIC: kind, received_ns, length, crc32
# the record kinds (collector/pipeline.py names them: OTLP traces protobuf/JSON, beacons,
# OTLP metrics protobuf/JSON); a test holds the two lists together
KINDS = frozenset({1, 2, 3, 4, 5})
# Errors that mean "no room": answered 503 until free space returns.
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def frame(kind: int, received_ns: int, body: bytes) -> bytes:
    head = _HEAD.pack(MAGIC, kind, received_ns, len(body), zlib.crc32(body))
    return head + _HEAD_CRC.pack(zlib.crc32(head)) + body


Record = tuple[int, int, bytes]  # kind, received_ns, body


@dataclass(slots=True)
class Damage:
    """What replay of one segment skipped: (offset, bytes) per damaged stretch."""

    stretches: list[tuple[int, int]] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(n for _, n in self.stretches)


def _record_at(data: bytes, pos: int) -> Record | None:
    if len(data) - pos < HEADER_SIZE:
        return None
    magic, kind, received_ns, n, crc = _HEAD.unpack_from(data, pos)
    if magic != MAGIC or kind not in KINDS:
        return None
    (head_crc,) = _HEAD_CRC.unpack_from(data, pos + _HEAD.size)
    if zlib.crc32(data[pos : pos + _HEAD.size]) != head_crc:
        return None
    start = pos + HEADER_SIZE
    body = data[start : start + n]
    if len(body) != n or zlib.crc32(body) != crc:
        return None
    return kind, received_ns, body


def parse_segment(data: bytes) -> tuple[list[Record], Damage]:
    """The complete records of a segment's bytes, and what was skipped between them."""
    out: list[Record] = []
    damage = Damage()
    if data and not data.startswith(MAGIC):
        return _parse_v1(data, damage), damage
    pos = 0
    while pos < len(data):
        rec = _record_at(data, pos)
        if rec is not None:
            out.append(rec)
            pos += HEADER_SIZE + len(rec[2])
            continue
        # Damaged here: resume at the next offset that holds a whole, checked record.
        nxt = data.find(MAGIC, pos + 1)
        while nxt != -1 and _record_at(data, nxt) is None:
            nxt = data.find(MAGIC, nxt + 1)
        end = len(data) if nxt == -1 else nxt
        damage.stretches.append((pos, end - pos))
        pos = end
    return out, damage


def _parse_v1(data: bytes, damage: Damage) -> list[Record]:
    # No magic and no header checksum: after a bad record nothing can be trusted.
    out: list[Record] = []
    pos = 0
    while pos + _V1.size <= len(data):
        kind, received_ns, n, crc = _V1.unpack_from(data, pos)
        body = data[pos + _V1.size : pos + _V1.size + n]
        if kind not in KINDS or len(body) != n or zlib.crc32(body) != crc:
            break
        out.append((kind, received_ns, body))
        pos += _V1.size + n
    if pos < len(data):
        damage.stretches.append((pos, len(data) - pos))
    return out


def read_segment(path: Path) -> tuple[list[Record], Damage]:
    """A segment file's complete records; what was skipped is logged here, once."""
    records, damage = parse_segment(path.read_bytes())
    for pos, n in damage.stretches:
        log.warning(
            "spool: %s: skipped %d byte(s) at offset %d (a torn or damaged record, never "
            "acknowledged or damaged on disk); %d complete record(s) in the segment kept",
            path.name,
            n,
            pos,
            len(records),
        )
    return records, damage


class SegmentFile:
    """One open segment: ``append`` writes a whole record, or leaves the file as it was."""

    def __init__(self, path: Path, fsync: bool) -> None:
        self.path = path
        self.fsync = fsync
        self.nbytes = 0  # the end of the last complete record
        self.broken = False  # an undo failed: append nothing more here
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def append(self, rec: bytes) -> None:
        """Raises OSError (the file truncated back to ``nbytes``) when the record is not
        wholly written — and, with ``fsync``, synced."""
        try:
            view = memoryview(rec)
            done = 0
            while done < len(rec):  # a short write is retried: the next one says why
                k = os.write(self._fd, view[done:])
                if k == 0:
                    raise OSError(errno.EIO, "write returned 0")
                done += k
            if self.fsync:
                os.fsync(self._fd)
        except OSError:
            self._undo()
            raise
        self.nbytes += len(rec)

    def _undo(self) -> None:
        try:
            os.ftruncate(self._fd, self.nbytes)  # shrinking needs no free space
        except OSError as e:
            # The file may end in a partial record: replay skips it, but no later record
            # may follow it here (the caller rotates to a new segment).
            self.broken = True
            log.error("spool: could not undo a failed write in %s: %s", self.path.name, e)

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError as e:
            log.warning("spool: closing %s: %s", self.path.name, e)


def free_bytes(path: Path) -> tuple[int, int]:
    """(bytes free to an unprivileged writer, filesystem size) where ``path`` lives."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


class DiskState:
    """A full spool disk is a state: entered on the first ENOSPC/EDQUOT (logged once, with
    the free space), left when a write succeeds again (logged once). While full, a write is
    tried only when the filesystem reports room for it (statvfs at most every
    ``PROBE_EVERY_S``), so a full disk costs one cheap check per refused request."""

    PROBE_EVERY_S = 0.2
    RESUME_MARGIN = 64 << 10  # free bytes beyond the record before writing is tried again

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.full = False
        self.since = 0.0
        self._probe_at = 0.0
        self._room = False

    def may_write(self, n: int) -> bool:
        if not self.full:
            return True
        now = time.monotonic()
        if now >= self._probe_at:
            self._probe_at = now + self.PROBE_EVERY_S
            try:
                free, _ = free_bytes(self.dir)
            except OSError:
                free = 0
            self._room = free >= n + self.RESUME_MARGIN
        return self._room

    def failed(self, e: OSError) -> None:
        if e.errno not in NO_SPACE or self.full:
            return
        self.full, self.since = True, time.monotonic()
        self._probe_at = self.since + self.PROBE_EVERY_S
        self._room = False
        try:
            free, size = free_bytes(self.dir)
            room = f"{free} of {size} bytes free"
        except OSError as err:
            room = f"free space unknown: {err}"
        log.error(
            "spool: disk full writing to %s (%s, %s): answering 503 + Retry-After until "
            "space returns; nothing acknowledged is lost",
            self.dir,
            os.strerror(e.errno or 0),
            room,
        )

    def wrote(self) -> None:
        if not self.full:
            return
        self.full = False
        try:
            free, _ = free_bytes(self.dir)
        except OSError:
            free = -1
        log.warning(
            "spool: disk space is back (%d bytes free) after %.0f s: accepting again",
            free,
            time.monotonic() - self.since,
        )
