"""HPACK (RFC 7541) header-block decoding for the HTTP/2 reader: the ``hpack`` package's
``Decoder.decode(block, raw=True)`` without its per-header costs (a debug log call, a
``HeaderTuple`` and a copy of the rest of the block per field) — the same headers, the same
dynamic table, the same errors (``hpack``'s exception classes), tested differentially
against it (tests/agent/test_hpack_decode.py). Huffman strings go through ``hpack``'s own
decoder: the one table of its kind."""

from __future__ import annotations

from collections import deque

from hpack.exceptions import (
    HPACKDecodingError,
    InvalidTableIndex,
    InvalidTableSizeError,
    OversizedHeaderListError,
)
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

_STATIC = HeaderTable.STATIC_TABLE
_N_STATIC = len(_STATIC)
_ENTRY_OVERHEAD = 32  # RFC 7541 4.1: an entry's size is its name, its value and 32
DEFAULT_TABLE_SIZE = 4096  # SETTINGS_HEADER_TABLE_SIZE's initial value
MAX_HEADER_LIST = 1 << 16  # decoded bytes one block may expand to (hpack's default)
_VARINT_MAX = 5  # octets of one integer, prefix included (hpack's limit)

Header = tuple[bytes, bytes]


def _integer(data: bytes, pos: int, mask: int) -> tuple[int, int]:
    """(the integer at ``pos`` with a prefix of ``mask``'s bits, the position after it)."""
    number = data[pos] & mask
    pos += 1
    if number < mask:
        return number, pos
    shift, used = 0, 1
    while True:
        if pos >= len(data):
            raise HPACKDecodingError("Unable to decode HPACK integer representation")
        b = data[pos]
        pos += 1
        used += 1
        number += (b & 0x7F) << shift
        if b < 0x80:
            return number, pos
        shift += 7
        if used > _VARINT_MAX:
            raise HPACKDecodingError("Variable integer representation is too long")


def _string(data: bytes, pos: int) -> tuple[bytes, int]:
    """(the string literal at ``pos``, Huffman-decoded where flagged, the position after)."""
    if pos >= len(data):
        raise HPACKDecodingError("Unable to decode HPACK integer representation")
    huffman = data[pos] & 0x80
    length, pos = _integer(data, pos, 0x7F)
    end = pos + length
    if end > len(data):
        raise HPACKDecodingError("Truncated header block")
    s = data[pos:end]
    return (decode_huffman(s) if huffman else s), end


class Decoder:
    """One direction's decoder: its dynamic table, newest entry first."""

    __slots__ = ("_entries", "_max", "_size", "max_allowed_table_size")

    def __init__(self) -> None:
        self._entries: deque[Header] = deque()
        self._size = 0  # of the entries, RFC 7541 4.1
        self._max = DEFAULT_TABLE_SIZE  # the encoder's current maximum
        # SETTINGS_HEADER_TABLE_SIZE the decoding side announced: the encoder may not exceed it
        self.max_allowed_table_size = DEFAULT_TABLE_SIZE

    def _get(self, index: int) -> Header:
        if 0 < index <= _N_STATIC:
            return _STATIC[index - 1]
        i = index - _N_STATIC - 1
        if 0 <= i < len(self._entries):
            return self._entries[i]
        raise InvalidTableIndex(f"Invalid table index {index}")

    def _add(self, h: Header) -> None:
        size = _ENTRY_OVERHEAD + len(h[0]) + len(h[1])
        if size > self._max:  # larger than the table: it empties (RFC 7541 4.4)
            self._entries.clear()
            self._size = 0
            return
        self._entries.appendleft(h)
        self._size += size
        self._evict()

    def _evict(self) -> None:
        while self._size > self._max:
            name, value = self._entries.pop()
            self._size -= _ENTRY_OVERHEAD + len(name) + len(value)

    def _resize(self, size: int) -> None:
        if size > self.max_allowed_table_size:
            raise InvalidTableSizeError("Encoder exceeded max allowable table size")
        self._max = size
        if size <= 0:
            self._entries.clear()
            self._size = 0
        else:
            self._evict()

    def _literal(self, data: bytes, pos: int, mask: int) -> tuple[Header, int]:
        if data[pos] & mask:  # the name by index
            index, pos = _integer(data, pos, mask)
            name = self._get(index)[0]
        else:
            name, pos = _string(data, pos + 1)
        value, pos = _string(data, pos)
        return (name, value), pos

    def decode(self, block: bytes | bytearray) -> list[Header]:
        """One whole header block's fields, in order; the dynamic table updated."""
        data = bytes(block)
        headers: list[Header] = []
        inflated = 0
        pos, n = 0, len(data)
        while pos < n:
            b = data[pos]
            if b & 0x80:  # indexed field
                index, pos = _integer(data, pos, 0x7F)
                h = self._get(index)
            elif b & 0x40:  # literal, added to the table
                h, pos = self._literal(data, pos, 0x3F)
                self._add(h)
            elif b & 0x20:  # table size update: only before the block's first field
                if headers:
                    raise HPACKDecodingError("Table size update not at the start of the block")
                size, pos = _integer(data, pos, 0x1F)
                self._resize(size)
                continue
            else:  # literal, not indexed or never indexed
                h, pos = self._literal(data, pos, 0x0F)
            headers.append(h)
            inflated += _ENTRY_OVERHEAD + len(h[0]) + len(h[1])
            if inflated > MAX_HEADER_LIST:
                raise OversizedHeaderListError(
                    f"A header list larger than {MAX_HEADER_LIST} has been received"
                )
        # a maximum the decoding side lowered, which the encoder has not followed yet
        if self._max > self.max_allowed_table_size:
            raise InvalidTableSizeError("Encoder did not shrink table size to within the max")
        return headers
