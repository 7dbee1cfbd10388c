"""Looking inside XLNet pretraining records: one example's structure and checks, its text, statistics over
many (dump's views; which records and their settings: selection.py). No TensorFlow.
"""

import dataclasses
import functools
from typing import Optional

import numpy as np

from xlnet_data.dataformat.records import FEATURES
from xlnet_data.dataformat.vocab import CLS_ID, EOD_ID, EOP_ID, SEP_ID, SPIECE_UNDERLINE, UNK_ID

_SPACE = SPIECE_UNDERLINE
_COLOR_ON, _COLOR_OFF = "\x1b[1;33m", "\x1b[0m"


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
    text: Optional[dict] = None       # part -> text, masked pieces in [brackets]


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
    """Pieces back to text: '▁' becomes a space; a masked piece is kept whole in [brackets]."""
    out = []
    for piece, masked in zip(pieces, mask):
        if masked:
            shown = f"[{piece}]"
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
    """Text of one part in reading order, masked pieces in [brackets] (see render_pieces)."""
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


def compute_stats(examples, start_table=None, bsz_per_host=None):
    """Statistics over decoded examples (decode_example's, decoded without sp).

    `start_table`: bool array over ids, True where the piece starts a word
    (vocab.start_piece_table); without it the word-level numbers are None.
    Spans are maximal runs of masked positions within each mask half (memory;
    A <sep> B <sep> <cls>), taken in reading order — flipped for backward rows, as the
    original's sampler saw them. A span's length in words = the word starts inside it,
    plus one if it begins inside a word. A span cuts a word when its first piece is not a
    word start or the piece after it (in its half) is not one.
    """
    count = 0
    labels = {0: 0, 1: 0}
    len_a, len_b = [], []
    masked, masked_mem, masked_ab = [], [], []
    span_pieces, span_words = {}, {}
    spans_total = spans_cut = spans_at_start = 0
    eod = eop = eod_masked = eop_masked = 0
    bad_records = bad_positions = layout_bad = checked_positions = 0
    backward = 0
    for ex in examples:
        count += 1
        labels[ex.label] = labels.get(ex.label, 0) + 1
        backward += ex.reverse
        if ex.layout_ok:
            len_a.append(ex.len_a)
            len_b.append(ex.len_b)
        else:
            layout_bad += 1
        check = ex.target_check
        checked_positions += check.checked
        if check.num_violations or check.cls_ok is False or ex.problems:
            bad_records += 1
        bad_positions += check.num_violations
        masked.append(ex.num_masked)
        masked_mem.append(ex.num_masked_memory)
        masked_ab.append(ex.num_masked_ab)
        x, mask = ex.input, ex.is_masked
        eod += int(np.count_nonzero(x == EOD_ID))
        eop += int(np.count_nonzero(x == EOP_ID))
        eod_masked += int(np.count_nonzero((x == EOD_ID) & mask))
        eop_masked += int(np.count_nonzero((x == EOP_ID) & mask))
        reuse = ex.reuse_len
        for low, high in ((0, reuse), (reuse, len(x))):
            ids, m = x[low:high], mask[low:high]
            if ex.reverse:
                ids, m = ids[::-1], m[::-1]
            runs = masked_runs(m)
            spans_total += len(runs)
            if not runs:
                continue
            starts = None
            if start_table is not None:
                starts = start_table[np.clip(ids, 0, len(start_table) - 1)]
                cum = np.concatenate(([0], np.cumsum(starts)))
            for b, e in runs:
                span_pieces[e - b] = span_pieces.get(e - b, 0) + 1
                if starts is not None:
                    begins_inside = not starts[b]
                    words = int(cum[e] - cum[b]) + int(begins_inside)
                    span_words[words] = span_words.get(words, 0) + 1
                    spans_at_start += not begins_inside
                    if begins_inside or (e < len(ids) and not starts[e]):
                        spans_cut += 1

    def summary(values):
        if not values:
            return None
        arr = np.asarray(values)
        return {"min": int(arr.min()), "mean": float(arr.mean()), "max": int(arr.max())}

    have_words = start_table is not None
    return {
        "count": count,
        "bsz_per_host": bsz_per_host,
        "batches": (count / bsz_per_host) if bsz_per_host else None,
        "backward_rows": backward,
        "labels": labels,
        "label1_share": (labels.get(1, 0) / count) if count else None,
        "len_a": summary(len_a), "len_b": summary(len_b),
        "masked": summary(masked), "masked_memory": summary(masked_mem), "masked_ab": summary(masked_ab),
        "spans": spans_total,
        "spans_per_example": (spans_total / count) if count else None,
        "span_pieces": dict(sorted(span_pieces.items())),
        "span_words": dict(sorted(span_words.items())) if have_words else None,
        "spans_cutting_words": spans_cut if have_words else None,
        "cut_share": (spans_cut / spans_total if spans_total else 0.0) if have_words else None,
        "start_share": (spans_at_start / spans_total if spans_total else 0.0) if have_words else None,
        "eod": eod, "eop": eop, "eod_masked": eod_masked, "eop_masked": eop_masked,
        "layout_problems": layout_bad, "records_failing_checks": bad_records,
        "target_positions_checked": checked_positions, "target_violations": bad_positions,
    }


class UnkCounter:
    """<unk> among the text pieces (ids 0 and above <eop>) of the examples' inputs, per records file."""

    def __init__(self):
        self.per_file = {}  # path -> {"unk", "pieces"}

    def add(self, path, input_ids):
        counts = self.per_file.setdefault(path, {"unk": 0, "pieces": 0})
        unk = int(np.count_nonzero(input_ids == UNK_ID))
        counts["unk"] += unk
        counts["pieces"] += unk + int(np.count_nonzero(input_ids > EOP_ID))


def format_stats(stats):
    """The statistics as a plain-text table."""
    rows = []
    n = stats["count"]

    def add(name, value):
        rows.append((name, value))

    add("records", f"{n}")
    if "keep_accents" in stats:
        add("keep_accents", stats["keep_accents"])
    for path, counts in stats.get("unk_per_file", {}).items():
        share = 100 * counts["unk"] / counts["pieces"] if counts["pieces"] else 0.0
        add("<unk> in input", f"{counts['unk']} of {counts['pieces']} pieces ({share:.3f}%)  {path}")
    if stats["batches"] is not None:
        whole = "" if n % stats["bsz_per_host"] == 0 else "  (not a whole number!)"
        noted = stats.get("record_info_num_batch")
        noted = f"; record_info: {noted}" if noted is not None else ""
        add("batches", f"{stats['batches']:g}  (bsz_per_host {stats['bsz_per_host']}{noted}){whole}")
    if stats["backward_rows"]:
        add("backward rows", f"{stats['backward_rows']}")
    if n:
        l1, l0 = stats["labels"].get(1, 0), stats["labels"].get(0, 0)
        add("label 1 (B continues A)", f"{l1}  ({100 * l1 / n:.1f}%)")
        add("label 0 (B random)", f"{l0}  ({100 * l0 / n:.1f}%)")
    for key, title in (("len_a", "A length"), ("len_b", "B length"), ("masked", "masked per example"),
                       ("masked_memory", "  in memory"), ("masked_ab", "  in A/B")):
        s = stats[key]
        if s:
            add(title, f"min {s['min']}  mean {s['mean']:.2f}  max {s['max']}")
    add("masked spans", f"{stats['spans']}" + (f"  ({stats['spans_per_example']:.2f} per example)" if n else ""))
    if stats["cut_share"] is not None:
        add("spans cutting a word", f"{stats['spans_cutting_words']}  ({100 * stats['cut_share']:.1f}%)")
        add("spans starting a word", f"{100 * stats['start_share']:.1f}%")
    add("<eod> in input", f"{stats['eod']}  (masked {stats['eod_masked']})")
    add("<eop> in input", f"{stats['eop']}  (masked {stats['eop_masked']})")
    add("target positions checked", f"{stats['target_positions_checked']}")
    add("target violations", f"{stats['target_violations']}")
    add("records failing checks", f"{stats['records_failing_checks']}"
        + (f"  (layout {stats['layout_problems']})" if stats["layout_problems"] else ""))
    width = max(len(r[0]) for r in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]

    pieces, words = stats["span_pieces"], stats["span_words"]
    lengths = sorted(set(pieces) | set(words or {}))
    if lengths:
        total_p = sum(pieces.values()) or 1
        total_w = sum((words or {}).values()) or 1
        lines.append("")
        head = f"{'span length':>11}  {'in pieces':>16}"
        if words is not None:
            head += f"  {'in words':>16}"
        lines.append(head)
        for k in lengths:
            p = pieces.get(k, 0)
            row = f"{k:>11}  {p:>8} {100 * p / total_p:6.1f}%"
            if words is not None:
                w = words.get(k, 0)
                row += f"  {w:>8} {100 * w / total_w:6.1f}%"
            lines.append(row)
    return "\n".join(lines)


def plot_stats(stats, path):
    """Draws the span-length histograms (pieces, words) into an image file. Needs matplotlib."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("span length in pieces", stats["span_pieces"])]
    if stats["span_words"] is not None:
        panels.append(("span length in words", stats["span_words"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.5), squeeze=False)
    for ax, (title, hist) in zip(axes[0], panels):
        keys = sorted(hist)
        ax.bar(keys, [hist[k] for k in keys], color="#4c72b0")
        ax.set_title(title)
        ax.set_xlabel("length")
        ax.set_ylabel("spans")
        ax.set_xticks(keys)
    fig.suptitle(f"{stats['count']} records, {stats['spans']} masked spans")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
