"""Our own encoder for SentencePiece unigram models: the ids of sentencepiece 0.2's `encode`, exactly, faster.

A line is normalised as SentencePiece does (datagen/spm_normalize.py), then the best segmentation is found
as its optimized Viterbi (unigram_model.cc's EncodeOptimized) finds it, the same float32 sums and the same
order of comparisons, so that ties are broken alike:
- starts in ascending order, one character at a time; at each start the pieces that begin there by
  increasing length; then, when no piece is exactly the one character there, an unknown piece for it;
- a candidate replaces the best path ending where it ends only when its score is strictly greater;
- a piece's score is its float32 score, a user-defined symbol's 0.1 * (its UTF-8 length - 1), an unknown's
  the lowest score of a normal piece - 10; the path's score is their float32 sum;
- consecutive unknown pieces become one <unk>; a run of characters that occur in no piece (Chinese to XLNet's
  English model) can only be such unknowns, so its scores are summed in one loop and only its end is written.
Models with a feature this does not reproduce (unigram_unsupported says which) are left to SentencePiece.
A batch of lines is one call into compiled code, with scratch arrays kept from call to call.
"""

import dataclasses

import numpy as np

from xlnet_data.common import compiled
from xlnet_data.dataformat import spm_model
from xlnet_data.datagen import spm_normalize, tries
from xlnet_data.datagen.spm_normalize import one_char_len
from xlnet_data.datagen.utf8_lines import Utf8Lines, code_point_2, code_point_3

UNK_PENALTY = np.float32(10.0)  # unigram_model.cc's kUnkPenalty
# sentencepiece 0.2.3 shifts the scores of its frontier once they pass about 1e5 in size, a rule we have not
# reproduced: a line whose path's score passes this (long lines: ~2,000 pieces and more) is left to it.
LARGEST_SCORE = 5e4
USER_DEFINED_BONUS = 0.1  # a user-defined symbol's score per UTF-8 byte after its first
# str lines are encoded this many at a time, so that their UTF-8 stays in the cache and in memory the allocator
# has mapped already: 200,000 Chinese lines joined and encoded at once took 19 to 33 ns a token (page faults),
# and the whole encoding 57-72; in batches of 1,024 to 16,384 lines, 54-57.
STR_BATCH = 4096


@compiled.jit(inline="always")
def _offer(at, candidate, start, piece, best_score, best_start, best_id, largest):
    """A piece from `start` to `at` whose path scores `candidate`: kept where it beats the best path ending there
    (of equals the first stays, as in SentencePiece). Returns the largest size of a score written."""
    if best_start[at] == -1 or candidate > best_score[at]:
        best_score[at], best_start[at], best_id[at] = candidate, start, piece
        return max(largest, abs(candidate))
    return largest


@compiled.jit(inline="always")
def _viterbi(norm, begin, size, slots, start_nodes, scores, unk_id, unk_score, pieceless, best_score, best_start,
             best_id):
    """The best path over norm[begin:begin + size] into best_*[0:size + 1] (each end's last piece, its start, the score);
    returns the largest size of a score written (ends inside a character keep the scratch's old values)."""
    # Indices are cast to np.uint64 where the loops read and write: numba fixes up a negative signed index on
    # every access, and without it the walk runs 1.1x as fast on English (the casts cost nothing).
    largest = np.float32(0)
    best_start[:size + 1] = -1
    best_score[0] = 0
    root_base = tries.slot_base(slots[0])
    start = 0
    while start < size:
        here = np.uint64(start)
        till_here = best_score[here]
        pos = np.uint64(begin + start)
        lead = np.int64(norm[pos])
        char_len = min(one_char_len(lead), size - start)
        has_single = False
        node, base, key_from = 0, root_base, start
        if char_len == 3:
            # A character of three bytes (CJK...) in one load (tries.three_byte_nodes): every start at this
            # character walks the same three bytes from the root (the walk's dependent loads of slots were most
            # of the encoder's time on Chinese).
            second, third = norm[pos + np.uint64(1)], norm[pos + np.uint64(2)]
            first = start_nodes[code_point_3(lead, second, third)] if (
                (second & 0xC0) | ((third & 0xC0) >> 2)) == 0xA0 else -2  # -2: not UTF-8, a byte at a time
            if first == -1:  # no piece begins with it
                key_from = size
            elif first >= 0:
                node, base, key_from = tries.slot_check(first), tries.slot_base(first), start + 3
                if start + 9 <= size:
                    # The first slot that the next start's walk reads after its first character's node, asked for
                    # a start ahead: it is in the cache when that walk needs it (a walk's loads depend on each
                    # other, so each one it waits for is waited for in full).
                    ahead = pos + np.uint64(3)
                    if norm[ahead] >> 4 == 0xE:
                        after = start_nodes[code_point_3(norm[ahead], norm[ahead + np.uint64(1)],
                                                         norm[ahead + np.uint64(2)])]
                        if after >= 0:
                            tries.prefetch(slots, tries.slot_base(after) + np.int64(norm[ahead + np.uint64(3)]))
                piece = tries.slot_value(first)
                if piece >= 0:
                    has_single = True
                    largest = _offer(np.uint64(key_from), scores[piece] + till_here, start, piece, best_score,
                                     best_start, best_id, largest)
        for key_pos in range(key_from, size):
            child = base + np.int64(norm[np.uint64(begin + key_pos)])
            slot = slots[child]
            if tries.slot_check(slot) != node:
                break
            node, base = child, tries.slot_base(slot)
            piece = tries.slot_value(slot)
            if piece >= 0:
                end = key_pos + 1
                largest = _offer(np.uint64(end), scores[piece] + till_here, start, piece, best_score, best_start,
                                 best_id, largest)
                if end - start == char_len:
                    has_single = True
        if not has_single:
            # A run of characters of 2 or 3 bytes that occur in no piece (Chinese to XLNet's English model): no
            # piece starts, ends or passes inside it, so the only path through it is its unknowns, one a character,
            # merged into one <unk>. Their scores are summed here in order (float32, as one end at a time would)
            # and only the run's end is written. Looked for only here, where no piece is the character at `start`
            # (a character some piece holds is never pieceless, and the walk above writes nothing for one that
            # is): before the walk, its decoding was paid at every character of Chinese text.
            candidate, at, stop = till_here, np.uint64(begin) + here, np.uint64(begin + size)
            while at < stop:
                lead = np.int64(norm[at])
                if 0xE0 <= lead < 0xF0 and at + np.uint64(3) <= stop:
                    code = code_point_3(lead, norm[at + np.uint64(1)], norm[at + np.uint64(2)])
                    length = np.uint64(3)
                elif 0xC2 <= lead < 0xE0 and at + np.uint64(2) <= stop:
                    code = code_point_2(lead, norm[at + np.uint64(1)])
                    length = np.uint64(2)
                else:
                    break
                if not pieceless[code]:
                    break
                candidate += unk_score
                largest = max(largest, abs(candidate))
                at += length
            at -= np.uint64(begin)
            if at != here:
                merged = start > 0 and best_id[here] == unk_id
                best_score[at], best_start[at] = candidate, best_start[here] if merged else start
                best_id[at] = unk_id
                start = np.int64(at)
                continue
            at = np.uint64(start + char_len)
            candidate = unk_score + till_here
            if best_start[at] == -1 or candidate > best_score[at]:
                # After an unknown, one unknown from where that one starts: the path's consecutive unknowns
                # merged here (the best path to `start` is final), so _backtrack walks one node a merged run
                # (its walk was 16% of the compiled time on Chinese text, mostly unknown to XLNet's model).
                merged = start > 0 and best_id[here] == unk_id
                best_score[at], best_start[at] = candidate, best_start[here] if merged else start
                best_id[at] = unk_id
                largest = max(largest, abs(candidate))
        start += char_len
    return largest


@compiled.jit(inline="always")
def _backtrack(size, best_start, best_id, path, out, at):
    """The best path's ids written at out[at:] (its consecutive unknowns merged by _viterbi); returns their
    number."""
    count, end = 0, size
    while end > 0:
        path[count] = best_id[end]
        count += 1
        end = best_start[end]
    for i in range(count):
        out[at + i] = path[count - 1 - i]
    return count


@compiled.jit()
def _encode_lines(data, line_starts, slots, start_nodes, scores, unk_id, unk_score, pieceless, norm_tables, scratch,
                  out):
    """Ids of the lines data[line_starts[i]:line_starts[i + 1] - 1] (each followed by one separator byte):
    (ids in `out`, grown as needed; the number of ids of each line, -1 for a line left to SentencePiece
    (LARGEST_SCORE); the scratch arrays, grown)."""
    (units, replacements, replacement_lengths, ud_slots, ud_first, ascii_fast, ascii_from, ascii_length, plain,
     char_nodes, char_matches, flags) = norm_tables
    norm, best_score, best_start, best_id, path = scratch
    num_lines = line_starts.shape[0] - 1
    # All the lines normalised in one call (normalize_lines says why), one after another in `norm`; then each
    # line's Viterbi.
    norm_ends = np.empty(num_lines, dtype=np.int64)  # where each line's normalised bytes end in `norm`
    done = 0
    while True:
        done = spm_normalize.normalize_lines(data, line_starts, done, norm, norm_ends, units, replacements,
                                             replacement_lengths, ud_slots, ud_first, ascii_fast, ascii_from,
                                             ascii_length, plain, char_nodes, char_matches, flags)
        if done == num_lines:
            break
        norm = tries.grown(norm, 2 * norm.shape[0] + 3 * (line_starts[done + 1] - line_starts[done]), 0)
    longest = 0
    for line in range(num_lines):
        longest = max(longest, norm_ends[line] - (norm_ends[line - 1] if line else 0))
    if best_start.shape[0] < longest + 1:
        best_score, best_start = tries.grown(best_score, longest + 1, 0), tries.grown(best_start, longest + 1, 0)
        best_id, path = tries.grown(best_id, longest + 1, 0), tries.grown(path, longest + 1, 0)
    out = tries.grown(out, norm_ends[-1] if num_lines else 0, 0)  # no more ids than normalised bytes
    lengths = np.empty(num_lines, dtype=np.int64)
    total = begin = 0
    for line in range(num_lines):
        size = norm_ends[line] - begin
        largest = _viterbi(norm, begin, size, slots, start_nodes, scores, unk_id, unk_score, pieceless, best_score,
                           best_start, best_id)
        begin = norm_ends[line]
        if largest > LARGEST_SCORE:
            lengths[line] = -1
            continue
        count = _backtrack(size, best_start, best_id, path, out, total)
        lengths[line] = count
        total += count
    return out, total, lengths, (norm, best_score, best_start, best_id, path)


def unigram_unsupported(model: spm_model.SentencePieceModel):
    """Why our encoder cannot reproduce SentencePiece for `model` (a line), or None when it can."""
    if model.model_type != spm_model.UNIGRAM:
        return f"a {spm_model.MODEL_TYPE_NAMES.get(model.model_type, model.model_type)} model, not unigram"
    if model.byte_fallback:
        return "byte fallback"
    if model.treat_whitespace_as_suffix:
        return "treat_whitespace_as_suffix"
    kinds = {kind for _, _, kind in model.pieces}
    if kinds - {spm_model.NORMAL, spm_model.UNKNOWN, spm_model.CONTROL, spm_model.USER_DEFINED, spm_model.UNUSED}:
        return "pieces of a type other than normal, unknown, control, user-defined and unused"
    if sum(kind == spm_model.UNKNOWN for kind in kinds) != 1 or not any(kind == spm_model.NORMAL for kind in kinds):
        return "no <unk> or no normal piece"
    return None


class UnigramEncoder:
    """SentencePiece's ids of lines of text for a unigram model (unigram_unsupported(model) is None), from
    the model file's bytes; the rare lines of LARGEST_SCORE are encoded by SentencePiece."""

    def __init__(self, model_bytes: bytes):
        import sentencepiece as spm
        self._sp = spm.SentencePieceProcessor(model_proto=model_bytes)
        model = spm_model.read_model_proto(model_bytes)
        keys, ids = [], []
        scores = np.zeros(len(model.pieces), dtype=np.float32)
        for i, (piece, score, kind) in enumerate(model.pieces):
            if kind in (spm_model.NORMAL, spm_model.USER_DEFINED):
                keys.append(piece.encode("utf-8"))
                ids.append(i)
            scores[i] = USER_DEFINED_BONUS * (len(piece.encode("utf-8")) - 1) if kind == spm_model.USER_DEFINED else score
            if kind == spm_model.UNKNOWN:
                self._unk_id = i
        self._slots = tries.build_double_array(keys, ids)
        self._start_nodes = tries.three_byte_nodes(self._slots)
        self._pieceless = np.ones(0x10000, dtype=np.bool_)  # the characters of 2 or 3 bytes that occur in no piece
        self._pieceless[:0x80] = False
        self._pieceless[[ord(c) for c in set("".join(key.decode("utf-8") for key in keys)) if ord(c) < 0x10000]] = False
        self._scores = scores
        min_score = min(np.float32(score) for _, score, kind in model.pieces if kind == spm_model.NORMAL)
        self._unk_score = np.float32(min_score - UNK_PENALTY)
        tables = spm_normalize.normalizer_tables(model)
        self._norm_tables = tuple(getattr(tables, field.name) for field in dataclasses.fields(tables))
        self._scratch = (np.empty(4096, dtype=np.uint8), np.empty(4096, dtype=np.float32),
                         np.empty(4096, dtype=np.int32), np.empty(4096, dtype=np.int32),
                         np.empty(4096, dtype=np.int32))
        self._out = np.empty(1 << 16, dtype=np.int32)

    def encode_ids(self, texts):
        """The ids of each of `texts` (str, or a Utf8Lines) as one flat int32 array, and the number of ids of
        each text."""
        if not isinstance(texts, Utf8Lines) and len(texts) > STR_BATCH:
            parts = [self.encode_ids(texts[i:i + STR_BATCH]) for i in range(0, len(texts), STR_BATCH)]
            return np.concatenate([ids for ids, _ in parts]), np.concatenate([lengths for _, lengths in parts])
        lines = texts if isinstance(texts, Utf8Lines) else Utf8Lines.of(texts)
        out, total, lengths, self._scratch = _encode_lines(
            lines.data, lines.line_starts, self._slots, self._start_nodes, self._scores, self._unk_id, self._unk_score,
            self._pieceless, self._norm_tables, self._scratch, self._out)
        self._out = out
        flat = out[:total].copy()
        left = np.flatnonzero(lengths < 0)
        if left.size:
            flat, lengths = self._spliced(flat, lengths, left, lines)
        return flat, lengths

    def _spliced(self, flat, lengths, left, lines):
        """`flat` with SentencePiece's ids of the lines `left` put in their places."""
        lengths[left] = 0
        parts = np.split(flat, np.cumsum(lengths)[:-1])
        for i, ids in zip(left.tolist(), self._sp.encode([lines.line(i) for i in left.tolist()], num_threads=1)):
            parts[i] = np.asarray(ids, dtype=np.int32)
            lengths[i] = len(ids)
        return np.concatenate(parts), lengths
