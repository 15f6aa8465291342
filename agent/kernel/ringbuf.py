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

Atomicity: the positions and headers are read and ``consumer_pos`` is written as whole
aligned words (a memoryview cast to u64/u32: one load or store each). ``struct.pack_into``
writes a u64 one byte at a time, low byte first: when the position carried into a higher
byte, a producer reading it between those stores saw it megabytes behind, took the ring
for full and lost the event — measured with the earlier per-record ``pack_into``: one or
two lost events (and a ``ring_full`` pause of tracing) in most 20-second runs at
~2,000-4,000 requests/s, none with whole-word stores.
"""

from __future__ import annotations

import mmap
import platform
from collections.abc import Callable

_BUSY = 1 << 31
_DISCARD = 1 << 30
_LEN_MASK = ~(_BUSY | _DISCARD) & 0xFFFFFFFF


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
        # native order is little endian where supported() holds; offsets are 8-aligned
        self._cons_u64 = memoryview(self._cons).cast("Q")  # [0]: consumer_pos
        self._prod_u64 = memoryview(self._prod).cast("Q")  # [0]: producer_pos
        self._prod_u32 = memoryview(self._prod).cast("I")  # record headers: [offset >> 2]

    def consume(self, handle: Callable[[bytes], object], limit: int = 1 << 20) -> int:
        """Hand the records committed when the call starts to ``handle`` (as bytes), in
        order; returns how many. Stops at the first record still being written (BUSY) or
        after ``limit``. Records produced meanwhile wait for the next call: a producer
        faster than the consumer cannot keep it here (the caller must get to look at its
        backlog and shed)."""
        prod, page, mask = self._prod, self._page, self.mask
        cons_u64, words = self._cons_u64, self._prod_u32
        cons: int = cons_u64[0]
        prod_pos: int = self._prod_u64[0]
        # The consumer position is published every eighth of the ring and at the end, not
        # after each record (a store per record): the producer sees the space freed a little
        # later, never more than an eighth of the ring.
        stored, step = cons, self.size >> 3
        n = 0
        try:
            while cons < prod_pos and n < limit:
                off = page + (cons & mask)
                hdr: int = words[off >> 2]
                if hdr & _BUSY:
                    break  # not committed yet: try again next drain
                ln = hdr & _LEN_MASK
                cons += (ln + 8 + 7) & ~7  # published below, after the record is copied
                if not hdr & _DISCARD:
                    handle(prod[off + 8 : off + 8 + ln])  # a slice of an mmap: one copy
                    n += 1
                if cons - stored >= step:
                    cons_u64[0] = cons
                    stored = cons
        finally:
            if cons != stored:
                cons_u64[0] = cons
        return n

    def backlog(self) -> float:
        """Share of the ring holding records not consumed yet (0..1)."""
        prod: int = self._prod_u64[0]
        cons: int = self._cons_u64[0]
        return (prod - cons) / self.size

    def close(self) -> None:
        for v in (self._cons_u64, self._prod_u64, self._prod_u32):
            v.release()  # before the maps: an exported buffer keeps an mmap open
        self._prod.close()
        self._cons.close()
