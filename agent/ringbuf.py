"""Consume a BPF ring buffer from Python through mmap of its map fd (no ctypes per event).

bcc's ``ring_buffer_consume()`` calls a ctypes Python callback for each record (about two
to three per request); here one Python loop walks the records in place:

* page 0 of the map (read-write): ``consumer_pos`` (u64), advanced by us;
* from page 1 (read-only): ``producer_pos`` (u64), then the data area mapped twice in a
  row, so a record that wraps around the end is still contiguous;
* each record: an 8-byte header, ``len`` (u32, bit 31 BUSY = not committed yet, bit 30
  DISCARD = skip) and a page offset, then ``len`` bytes, padded to 8.

Memory ordering: the producer commits a record by clearing BUSY with a release store and
the consumer's header load must be an acquire. x86-64 (TSO) gives that for plain loads;
elsewhere :func:`supported` is false and the loader keeps bcc's consumer.
"""

from __future__ import annotations

import mmap
import platform
import struct
from collections.abc import Callable

_BUSY = 1 << 31
_DISCARD = 1 << 30
_LEN_MASK = ~(_BUSY | _DISCARD) & 0xFFFFFFFF
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


def supported() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


class RingReader:
    """Records of one BPF_MAP_TYPE_RINGBUF map, read in place."""

    def __init__(self, map_fd: int, data_size: int) -> None:
        page = mmap.PAGESIZE
        if data_size <= 0 or data_size & (data_size - 1):
            raise ValueError(f"ring size {data_size} is not a power of two")
        self.size = data_size
        self.mask = data_size - 1
        self._cons = mmap.mmap(map_fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._prod = mmap.mmap(
            map_fd, page + 2 * data_size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page
        )
        self._page = page

    def consume(self, handle: Callable[[bytes], object], limit: int = 1 << 20) -> int:
        """Hand the records committed when the call starts to ``handle`` (as bytes), in
        order; returns how many. Stops at the first record still being written (BUSY) or
        after ``limit``. Records produced meanwhile wait for the next call: a producer
        faster than the consumer cannot keep it here (the caller must get to look at its
        backlog and shed)."""
        cons_map, prod, page, mask = self._cons, self._prod, self._page, self.mask
        u32 = _U32.unpack_from
        cons = _U64.unpack_from(cons_map, 0)[0]
        prod_pos = _U64.unpack_from(prod, 0)[0]
        # The consumer position is published every eighth of the ring and at the end, not
        # after each record (a store per record): the producer sees the space freed a little
        # later, never more than an eighth of the ring.
        stored, step = cons, self.size >> 3
        n = 0
        try:
            while cons < prod_pos and n < limit:
                off = page + (cons & mask)
                hdr = u32(prod, off)[0]
                if hdr & _BUSY:
                    break  # not committed yet: try again next drain
                ln = hdr & _LEN_MASK
                cons += (ln + 8 + 7) & ~7  # published below, after the record is copied
                if not hdr & _DISCARD:
                    handle(prod[off + 8 : off + 8 + ln])  # a slice of an mmap: one copy
                    n += 1
                if cons - stored >= step:
                    _U64.pack_into(cons_map, 0, cons)
                    stored = cons
        finally:
            if cons != stored:
                _U64.pack_into(cons_map, 0, cons)
        return n

    def backlog(self) -> float:
        """Share of the ring holding records not consumed yet (0..1)."""
        prod: int = _U64.unpack_from(self._prod, 0)[0]
        cons: int = _U64.unpack_from(self._cons, 0)[0]
        return (prod - cons) / self.size

    def close(self) -> None:
        self._prod.close()
        self._cons.close()
