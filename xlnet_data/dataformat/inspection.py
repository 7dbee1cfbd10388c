"""Looking inside XLNet pretraining records: one example's structure and checks, and its text (dump's views;
statistics over many: stats.py; which records and their settings: selection.py). No TensorFlow.
"""

import dataclasses
import functools
from typing import Optional

import numpy as np

from xlnet_data.dataformat.records import FEATURES
from xlnet_data.dataformat.vocab import CLS_ID, SEP_ID, SPIECE_UNDERLINE

_SPACE = SPIECE_UNDERLINE
_COLOR_ON, _COLOR_OFF = "\x1b[1;33m", "\x1b[0m"
# A masked piece's markers: white square brackets, which text seldom holds (plain ones it often does:
# `[rɐˈsjijə[],]` could not be read); a text that holds them gets «…» instead (see render_pieces).
MASK_MARKERS = (("\u27e6", "\u27e7"), ("\u00ab\u00ab", "\u00bb\u00bb"))


@dataclasses.dataclass(frozen=True)
class TargetCheck:
    """The next-token check of one example's targets (see decode_example)."""

    checked: int = 0                  # positions whose target must be the next input
    ok: int = 0
    num_violations: int = 0
    violations: list = dataclasses.field(default_factory=list)  # (position, target, next input), first 50
    cls_ok: Optional[bool] = None     # the last two targets are <cls>
    a_last: Optional[int] = None      # A's and B's last positions: their targets follow in the stream
    b_last: Optional[int] = None
    a_next: Optional[int] = None      # those targets
    b_next: Optional[int] = None


@dataclasses.dataclass
class DecodedExample:
    """One example's structure, its checks, and (with a SentencePiece model) its pieces and text."""

    seq_len: int
    reuse_len: int
    label: int
    reverse: bool                     # a backward row of bi_data
    len_a: Optional[int]              # None when the layout is broken
    len_b: Optional[int]
    parts: dict                       # "memory", "a", "b" -> (begin, end) or None
    layout_ok: bool
    problems: list                    # one line per problem found
    target_check: TargetCheck
    num_masked: int
    num_masked_memory: int
    num_masked_ab: int
    spans: list                       # masked runs (begin, end) within each half
    input: np.ndarray
    target: np.ndarray
    seg_id: np.ndarray
    is_masked: np.ndarray             # bool
    pieces: Optional[list] = None
    target_pieces: Optional[list] = None
    text: Optional[dict] = None       # part -> text, masked pieces in ⟦markers⟧


@functools.cache
def piece_list(sp):
    """All pieces of a SentencePiece model as a list indexed by id (cached per model)."""
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def is_backward_row(record_index, bsz_per_host, num_core_per_host=1, bi_data=True):
    """Whether record `record_index` of a file holds a reversed (backward) row.

    Records are written batch by batch, row by row; with bi_data each core's half-batch of
    forward rows is followed by the same rows reversed (the original's `reverse`).
    """
    if not bi_data or not bsz_per_host:
        return False
    bsz_per_core = bsz_per_host // max(1, num_core_per_host or 1)
    half = max(1, bsz_per_core // 2)
    return (record_index % bsz_per_host // half) % 2 == 1


def masked_runs(mask):
    """Maximal runs of True in a 1-D bool array, as (begin, end) pairs."""
    mask = np.asarray(mask, dtype=bool)
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def render_pieces(pieces, mask, color=False):
    """Pieces back to text: '▁' becomes a space; a masked piece is kept whole in ⟦white brackets⟧ (in «« »» where a
    piece holds one, so that a marker is never the text's), coloured too with `color`."""
    out = []
    text = "".join(pieces)
    opening, closing = next((pair for pair in MASK_MARKERS if not any(mark in text for mark in pair)),
                            MASK_MARKERS[-1])
    for piece, masked in zip(pieces, mask):
        if masked:
            shown = f"{opening}{piece}{closing}"
            if color:
                shown = _COLOR_ON + shown + _COLOR_OFF
            out.append((" " if piece.startswith(_SPACE) else "") + shown)
        else:
            out.append(piece.replace(_SPACE, " "))
    return "".join(out).strip()


def decode_example(features, sp=None, reuse_len=None, reverse=False):
    """The structure of one example and the checks the spec implies; no printing.

    `features`: {name: int sequence} as read_examples yields. `sp`: a SentencePiece
    processor (or None: no pieces, no text). `reuse_len`: the memory length (default
    seq_len // 2, the only value the original accepts). `reverse`: a backward row of
    bi_data (its text is given in reading order, i.e. each part flipped back).

    Layout: input = mem[0:R] + A + <sep> + B + <sep> + <cls>; seg_id 0 for mem, A and
    the first <sep>, 1 for B and the second <sep>, 2 for <cls>.
    Targets: target[k] == input[k + 1] at every position up to B's second-to-last piece
    except A's last one: within each part, and also at the memory's last position
    (its target is A's first piece) and at A's <sep> (its target is B's first piece).
    A's and B's last targets are the tokens that follow them in the stream (not in the
    record); the last two targets are <cls>.
    """
    x = np.asarray(features["input"], dtype=np.int64)
    y = np.asarray(features["target"], dtype=np.int64)
    seg = np.asarray(features["seg_id"], dtype=np.int64)
    mask = np.asarray(features["is_masked"], dtype=np.int64).astype(bool)
    label = int(np.asarray(features["label"]).reshape(-1)[0])
    length = len(x)
    reuse = length // 2 if reuse_len is None else int(reuse_len)

    problems = []
    n0, n1, n2 = (int(np.count_nonzero(seg == v)) for v in (0, 1, 2))
    len_a, len_b = n0 - reuse - 1, n1 - 1
    layout_ok = (n2 == 1 and len_a >= 0 and len_b >= 0 and n0 + n1 + n2 == length
                 and np.array_equal(seg, np.repeat([0, 1, 2], [n0, n1, n2])))
    if not layout_ok:
        problems.append(f"seg_id is not {reuse}+|A|+1 zeros, |B|+1 ones and one 2 "
                        f"(zeros {n0}, ones {n1}, twos {n2})")
        parts = {"memory": (0, min(reuse, length)), "a": None, "b": None}
        len_a = len_b = None
    else:
        sep_a = reuse + len_a
        for pos, want, name in ((sep_a, SEP_ID, "<sep> after A"), (length - 2, SEP_ID, "<sep> after B"),
                                (length - 1, CLS_ID, "<cls>")):
            if x[pos] != want:
                problems.append(f"input[{pos}] = {int(x[pos])} where {name} belongs")
        parts = {"memory": (0, reuse), "a": (reuse, sep_a), "b": (sep_a + 1, length - 2)}

    check = TargetCheck()
    if layout_ok:
        free = [reuse + len_a - 1, length - 3]           # A's and B's last positions
        keep = np.ones(length - 2, dtype=bool)
        keep[[f for f in free if f >= 0]] = False
        positions = np.flatnonzero(keep)
        bad = positions[y[positions] != x[positions + 1]]
        check = TargetCheck(
            checked=int(len(positions)), ok=int(len(positions) - len(bad)), num_violations=int(len(bad)),
            violations=[(int(k), int(y[k]), int(x[k + 1])) for k in bad[:50]],
            cls_ok=bool(y[length - 2] == CLS_ID and y[length - 1] == CLS_ID),
            a_last=free[0] if len_a > 0 else None, b_last=free[1] if len_b > 0 else None,
            a_next=int(y[free[0]]) if len_a > 0 else None, b_next=int(y[free[1]]) if len_b > 0 else None)
        if not check.cls_ok:
            problems.append("the last two targets are not <cls>")

    halves = ((0, reuse), (reuse, length))
    spans = []
    for low, high in halves:
        spans.extend((low + b, low + e) for b, e in masked_runs(mask[low:high]))

    decoded = DecodedExample(
        seq_len=length, reuse_len=reuse, label=label, reverse=bool(reverse), len_a=len_a, len_b=len_b,
        parts=parts, layout_ok=layout_ok, problems=problems, target_check=check, num_masked=int(mask.sum()),
        num_masked_memory=int(mask[:reuse].sum()), num_masked_ab=int(mask[reuse:].sum()), spans=spans,
        input=x, target=y, seg_id=seg, is_masked=mask)
    if sp is not None:
        table = piece_list(sp)

        def pieces(ids):
            return [table[i] if i < len(table) else f"<id {i}>" for i in ids.tolist()]

        decoded.pieces, decoded.target_pieces = pieces(x), pieces(y)
        decoded.text = {name: part_text(decoded, name) for name in ("memory", "a", "b")}
    return decoded


def part_pieces(decoded, name):
    """(pieces, mask, (begin, end)) of part 'memory', 'a' or 'b' in reading order, with A's
    and B's <sep> (and B's <cls>) appended; None when the layout does not have the part."""
    span = decoded.parts[name]
    if span is None or decoded.pieces is None:
        return None
    begin, end = span
    pieces = decoded.pieces[begin:end]
    mask = decoded.is_masked[begin:end].tolist()
    if decoded.reverse:
        pieces, mask = pieces[::-1], mask[::-1]
    tail = {"memory": 0, "a": 1, "b": 2}[name]
    pieces = pieces + decoded.pieces[end:end + tail]
    mask = mask + decoded.is_masked[end:end + tail].tolist()
    return pieces, mask, span


def part_text(decoded, name, color=False):
    """Text of one part in reading order, masked pieces in ⟦markers⟧ (see render_pieces)."""
    got = part_pieces(decoded, name)
    return None if got is None else render_pieces(got[0], got[1], color=color)


def example_to_json(decoded, index=None, file=None, record=None):
    """One JSON-ready object: every feature as written, the pieces, the parts and checks."""
    obj = {}
    if index is not None:
        obj["index"] = index
    if file is not None:
        obj["file"] = file
    if record is not None:
        obj["record"] = record
    for name in FEATURES:
        values = getattr(decoded, name) if name != "label" else [decoded.label]
        obj[name] = np.asarray(values, dtype=np.int64).tolist()
    obj["input_pieces"] = decoded.pieces
    obj["target_pieces"] = decoded.target_pieces
    obj["direction"] = "backward" if decoded.reverse else "forward"
    obj["reuse_len"] = decoded.reuse_len
    obj["len_a"], obj["len_b"] = decoded.len_a, decoded.len_b
    obj["parts"] = {k: (list(v) if v else None) for k, v in decoded.parts.items()}
    obj["text"] = decoded.text
    obj["num_masked"] = decoded.num_masked
    obj["spans"] = [list(s) for s in decoded.spans]
    check = decoded.target_check
    obj["target_check"] = {"checked": check.checked, "ok": check.ok,
                           "violations": [list(v) for v in check.violations],
                           "cls_ok": check.cls_ok, "a_next": check.a_next, "b_next": check.b_next}
    obj["problems"] = decoded.problems
    return obj


def format_example(decoded, index=None, where=None, color=False, row=None):
    """The text view of one decoded example, as lines joined by newlines."""
    label = decoded.label
    head = f"#{index}" if index is not None else "#"
    if where:
        head += f"  {where}"
    head += f"  label {label} ({'B continues A' if label == 1 else 'B is random'})"
    if row is not None:
        head += f"  row {row}"
    if decoded.reverse:
        head += "  backward (each part shown flipped into reading order)"
    lines = [head]
    names = {"memory": "memory", "a": "A", "b": "B"}
    for name, title in names.items():
        span = decoded.parts[name]
        if span is None:
            continue
        rng = f"[{span[0]},{span[1]})"
        if decoded.pieces is not None:
            body = part_text(decoded, name, color=color)
        else:
            ids = decoded.input[span[0]:span[1]].tolist()
            body = " ".join(str(i) for i in (ids[::-1] if decoded.reverse else ids))
        lines.append(f"  {title:<6} {rng:<10} {span[1] - span[0]:>4} | {body}")
    spans = decoded.spans
    lines.append(f"  masked {decoded.num_masked} (memory {decoded.num_masked_memory}, "
                 f"A/B {decoded.num_masked_ab}) in {len(spans)} spans")
    check = decoded.target_check
    pieces, target_pieces = decoded.pieces, decoded.target_pieces

    def show(pos, of_target=True):
        if pos is None:
            return "-"
        if pieces is None:
            return str(int((decoded.target if of_target else decoded.input)[pos]))
        return repr((target_pieces if of_target else pieces)[pos])

    if decoded.layout_ok:
        status = "ok" if not check.num_violations and check.cls_ok else "FAIL"
        line = (f"  target {status}: {check.ok}/{check.checked} next-token positions"
                f", last two <cls> {'ok' if check.cls_ok else 'WRONG'}"
                f"; after A: {show(check.a_last)}, after B: {show(check.b_last)}")
        lines.append(line)
        for pos, _, _ in check.violations[:10]:
            lines.append(f"    target[{pos}] = {show(pos)} but input[{pos + 1}] = {show(pos + 1, False)}")
        if check.num_violations > 10:
            lines.append(f"    … {check.num_violations - 10} more")
    for problem in decoded.problems:
        lines.append(f"  PROBLEM: {problem}")
    return "\n".join(lines)
