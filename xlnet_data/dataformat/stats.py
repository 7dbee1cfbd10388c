"""Statistics over many decoded examples (`dump --stats`): labels, A/B lengths, masks, masked spans in pieces
and in words, <eod>/<eop>, the target checks, <unk> per records file; as a table or a plot. No TensorFlow.
"""

import numpy as np

from xlnet_data.dataformat.inspection import masked_runs
from xlnet_data.dataformat.vocab import EOD_ID, EOP_ID, UNK_ID


def table_starts(start_table):
    """starts_of for a word-start table over ids (vocab.start_piece_table): the original's rule."""
    return lambda ids: start_table[np.clip(ids, 0, len(start_table) - 1)]


def _halves(ex):
    """An example's two mask halves (memory; A <sep> B <sep> <cls>) as (ids, mask) in reading order: flipped for
    backward rows, as the original's sampler saw them."""
    x, mask = ex.input, ex.is_masked
    direction = -1 if ex.reverse else 1
    for low, high in ((0, ex.reuse_len), (ex.reuse_len, len(x))):
        yield x[low:high][::direction], mask[low:high][::direction]


class _SpanCounts:
    """Masked spans counted in pieces and, with `starts_of` (ids in reading order -> a bool each: starts a word),
    in words (see compute_stats); and the share of text pieces that can start a span."""

    def __init__(self, starts_of):
        self.starts_of = starts_of
        self.pieces, self.words = {}, {}
        self.total = self.cut = self.at_start = 0
        self.text_pieces = self.start_pieces = 0

    def add(self, ids, mask):
        """The spans of one mask half (`ids`, `mask` in reading order)."""
        runs = masked_runs(mask)
        self.total += len(runs)
        starts = None
        if self.starts_of is not None:
            starts = self.starts_of(ids)
            text = (ids > EOP_ID) | (ids == UNK_ID)
            self.text_pieces += int(np.count_nonzero(text))
            self.start_pieces += int(np.count_nonzero(starts & text))
            cum = np.concatenate(([0], np.cumsum(starts)))
        for b, e in runs:
            self.pieces[e - b] = self.pieces.get(e - b, 0) + 1
            if starts is not None:
                begins_inside = not starts[b]
                words = int(cum[e] - cum[b]) + int(begins_inside)
                self.words[words] = self.words.get(words, 0) + 1
                self.at_start += not begins_inside
                if begins_inside or (e < len(ids) and not starts[e]):
                    self.cut += 1

    def stats(self, count):
        have_words = self.starts_of is not None
        return {
            "piece_start_share": (self.start_pieces / self.text_pieces if self.text_pieces else 0.0) if have_words
            else None,
            "spans": self.total,
            "spans_per_example": (self.total / count) if count else None,
            "span_pieces": dict(sorted(self.pieces.items())),
            "span_words": dict(sorted(self.words.items())) if have_words else None,
            "spans_cutting_words": self.cut if have_words else None,
            "cut_share": (self.cut / self.total if self.total else 0.0) if have_words else None,
            "start_share": (self.at_start / self.total if self.total else 0.0) if have_words else None,
        }


def _summary(values):
    if not values:
        return None
    arr = np.asarray(values)
    return {"min": int(arr.min()), "mean": float(arr.mean()), "max": int(arr.max())}


def compute_stats(examples, start_table=None, bsz_per_host=None, starts_of=None):
    """Statistics over decoded examples (decode_example's, decoded without sp).

    Word starts: `starts_of` (ids in reading order -> bool each, e.g. a words.WordStarts), or `start_table`,
    a bool array over ids, True where the piece starts a word (vocab.start_piece_table); without either the
    word-level numbers are None. piece_start_share is the share of text pieces that can start a span.
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
    spans = _SpanCounts(starts_of or (table_starts(start_table) if start_table is not None else None))
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
        for half in _halves(ex):
            spans.add(*half)
    return {
        "count": count,
        "bsz_per_host": bsz_per_host,
        "batches": (count / bsz_per_host) if bsz_per_host else None,
        "backward_rows": backward,
        "labels": labels,
        "label1_share": (labels.get(1, 0) / count) if count else None,
        "len_a": _summary(len_a), "len_b": _summary(len_b),
        "masked": _summary(masked), "masked_memory": _summary(masked_mem), "masked_ab": _summary(masked_ab),
        **spans.stats(count),
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


class WordCounter:
    """Per records file: the share of text pieces that can start a span and the share of masked spans that cut a
    word, by `starts_of`'s reckoning (a segmenter's words with create --word_boundaries, else the original's)."""

    def __init__(self, starts_of):
        self.starts_of = starts_of
        self.counts = {}  # path -> _SpanCounts

    def add(self, path, ex):
        counts = self.counts.setdefault(path, _SpanCounts(self.starts_of))
        for half in _halves(ex):
            counts.add(*half)

    @property
    def per_file(self):
        return {path: {key: value for key, value in counts.stats(0).items()
                       if key in ("piece_start_share", "spans", "spans_cutting_words", "cut_share")}
                for path, counts in self.counts.items()}


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
        add("pieces that can start", f"{100 * stats['piece_start_share']:.1f}% (of text pieces, a span)")
    if stats.get("word_boundaries"):
        add("word boundaries", stats["word_boundaries"])
    for path, counts in stats.get("words_per_file", {}).items():
        add("  in a file", f"{100 * counts['piece_start_share']:.1f}% of pieces can start a span, "
            f"{100 * counts['cut_share']:.1f}% of {counts['spans']} spans cut a word  {path}")
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
