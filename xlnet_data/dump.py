"""Shows what is inside XLNet pretraining TFRecords: text, masks, checks, statistics.

Usage:
  python -m xlnet_data.dump PATH [PATH ...] [flags]

PATH is a save_dir (holding corpus_info.json and tfrecords/), a tfrecords/ folder,
a cache-backed save_dir (create --write_records=false: the records are made from
its token cache, as train_gpu makes them),
one or more .tfrecords or .tfrecords.gz files (plain or gzip, detected from the
content), or a quoted glob. seq_len, reuse_len, bsz_per_host, bi_data and the
SentencePiece model come from corpus_info.json beside the records (in the
save_dir, or the parent of a tfrecords/ folder), else from the file name, else
from the flags below, which always win.

Views:
  (default)       per example: label, the memory part, A and B as text with
                  masked pieces in ⟦white brackets⟧ (coloured on a terminal), the
                  segment boundaries and a check of the next-token targets
  --format=json   one JSON object per example (every feature, the pieces, the
                  decoded parts and the checks), one per line
  --stats         a table over all records (with --format=json: one JSON object);
                  --plot=FILE.png also draws the span-length histograms

Examples:
  python -m xlnet_data.dump save_dir --limit=3
  python -m xlnet_data.dump 'save_dir/tfrecords/train-*.tfrecords*' --stats
  python -m xlnet_data.dump save_dir --format=json --example=17

Exit status: 0; 2 on an unreadable, truncated or corrupt file, a file with fewer
records than its record_info lists, or a record that is not an XLNet pretraining
example (one line `dump: error: ...` naming the file, the record and its byte);
1 with --strict when a record fails the layout or target checks.
"""

import collections
import dataclasses
import importlib.util
import json
import os
import sys
from typing import Optional

import numpy as np

from xlnet_data.common.progress import CountProgress
from xlnet_data.dataformat import save_dir, save_dir_lock, settings
from xlnet_data.dataformat import vocab as _vocab
from xlnet_data.dataformat.inspection import (
    example_to_json,
    format_example,
)
from xlnet_data.dataformat.selection import InspectionError, Selection, SelectionConfig, select
from xlnet_data.dataformat.stats import UnkCounter, WordCounter, compute_stats, format_stats, plot_stats, table_starts
from xlnet_data.dataformat.words import WordStarts

# =====================================================================================
# The command line (absl flags live only here).
# =====================================================================================


def define_flags():
    from absl import flags

    flags.DEFINE_enum("format", "text", ["text", "json"],
                      "text: a readable view per example; json: one JSON object per example per line "
                      "(with --stats: the statistics as one JSON object).")
    flags.DEFINE_boolean("stats", False, "Print statistics over all selected records instead of the examples.")
    flags.DEFINE_string("plot", None, "With --stats (implied): draw the span-length histograms into this "
                        "image file (PNG). Needs matplotlib (pip install 'xlnet-data[plot]').")
    flags.DEFINE_integer("limit", None, "Show at most this many examples, counted over all files (with --stats: "
                         "count only these).", lower_bound=0)
    flags.DEFINE_integer("skip", 0, "Skip this many records first, counted over all files (also for --stats).",
                         lower_bound=0)
    flags.DEFINE_integer("example", None, "Show only the example with this index (0-based, counted over all "
                         "files); same as --skip=K --limit=1.", lower_bound=0)
    flags.DEFINE_string("sp_path", None, "SentencePiece model to decode ids (default: corpus_info.json's "
                        "sp_path, resolved against the save_dir's parent and the current directory).")
    flags.DEFINE_string("corpus_info", None, "corpus_info.json to use (default: beside the records: the "
                        "save_dir, or the parent of the tfrecords/ folder).")
    flags.DEFINE_integer("seq_len", None, "Override the sequence length (default: corpus_info.json, the "
                         "file name, or the records).", lower_bound=4)
    flags.DEFINE_integer("reuse_len", None, "Override the memory length (default: corpus_info.json, the file "
                         "name, else seq_len/2).", lower_bound=0)
    flags.DEFINE_integer("bsz_per_host", None, "Override the batch size (records per batch) used to count "
                         "batches and tell backward rows.", lower_bound=1)
    flags.DEFINE_integer("num_core_per_host", None, "Override the number of cores (with bi_data, each core's "
                         "forward rows are followed by their reversed copies).", lower_bound=1)
    flags.DEFINE_boolean("bi_data", None, "Override whether the records were written with bi_data "
                         "(backward rows are shown flipped into reading order).")
    flags.DEFINE_enum("color", "auto", ["auto", "always", "never"],
                      "Colour masked pieces: auto = only when stdout is a terminal (and NO_COLOR is unset).")
    flags.DEFINE_boolean("strict", False, "Exit 1 when a record fails the layout or target checks.")
    flags.DEFINE_boolean("verify_crc", True, "Check every record's CRC (--noverify_crc skips it).")
    flags.DEFINE_integer("task", None, "Only the units (records files, or a cache-backed save_dir's units) of this "
                         "task.", lower_bound=0)
    flags.DEFINE_integer("pass_id", None, "Only the units of this pass.", lower_bound=0)
    flags.DEFINE_string("split", None, "Only the units of this split (train, dev: create --split); default: "
                        "every split there, the statistics counting each split's records.")


@dataclasses.dataclass(frozen=True)
class DumpConfig:
    """The records to read (selection.py), and how to show them."""

    selection: SelectionConfig
    format: str = "text"
    stats: bool = False
    plot: Optional[str] = None
    color: bool = False
    strict: bool = False


def config_from_flags(paths, FLAGS, out) -> DumpConfig:
    skip, limit = FLAGS.skip, FLAGS.limit
    if FLAGS.example is not None:
        if FLAGS.skip or FLAGS.limit is not None:
            raise InspectionError("--example cannot be combined with --skip or --limit")
        skip, limit = FLAGS.example, 1
    if FLAGS.plot and importlib.util.find_spec("matplotlib") is None:
        raise InspectionError("--plot needs matplotlib: pip install matplotlib (or pip install 'xlnet-data[plot]')")
    overrides = {key: FLAGS[key].value for key in settings.READ_KEYS if key != "num_predict"}
    selection = SelectionConfig(tuple(paths), skip=skip, limit=limit, task=FLAGS.task, pass_id=FLAGS.pass_id, split=FLAGS.split,
                                verify_crc=FLAGS.verify_crc, sp_path=FLAGS.sp_path, corpus_info=FLAGS.corpus_info,
                                overrides=overrides)
    color = FLAGS.color == "always" or (FLAGS.color == "auto" and out.isatty() and not os.environ.get("NO_COLOR"))
    return DumpConfig(selection, format=FLAGS.format, stats=bool(FLAGS.stats or FLAGS.plot), plot=FLAGS.plot,
                      color=color, strict=FLAGS.strict)


def main(argv):
    from absl import flags

    out, err = sys.stdout, sys.stderr
    for stream in (out, err):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):
            pass
    try:
        config = config_from_flags(argv[1:], flags.FLAGS, out)
        chosen = select(config.selection)
        for warning in chosen.warnings:
            print(f"warning: {warning}", file=err)
        # While it reads, no create --overwrite pulls the records away (it is refused, naming this dump).
        with save_dir_lock.reading({os.path.dirname(os.path.abspath(path)) for path in chosen.files}, "dump"):
            failing = _show_stats(config, chosen, out, err) if config.stats else _show_examples(config, chosen, out)
        return 1 if config.strict and failing else 0
    except BrokenPipeError:  # the reader went away (`dump ... | head`): stop quietly (cli.run fails an OSError)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _show_stats(config: DumpConfig, chosen: Selection, out, err) -> int:
    """The statistics table (or JSON object), and the --plot; returns the count of records failing the checks."""
    info = chosen.settings.corpus_info
    boundaries = info.value("word_boundaries") if info else "spaces"
    starts_of = None
    if chosen.sp is not None:  # words as create found them: a segmenter's (--word_boundaries), else the original's
        starts_of = (table_starts(_vocab.start_piece_table(chosen.sp)) if boundaries == "spaces"
                     else WordStarts.of(chosen.sp, boundaries))
    unk, words = UnkCounter(), WordCounter(starts_of)
    bsz = chosen.settings.values.get("bsz_per_host")
    whole = chosen.config.skip == 0 and chosen.config.limit is None
    num_batch = chosen.record_info_num_batch() if whole and bsz else None
    progress = CountProgress("dump --stats: records", total=num_batch * bsz if num_batch else chosen.config.limit,
                             stream=err)
    splits = collections.Counter()

    def counted(stream):
        for _, path, _, decoded in stream:
            unk.add(path, decoded.input)
            if starts_of is not None:
                words.add(path, decoded)
            splits[getattr(save_dir.parse_name(path), "split", None) or "unnamed"] += 1
            progress.update()
            yield decoded
    try:
        stats = compute_stats(counted(chosen.decoded(with_sp=False)), starts_of=starts_of, bsz_per_host=bsz)
    finally:
        progress.close()
    stats["word_boundaries"] = boundaries
    stats["words_per_file"] = words.per_file
    stats["files"] = chosen.files
    stats["settings"] = chosen.settings.values
    stats["keep_accents"] = chosen.keep_accents
    stats["unk_per_file"] = unk.per_file
    stats["records_per_split"] = dict(sorted(splits.items()))
    if whole:
        stats["record_info_num_batch"] = chosen.record_info_num_batch()
    if config.format == "json":
        print(json.dumps(stats, default=_json_default), file=out)
    else:
        print(_preamble(chosen), file=out)
        print(format_stats(stats), file=out)
        if len(splits) > 1:
            print(f"{'records per split':26s}{', '.join(f'{k} {v}' for k, v in sorted(splits.items()))}", file=out)
    if config.plot:
        plot_stats(stats, config.plot)
        print(f"wrote {config.plot}", file=err)
    return stats["records_failing_checks"]


def _show_examples(config: DumpConfig, chosen: Selection, out) -> int:
    """Each selected example (text or a JSON line), then a verdict; returns the count failing the checks."""
    if config.format == "text":
        print(_preamble(chosen), file=out)
    bsz = chosen.settings.values.get("bsz_per_host")
    shown = failing = 0
    for index, path, record, decoded in chosen.decoded():
        shown += 1
        if decoded.problems or decoded.target_check.num_violations:
            failing += 1
        if config.format == "json":
            print(json.dumps(example_to_json(decoded, index=index, file=path, record=record),
                             ensure_ascii=False), file=out)
        else:
            row = record % bsz if bsz else None
            several = len(chosen.files) > 1 or index != record
            where = f"{os.path.basename(path)}:{record}" if several else f"record {record}"
            print(format_example(decoded, index=index, where=where, color=config.color, row=row), file=out)
            print(file=out)
    if config.format == "text":
        verdict = "all checks pass" if not failing else f"{failing} FAIL the layout/target checks"
        print(f"# {shown} example(s) shown; {verdict}", file=out)
    return failing


def _json_default(value):
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    raise TypeError(type(value).__name__)


def _preamble(chosen: Selection):
    files, found = chosen.files, chosen.settings
    shown = ", ".join(files[:3]) + (f" … ({len(files)} files)" if len(files) > 3 else "")
    parts = [f"{k} {found.values[k]} ({found.sources.get(k)})" for k in settings.READ_KEYS if k in found.values]
    parts.append(f"keep_accents {chosen.keep_accents_text()}")
    lines = [f"# files: {shown}", f"# settings: {'; '.join(parts)}"]
    lines.append(f"# corpus_info: {found.corpus_info_path or 'none'}; "
                 f"SentencePiece: {chosen.sp_where or 'none (ids shown)'}")
    return "\n".join(lines)


def run():
    """Entry point of `python -m xlnet_data.dump` and `xlnet-data-dump`."""
    from xlnet_data import cli

    cli.run(main, "dump", __doc__, define_flags)


if __name__ == "__main__":
    run()
