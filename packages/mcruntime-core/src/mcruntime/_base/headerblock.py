"""Decoding HTTP/2 header blocks (HPACK, RFC 7541), lean enough for a call per webhook request.

``hpack``'s decoder was 40 % of the webhook server's CPU per call: it builds
an object per header, converts it twice, and formats a debug log line for each
even when nothing is logged. This decoder returns ``(name, value)`` byte pairs
and nothing else. It keeps hpack's Huffman table and static table, so only
the block's layout is ours.

Every input is bounded: an index outside the tables, an integer over 2^28, a
string past the block's end, a table size update over our setting or after
the first header, and a header list over ``max_header_list_size`` (names,
values and 32 bytes each, as RFC 9113 counts them) each raise
:class:`HeaderBlockError` naming the fault. The connection must then close:
the peer's table and ours no longer agree.
"""

from __future__ import annotations

from collections import deque

from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

_STATIC: tuple[tuple[bytes, bytes], ...] = HeaderTable.STATIC_TABLE
_STATIC_COUNT = len(_STATIC)
_ENTRY_OVERHEAD = 32
_MAX_INTEGER = 1 << 28


class HeaderBlockError(ValueError):
    """A header block that does not decode: the connection's compression state is lost."""


def _integer(block: bytes, position: int, prefix: int) -> tuple[int, int]:
    """The integer at ``position`` with a ``prefix``-bit prefix (RFC 7541 5.1), and where it ends."""
    mask = (1 << prefix) - 1
    value = block[position] & mask
    position += 1
    if value < mask:
        return value, position
    shift = 0
    while True:
        if position >= len(block):
            raise HeaderBlockError("an integer runs past the end of the block")
        byte = block[position]
        position += 1
        value += (byte & 0x7F) << shift
        if value >= _MAX_INTEGER:
            raise HeaderBlockError("an integer over 2^28")
        if not byte & 0x80:
            return value, position
        shift += 7


def _string(block: bytes, position: int) -> tuple[bytes, int]:
    """The string literal at ``position`` (RFC 7541 5.2), Huffman-decoded if so coded."""
    if position >= len(block):
        raise HeaderBlockError("a header ends before its string")
    huffman = block[position] & 0x80
    length, position = _integer(block, position, 7)
    end = position + length
    if end > len(block):
        raise HeaderBlockError("a string runs past the end of the block")
    raw = block[position:end]
    if not huffman:
        return raw, end
    try:
        return decode_huffman(raw), end
    except Exception as error:  # hpack raises its own error types for a bad code or padding
        raise HeaderBlockError(f"a Huffman string that does not decode: {error}") from None


class HeaderDecoder:
    """One connection's decoding side: its dynamic table, kept in step with the peer's encoder."""

    __slots__ = ("_entries", "_max_list", "_setting", "_size", "_table_max")

    def __init__(self, *, max_header_list_size: int, table_size: int = 4096) -> None:
        self._entries: deque[tuple[bytes, bytes]] = deque()
        """The dynamic table, newest first (index 62 is ``_entries[0]``)."""
        self._size = 0
        self._setting = table_size
        """Our SETTINGS_HEADER_TABLE_SIZE: the most a size update may ask for."""
        self._table_max = table_size
        self._max_list = max_header_list_size

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """The headers of one whole block, in order."""
        headers: list[tuple[bytes, bytes]] = []
        listed = 0
        position, end = 0, len(block)
        while position < end:
            byte = block[position]
            if byte & 0x80:  # indexed field (6.1)
                index, position = _integer(block, position, 7)
                header = self._get(index)
            elif byte & 0x40:  # literal, added to the table (6.2.1)
                header, position = self._literal(block, position, 6)
                self._add(header)
            elif byte & 0x20:  # dynamic table size update (6.3)
                if headers:
                    raise HeaderBlockError("a table size update after a header")
                size, position = _integer(block, position, 5)
                if size > self._setting:
                    raise HeaderBlockError(f"a table size update to {size}, over {self._setting}")
                self._table_max = size
                self._evict()
                continue
            else:  # literal, not added (6.2.2) or never to be added (6.2.3)
                header, position = self._literal(block, position, 4)
            listed += len(header[0]) + len(header[1]) + _ENTRY_OVERHEAD
            if listed > self._max_list:
                raise HeaderBlockError(f"a header list over {self._max_list} bytes")
            headers.append(header)
        return headers

    def _literal(self, block: bytes, position: int, prefix: int) -> tuple[tuple[bytes, bytes], int]:
        """A literal field: its name by index (``prefix`` bits) or as a string, then its value."""
        index, position = _integer(block, position, prefix)
        if index:
            name = self._get(index)[0]
        else:
            name, position = _string(block, position)
        value, position = _string(block, position)
        return (name, value), position

    def _get(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= _STATIC_COUNT:
            return _STATIC[index - 1]
        dynamic = index - _STATIC_COUNT - 1
        if index == 0 or dynamic >= len(self._entries):
            raise HeaderBlockError(f"a header index {index} outside the tables")
        return self._entries[dynamic]

    def _add(self, header: tuple[bytes, bytes]) -> None:
        size = len(header[0]) + len(header[1]) + _ENTRY_OVERHEAD
        if size > self._table_max:  # larger than the whole table: it empties it (RFC 7541 4.4)
            self._entries.clear()
            self._size = 0
            return
        self._entries.appendleft(header)
        self._size += size
        self._evict()

    def _evict(self) -> None:
        while self._size > self._table_max:
            name, value = self._entries.pop()
            self._size -= len(name) + len(value) + _ENTRY_OVERHEAD


def _integer_bytes(value: int, prefix: int, flags: int) -> bytes:
    """``value`` with a ``prefix``-bit prefix, ``flags`` in the first byte's upper bits (RFC 7541 5.1)."""
    mask = (1 << prefix) - 1
    if value < mask:
        return bytes((flags | value,))
    out = bytearray((flags | mask,))
    value -= mask
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_STATIC_FIELDS = {header: index for index, header in reversed(list(enumerate(_STATIC, 1)))}
_STATIC_NAMES = {name: index for index, (name, _value) in reversed(list(enumerate(_STATIC, 1)))}
TABLE_SIZE_ZERO = b"\x20"
"""A dynamic table size update to 0: what an encoder that never indexes begins its first block with."""


def encode_block(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A header block that uses the static table and never the dynamic one (no state to keep in step).

    Fields the static table holds whole (``:status 200``) take one byte; the
    others are literals "without indexing" with the static name when there is
    one. Nothing is Huffman-coded: a response's few short values gain nothing.
    """
    return b"".join([_FIELDS.get(header) or _field(header) for header in headers])


_FIELDS: dict[tuple[bytes, bytes], bytes] = {}
"""Fields coded already (a server's responses repeat a few): at most ``_FIELDS_KEPT``."""
_FIELDS_KEPT = 256


def _field(header: tuple[bytes, bytes]) -> bytes:
    coded = _literal(header, 0x00)
    if len(_FIELDS) < _FIELDS_KEPT:
        _FIELDS[header] = coded
    return coded


def _literal(header: tuple[bytes, bytes], never: int) -> bytes:
    """One field: whole from the static table, else a literal (``never`` 0x10: never indexed)."""
    name, value = header
    index = _STATIC_FIELDS.get(header) if not never else None
    if index is not None:
        return _integer_bytes(index, 7, 0x80)
    named = _STATIC_NAMES.get(name)
    if named is not None:
        prefix = _integer_bytes(named, 4, never)
    else:
        prefix = bytes((never,)) + _integer_bytes(len(name), 7, 0x00) + name
    return prefix + _integer_bytes(len(value), 7, 0x00) + value


SECRET_HEADERS = frozenset({b"authorization", b"proxy-authorization", b"cookie"})
"""Sent as literals never indexed (RFC 7541 6.2.3): no compression context, ours or a proxy's, keeps them."""


def encode_request_block(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A request's header block: :func:`encode_block`'s coding, credentials never indexed, nothing kept.

    A watch's request is sent once per watch, its path and token its own
    cluster's, so remembering coded fields would only fill the cache that a
    webhook server's repeated responses use, and indexing them (hpack's
    encoder: 13 µs a request with a 900-byte token, against 6 here) keeps
    fields that one request never sends again.
    """
    return b"".join([_literal(header, 0x10 if header[0] in SECRET_HEADERS else 0x00) for header in headers])
