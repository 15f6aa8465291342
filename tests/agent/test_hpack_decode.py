"""agent.protocols.hpack_decode against the ``hpack`` package's decoder, its reference: on
blocks a real encoder wrote (Huffman or not, indexed or not, table size changes) and on those
blocks damaged — truncated, bytes flipped, spliced — both decoders, fed the same sequence,
give the same headers or both refuse, and keep the same dynamic table."""

from __future__ import annotations

import random

import hpack
import pytest

from agent.protocols.hpack_decode import MAX_HEADER_LIST, Decoder

NAMES = [b":method", b":path", b":status", b":authority", b"traceparent", b"content-type",
         b"grpc-status", b"date", b"server", b"x-request-id", b"user-agent", b"cookie"]  # fmt: skip


def _headers(rng: random.Random) -> list[tuple[bytes, bytes]]:
    out = []
    for _ in range(rng.randint(1, 12)):
        name = rng.choice(NAMES) if rng.random() < 0.8 else rng.randbytes(rng.randint(1, 9))
        value = rng.choice([b"GET", b"200", b"/v1/chat", b"application/grpc", b""])
        if rng.random() < 0.5:
            value = bytes(
                rng.choice(b"abcdefghijklmnop0123456789-/ ") for _ in range(rng.randint(0, 80))
            )
        if rng.random() < 0.05:
            value = rng.randbytes(rng.randint(0, 300))  # not text: Huffman still codes it
        out.append((name, value))
    return out


def _blocks(seed: int, n: int = 40) -> tuple[list[bytes], list[int | None]]:
    """A connection's blocks from a real encoder, and the allowed table size to set before
    each (None: unchanged)."""
    rng = random.Random(seed)
    enc = hpack.Encoder()
    blocks, allowed = [], []
    for _ in range(n):
        size = None
        if rng.random() < 0.1:
            size = rng.choice([0, 64, 256, 4096])
            enc.header_table_size = size
        hs = _headers(rng)
        sensitive = rng.random() < 0.2
        hs2 = [
            hpack.HeaderTuple(*h) if not sensitive else hpack.NeverIndexedHeaderTuple(*h)
            for h in hs
        ]
        blocks.append(enc.encode(hs2, huffman=rng.random() < 0.7))
        allowed.append(size)
    return blocks, allowed


def _damage(rng: random.Random, b: bytes) -> bytes:
    kind = rng.randrange(4)
    if kind == 0 and b:
        return b[: rng.randrange(len(b))]
    if kind == 1 and b:
        i = rng.randrange(len(b))
        return b[:i] + bytes([b[i] ^ (1 << rng.randrange(8))]) + b[i + 1 :]
    if kind == 2:
        i = rng.randrange(len(b) + 1)
        return b[:i] + rng.randbytes(rng.randint(1, 6)) + b[i:]
    return rng.randbytes(rng.randint(1, 40))


def _run(blocks: list[bytes], allowed: list[int | None]) -> int:
    """Both decoders over one connection's blocks: equal until both refuse the same block.
    Returns how many blocks decoded."""
    ref, lean = hpack.Decoder(), Decoder()
    for i, (block, size) in enumerate(zip(blocks, allowed, strict=True)):
        if size is not None:
            ref.max_allowed_table_size = lean.max_allowed_table_size = size
        try:
            want = [tuple(h) for h in ref.decode(block, raw=True)]
        except hpack.HPACKError as e:
            with pytest.raises(hpack.HPACKError) as got:
                lean.decode(block)
            assert type(got.value) is type(e), (i, block, e, got.value)
            return i
        assert lean.decode(block) == want, (i, block)
        assert list(lean._entries) == list(ref.header_table.dynamic_entries)
        assert lean._max == ref.header_table_size
    return len(blocks)


def test_the_blocks_a_real_encoder_writes() -> None:
    decoded = sum(_run(*_blocks(seed)) for seed in range(150))
    assert decoded == 150 * 40  # none refused: these are valid


def test_damaged_blocks_are_refused_alike() -> None:
    rng = random.Random(7)
    refused = 0
    for seed in range(400):
        blocks, allowed = _blocks(seed, 12)
        i = rng.randrange(len(blocks))
        blocks[i] = _damage(rng, blocks[i])
        refused += _run(blocks, allowed) < len(blocks)
    assert refused > 100  # the damage is not all harmless: refusals were compared


@pytest.mark.parametrize(
    ("block", "why"),
    [
        (b"\x80", "index 0"),
        (b"\xff\x80\x80\x80\x80\x80\x01", "an integer longer than 5 octets"),
        (b"\xbf", "an integer cut short"),
        (b"\x40\x05ab", "a name cut short"),
        (b"\x40\x01a", "no value"),
        (b"\x82\x3f\xe1\x1f", "a size update after a field"),
        (b"\x3f\xe2\x1f", "a size update over the allowed maximum"),
        (b"\x40\x81\xff\x00", "a Huffman string with EOS"),
    ],
)
def test_what_is_no_block(block: bytes, why: str) -> None:
    with pytest.raises(hpack.HPACKError) as want:
        hpack.Decoder().decode(block, raw=True)
    with pytest.raises(hpack.HPACKError) as got:
        Decoder().decode(block)
    assert type(got.value) is type(want.value), why


def test_a_block_that_expands_past_the_limit() -> None:
    # one literal added to the table, then indexed again and again: small on the wire
    enc = hpack.Encoder()
    first = enc.encode([(b"x-big", b"v" * 3000)], huffman=False)
    block = first + b"\xbe" * (MAX_HEADER_LIST // 3000 + 1)
    with pytest.raises(hpack.OversizedHeaderListError):
        hpack.Decoder().decode(block, raw=True)
    with pytest.raises(hpack.OversizedHeaderListError):
        Decoder().decode(block)
