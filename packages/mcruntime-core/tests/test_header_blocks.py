"""Our HPACK decoder and encoder (``_base/headerblock.py``) against hpack's, and against hostile blocks."""

from __future__ import annotations

import random
import re

import hpack
import pytest

from mcruntime._base.headerblock import TABLE_SIZE_ZERO, HeaderBlockError, HeaderDecoder, encode_block

NAMES = [
    b":method",
    b":path",
    b":authority",
    b"content-type",
    b"content-length",
    b"user-agent",
    b"x-custom",
    b"accept",
]


def _random_headers(rng: random.Random) -> list[tuple[bytes, bytes]]:
    headers = []
    for _ in range(rng.randint(1, 12)):
        name = rng.choice(NAMES)
        value = rng.choice(
            [
                b"POST",
                b"/clusters/east/validate/core/v1/ConfigMap?timeout=10s",
                b"application/json",
                b"",
                str(rng.randint(0, 10**6)).encode(),
                bytes(rng.randrange(32, 127) for _ in range(rng.randint(0, 300))),
            ]
        )
        headers.append((name, value))
    return headers


@pytest.mark.parametrize("seed", range(8))
def test_what_hpack_encodes_decodes_the_same_over_a_long_connection(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 -- reproducible test input, not a secret
    encoder = hpack.Encoder()
    ours = HeaderDecoder(max_header_list_size=1 << 20)
    reference = hpack.Decoder(max_header_list_size=1 << 20)
    for round_ in range(300):
        if round_ % 97 == 50:
            encoder.header_table_size = rng.choice([0, 256, 1024, 4096])  # a size update in the next block
        headers = _random_headers(rng)
        sensitive = rng.random() < 0.2
        block = encoder.encode(
            [hpack.NeverIndexedHeaderTuple(n, v) if sensitive else (n, v) for n, v in headers],
            huffman=rng.random() < 0.7,
        )
        expected = [(bytes(n), bytes(v)) for n, v in reference.decode(block, raw=True)]
        assert ours.decode(block) == expected == headers


def test_our_blocks_decode_with_hpack_and_never_touch_its_table() -> None:
    decoder = hpack.Decoder()
    headers = [(b":status", b"200"), (b"content-type", b"application/json"), (b"content-length", b"1234")]
    first = TABLE_SIZE_ZERO + encode_block(headers)
    assert first[:2] == b"\x20\x88"  # the size update, then :status 200 as one byte
    assert [(bytes(n), bytes(v)) for n, v in decoder.decode(first, raw=True)] == headers
    odd = [(b":status", b"413"), (b"x-long-name-" + b"n" * 200, b"v" * 300)]
    assert [(bytes(n), bytes(v)) for n, v in decoder.decode(encode_block(odd), raw=True)] == odd
    assert len(decoder.header_table.dynamic_entries) == 0


HOSTILE = [
    ("index 0", b"\x80", "index 0 outside the tables"),
    ("index past the tables", b"\xbf", "index 63 outside the tables"),
    ("an endless integer", b"\xff" + b"\xff" * 6, "an integer over 2^28"),
    ("a cut integer", b"\xff\xff", "runs past the end"),
    ("a string past the end", b"\x40\x05ab", "a string runs past the end"),
    ("a literal without its value", b"\x40\x01a", "a header ends before its string"),
    ("a size update over the setting", b"\x3f\xe2\x1f", "a table size update to 4097, over 4096"),
    ("a size update after a header", b"\x88\x20", "a table size update after a header"),
    ("a bad huffman string", b"\x40\x81\xff\x01a", "a Huffman string that does not decode"),
]


@pytest.mark.parametrize(
    ("block", "complaint"), [case[1:] for case in HOSTILE], ids=[case[0] for case in HOSTILE]
)
def test_a_hostile_block_is_refused_with_its_fault(block: bytes, complaint: str) -> None:
    with pytest.raises(HeaderBlockError, match=re.escape(complaint)):
        HeaderDecoder(max_header_list_size=4096).decode(block)


def test_a_header_list_over_the_limit_is_refused() -> None:
    block = hpack.Encoder().encode([(b"x", b"y" * 100)] * 3, huffman=False)
    assert len(HeaderDecoder(max_header_list_size=1 << 10).decode(block)) == 3
    with pytest.raises(HeaderBlockError, match="a header list over 300 bytes"):
        HeaderDecoder(max_header_list_size=300).decode(block)


def test_an_entry_larger_than_the_table_empties_it() -> None:
    decoder = HeaderDecoder(max_header_list_size=1 << 16)
    encoder = hpack.Encoder()
    decoder.decode(encoder.encode([(b"a", b"1")]))
    huge = b"\x40\x01b" + b"\x7f\x81\x1f" + b"z" * 4096  # literal with indexing, a value of 4,096 bytes
    assert decoder.decode(huge) == [(b"b", b"z" * 4096)]
    with pytest.raises(HeaderBlockError, match="index 62 outside the tables"):
        decoder.decode(b"\xbe")  # the entry "a: 1" went with the rest
