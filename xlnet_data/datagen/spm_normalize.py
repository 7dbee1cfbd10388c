"""SentencePiece's normaliser (normalizer.cc), compiled: a model's own table and whitespace rules.

At each position the user-defined symbols are matched first (the longest, copied as they are), else the
longest entry of the precompiled charsmap (its replacement), else one character is copied. Spaces then
follow SentencePiece's rules: leading ones dropped, a run of them kept as one, trailing ones dropped
(remove_extra_whitespaces), U+2581 put in front (add_dummy_prefix) and for every space (escape_whitespaces).

Most text is ASCII: a byte below 0x80 that begins no longer table entry with an ASCII byte after it, and no
user-defined symbol, has its replacement looked up in a table of 128 (NormalizerTables.ascii_*) when the
byte after it is ASCII too, or whatever follows when it begins no longer entry at all (a space, a digit);
otherwise the table is searched, since NFKC composes a letter with the mark after it.
"""

import dataclasses

import numpy as np

from xlnet_data.common import compiled
from xlnet_data.dataformat import spm_model
from xlnet_data.dataformat.spm_model import USER_DEFINED
from xlnet_data.datagen import tries
from xlnet_data.datagen.utf8_lines import code_point_2, code_point_3

SPACE = 0x20  # U+2581, SentencePiece's escaped space, is E2 96 81 in UTF-8


@dataclasses.dataclass(frozen=True)
class NormalizerTables:
    """A model's normaliser as arrays for the compiled code."""
    units: np.ndarray  # the charsmap's Darts double array (uint32; one empty unit without a charsmap)
    replacements: np.ndarray  # its NUL-terminated replacement strings (uint8)
    replacement_lengths: np.ndarray  # at each offset of `replacements`, the length of the string there
    ud_slots: np.ndarray  # the user-defined symbols (tries.build_double_array; their length as value)
    ud_first: np.ndarray  # bool[256]: a user-defined symbol begins with this byte
    ascii_fast: np.ndarray  # uint8[128]: the byte's replacement is ascii_* when an ASCII byte follows (1) or
    # whatever follows (2: it begins no longer entry at all, as a space, a digit or most punctuation)
    ascii_from: np.ndarray  # int64[128]: its replacement's offset in `replacements`, -1: the byte itself
    ascii_length: np.ndarray  # int64[128]: its replacement's length
    plain: np.ndarray  # bool[65536]: a character of 2 or 3 bytes that begins no table entry nor symbol (copied)
    char_nodes: np.ndarray  # int64[65536]: for one that begins an entry (and no symbol), the table's node after
    # its bytes, where the search goes on with the bytes after it (-1: none such); char_matches: the longest
    # entry within its bytes then, as length << 32 | value (0: none). Kana that take a voicing mark (27% of
    # the characters of Japanese text) were searched from the table's root, byte by byte, each time.
    char_matches: np.ndarray
    flags: np.ndarray  # bool[3]: remove_extra_whitespaces, add_dummy_prefix, escape_whitespaces


@compiled.jit(inline="always")
def one_char_len(lead):
    """SentencePiece's OneCharLen: the length of the UTF-8 sequence a byte begins (1 for a continuation)."""
    high = lead >> 4
    return 1 if high < 12 else 2 if high < 14 else 3 if high == 14 else 4


@compiled.jit(inline="always")
def _prefix(data, pos, end, units, replacements, replacement_lengths, ud_slots, ud_first):
    """SentencePiece's NormalizePrefix at data[pos:end]: (from the table?, offset, length, consumed): the
    replacement is replacements[offset:offset + length] from the table, else data[offset:offset + length]."""
    if ud_first[data[pos]]:
        length, _ = tries.longest_key(ud_slots, data, pos, end)
        if length:
            return False, pos, length, length
    length, value, _ = tries.darts_longest(units, data, pos, end)
    if length:
        return True, value, replacement_lengths[value], length
    length = min(one_char_len(data[pos]), end - pos)
    return False, pos, length, length


@compiled.jit(inline="always")
def _put_escaped_space(out, n):
    out[n], out[n + 1], out[n + 2] = 0xE2, 0x96, 0x81
    return n + 3


@compiled.jit(inline="always")
def _put_byte(out, n, byte):
    out[n] = byte
    return n + 1


@compiled.jit(inline="always")
def _ends_in_space(out, begin, n, escape):
    """Whether out[begin:n] ends in a space (escaped or not)."""
    if escape:
        return n - begin >= 3 and out[n - 1] == 0x81 and out[n - 2] == 0x96 and out[n - 3] == 0xE2
    return n - begin >= 1 and out[n - 1] == SPACE


@compiled.jit(inline="always")
def _append(source, offset, length, out, n, prev_space, escape):
    """Appends a replacement to out[:n] as the normaliser's main loop does; returns (n, prev_space)."""
    i, stop = offset, offset + length
    if prev_space:
        while i < stop and source[i] == SPACE:
            i += 1
    if i == stop:
        return n, prev_space
    for j in range(i, stop):
        if escape and source[j] == SPACE:
            n = _put_escaped_space(out, n)
        else:
            out[n] = source[j]
            n += 1
    return n, source[stop - 1] == SPACE


@compiled.jit(inline="always")
def _copied_not_space(data, pos, end, ascii_fast, ascii_from, plain):
    """Whether the character at data[pos:end] is no space and copied as it is (ASCII or a `plain` character)."""
    byte = data[pos]
    if byte < 0x80:
        fast = ascii_fast[byte] == 2 or (ascii_fast[byte] == 1 and (pos + 1 == end or data[pos + 1] < 0x80))
        return fast and ascii_from[byte] < 0 and byte != SPACE
    if 0xE0 <= byte < 0xF0 and pos + 3 <= end:
        return plain[code_point_3(byte, data[pos + 1], data[pos + 2])]
    if 0xC2 <= byte < 0xE0 and pos + 2 <= end:
        return plain[code_point_2(byte, data[pos + 1])]
    return False


@compiled.jit()
def normalize_lines(data, line_starts, first, out, ends, units, replacements, replacement_lengths, ud_slots, ud_first,
                    ascii_fast, ascii_from, ascii_length, plain, char_nodes, char_matches, flags):
    """SentencePiece's normalisation of the lines data[line_starts[i]:line_starts[i + 1] - 1] from line `first`
    on, one after another into `out`, where each ends at ends[i]. Returns the number of lines, or the line at
    which `out` is too short (it is not grown here: an array that may be replaced in the loop costs it 20
    times its speed). One call normalises all the lines: a call's array arguments cost atomic reference
    counts (17% of the time on lines of 30 characters when it was one call a line)."""
    remove_extra, dummy_prefix, escape = flags[0], flags[1], flags[2]
    size = out.shape[0]
    n = ends[first - 1] if first else 0
    for line in range(first, line_starts.shape[0] - 1):
        pos, end = line_starts[line], line_starts[line + 1] - 1
        # Leading spaces; the table is not searched for a first character that is copied as it is (a call a line
        # with the table's arrays took 40% of the time on short Chinese lines).
        while remove_extra and pos < end and not _copied_not_space(data, pos, end, ascii_fast, ascii_from, plain):
            from_table, offset, length, consumed = _prefix(data, pos, end, units, replacements, replacement_lengths,
                                                           ud_slots, ud_first)
            if length != 1 or (replacements[offset] if from_table else data[offset]) != SPACE:
                break
            pos += consumed
        if pos >= end:
            ends[line] = n
            continue
        if n + 3 > size:
            return line
        begin = n
        if dummy_prefix:
            n = _put_escaped_space(out, n) if escape else _put_byte(out, n, SPACE)
        prev_space = remove_extra
        while pos < end:
            byte = data[pos]
            # (2: also before a character that is not ASCII, as in CJK text, where the table search cost
            # reference counts on its array arguments, 11% of the compiled time on Chinese lines)
            if byte < 0x80 and ascii_fast[byte] and (ascii_fast[byte] == 2 or pos + 1 == end or data[pos + 1] < 0x80):
                if n + 3 > size:
                    return line
                offset = ascii_from[byte]
                if offset < 0 and byte != SPACE:  # most of the text: a byte copied
                    out[n] = byte
                    n += 1
                    prev_space = False
                elif offset < 0:
                    if not prev_space:
                        n = _put_escaped_space(out, n) if escape else _put_byte(out, n, SPACE)
                    prev_space = remove_extra
                else:
                    if n + 3 * ascii_length[byte] > size:
                        return line
                    n, prev_space = _append(replacements, offset, ascii_length[byte], out, n, prev_space, escape)
                    prev_space = prev_space and remove_extra
                pos += 1
                continue
            if 0xE0 <= byte < 0xF0 and n + (end - pos) <= size:
                # A run of plain characters of three bytes (CJK, Thai, Hindi...) copied in a loop of its own,
                # with room for the rest of the line checked once and unsigned indices (numba fixes up a
                # negative signed one at every access).
                p, q, stop = np.uint64(pos), np.uint64(n), np.uint64(end)
                while p + np.uint64(3) <= stop:
                    b0, b1, b2 = data[p], data[p + np.uint64(1)], data[p + np.uint64(2)]
                    if b0 >> 4 != 0xE or not plain[code_point_3(b0, b1, b2)]:
                        break
                    out[q], out[q + np.uint64(1)], out[q + np.uint64(2)] = b0, b1, b2
                    p += np.uint64(3)
                    q += np.uint64(3)
                if p != pos:
                    pos, n, prev_space = np.int64(p), np.int64(q), False
                    continue
            node = -1  # where the table's search goes on after this character's bytes, if it begins an entry
            if 0xC2 <= byte < 0xF0:  # two or three bytes
                two = byte < 0xE0
                size_of = 2 if two else 3
                if pos + size_of <= end:
                    code = (code_point_2(byte, data[pos + 1]) if two else
                            code_point_3(byte, data[pos + 1], data[pos + 2]))
                    if plain[code]:
                        if n + 3 > size:
                            return line
                        for k in range(size_of):
                            out[n + k] = data[pos + k]
                        n += size_of
                        pos += size_of
                        prev_space = False
                        continue
                    node = char_nodes[code]
            if node >= 0:
                match = char_matches[code]
                found, value, _, _ = tries.darts_walk(units, node, data, pos, pos + size_of, end, match >> 32,
                                                      match & 0xFFFFFFFF)
                from_table = found > 0
                offset, length, consumed = (value, replacement_lengths[value], found) if from_table else (
                    pos, size_of, size_of)
            else:
                from_table, offset, length, consumed = _prefix(data, pos, end, units, replacements,
                                                               replacement_lengths, ud_slots, ud_first)
            if n + 3 * length > size:
                return line
            if from_table:
                n, prev_space = _append(replacements, offset, length, out, n, prev_space, escape)
            else:
                n, prev_space = _append(data, offset, length, out, n, prev_space, escape)
            pos += consumed
            prev_space = prev_space and remove_extra
        if remove_extra:  # trailing spaces
            while _ends_in_space(out, begin, n, escape):
                n -= 3 if escape else 1
        ends[line] = n
    return line_starts.shape[0] - 1


@compiled.jit()
def _ascii_tables(units, replacement_lengths, ud_first):
    """NormalizerTables.ascii_fast, ascii_from and ascii_length."""
    fast = np.zeros(128, dtype=np.uint8)
    from_ = np.full(128, -1, dtype=np.int64)
    length = np.ones(128, dtype=np.int64)
    key = np.zeros(2, dtype=np.uint8)
    for byte in range(128):
        key[0] = byte
        fast[byte] = 0 if ud_first[byte] else 2
        for c in range(256):
            key[1] = c
            if tries.darts_longest(units, key, 0, 2)[2] == 2:  # an entry begins with byte, c
                fast[byte] = 0 if c < 0x80 else min(fast[byte], 1)
        found, value, _ = tries.darts_longest(units, key, 0, 1)
        if found:
            from_[byte], length[byte] = value, replacement_lengths[value]
    return fast, from_, length


@compiled.jit()
def _character_tables(units, ud_first):
    """NormalizerTables.plain (the code points 0x80-0xFFFF whose UTF-8 bytes lead nowhere in the table),
    char_nodes and char_matches."""
    plain = np.zeros(1 << 16, dtype=np.bool_)
    nodes = np.full(1 << 16, -1, dtype=np.int64)
    matches = np.zeros(1 << 16, dtype=np.int64)
    key = np.zeros(3, dtype=np.uint8)
    for code in range(0x80, 1 << 16):
        if 0xD800 <= code < 0xE000:
            continue
        if code < 0x800:
            key[0], key[1], size = 0xC0 | (code >> 6), 0x80 | (code & 0x3F), 2
        else:
            key[0], key[1], key[2], size = 0xE0 | (code >> 12), 0x80 | ((code >> 6) & 0x3F), 0x80 | (code & 0x3F), 3
        length, value, walked, node = tries.darts_walk(units, tries.darts_root(units), key, 0, 0, size, 0, 0)
        plain[code] = length == 0 and walked < size and not ud_first[key[0]]
        if walked == size and not ud_first[key[0]]:
            nodes[code], matches[code] = node, length << 32 | value
    return plain, nodes, matches


def _charsmap_arrays(charsmap: bytes):
    """(Darts units, replacement strings, each offset's string length) of a precompiled charsmap: a uint32
    size of the units, the units, then the strings (normalizer.cc's DecodePrecompiledCharsMap)."""
    if not charsmap:  # (the identity rule) a table in which no byte leads anywhere: a walk reads units[byte], so
        # it has 256 units (one unit, as it was, was read far past its end); the root's offset 0, every other
        # unit's label bit 31, which no byte matches
        units = np.full(256, 1 << 31, dtype=np.uint32)
        units[0] = 0
        return units, np.zeros(1, dtype=np.uint8), np.zeros(1, dtype=np.int64)
    spm_model.check_charsmap(charsmap)  # read_model_proto's check, again for a model made in memory: the walks trust it
    size = int(np.frombuffer(charsmap[:4], dtype="<u4")[0])
    units = np.frombuffer(charsmap[4:4 + size], dtype="<u4").astype(np.uint32)
    replacements = np.frombuffer(charsmap[4 + size:] + b"\0", dtype=np.uint8).copy()
    nuls = np.flatnonzero(replacements == 0)
    offsets = np.arange(replacements.size)
    return units, replacements, nuls[np.searchsorted(nuls, offsets)] - offsets


def normalizer_tables(model) -> NormalizerTables:
    """The tables of a model read by spm_model.read_model_proto, its user-defined symbols those of type
    USER_DEFINED."""
    units, replacements, lengths = _charsmap_arrays(model.charsmap)
    symbols = [piece.encode("utf-8") for piece, _, kind in model.pieces if kind == USER_DEFINED]
    ud_slots = tries.build_double_array(symbols or [b"\0"], [len(s) for s in symbols] or [1])
    ud_first = np.zeros(256, dtype=bool)
    for symbol in symbols:
        ud_first[symbol[0]] = True
    ascii_fast, ascii_from, ascii_length = _ascii_tables(units, lengths, ud_first)
    flags = np.array([model.remove_extra_whitespaces, model.add_dummy_prefix, model.escape_whitespaces])
    return NormalizerTables(units, replacements, lengths, ud_slots, ud_first, ascii_fast, ascii_from,
                            ascii_length, *_character_tables(units, ud_first), flags)
