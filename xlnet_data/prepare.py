"""python -m xlnet_data.prepare: raw documents → create's input format, in shards.

Reads plain text, JSON lines or Parquet (the formats `datasets` saves), plain or compressed (gzip,
bzip2, xz, zstd: told by the content, read to the end marker), one document per record; writes one
sentence per line, `<eop>` glued to the last sentence of each paragraph but a document's last, a
blank line after every document, in --num_shards files of similar size (shard-00000-of-00004.txt,
...). Paragraphs are the lines of a record's text; sentences come from a rule-based splitter for
--language (Thai, th, is cut at the spaces between sentences); empty and exactly repeated documents
are dropped and counted. --dev_fraction (or --dev_documents) holds out whole documents into OUT/dev/
(for a held-out loss in train_gpu). Then:

  python -m xlnet_data.spm_train --input='OUT/*.txt' --model_prefix=spm/my --vocab_size=32000
  python -m xlnet_data.create --input_glob='OUT/*.txt' --sp_path=spm/my.model ...
  python -m xlnet_data.create --input_glob='OUT/dev/*.txt' --split=dev ...   (the same flags and save_dir)
"""

import os
import sys
import time

from absl import flags

from xlnet_data import cli
from xlnet_data.common import workers
from xlnet_data.datagen.prepare import FORMATS, TEXT_LAYOUTS, PrepareConfig, prepare

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("input_glob", None, "Raw input files (a glob; local or gs:// paths), e.g. 'raw/*.jsonl.gz'. "
                        "Compressed files (gzip, bzip2, xz, zstd) are told by their content and read to their end.")
    flags.DEFINE_string("output_dir", None, "Where the shards go (created if missing).")
    flags.DEFINE_enum("format", "auto", list(FORMATS),
                      "auto: from the name (.jsonl/.json/.ndjson: JSON lines, .parquet: Parquet, else text); "
                      "text; jsonl: one JSON object per line; parquet.")
    flags.DEFINE_string("text_key", "text", "JSON lines: the field holding a document's text; Parquet: the column.")
    flags.DEFINE_enum("text_layout", "blank_line", list(TEXT_LAYOUTS),
                      "Plain text only. " + "; ".join(f"{name}: {what}" for name, what in TEXT_LAYOUTS.items()) + ".")
    flags.DEFINE_string("language", "en", "Language of the text (ISO 639 code: en, fr, de, es, zh, ja, th, hi, vi, "
                        "ar, ...), for the sentence splitter's abbreviations and sentence marks (th: Thai, cut at the "
                        "spaces between sentences).")
    flags.DEFINE_integer("num_shards", 1, "Output files, of similar size (cut at document ends).", lower_bound=1)
    flags.DEFINE_integer("num_workers", None, "Files read and split in parallel; default: the cores this process may "
                         "use (taskset). "
                         "The output is the same for every value.", lower_bound=1)
    flags.DEFINE_bool("dedup", True, "Drop a document that repeats an earlier one exactly (after whitespace "
                      "normalisation); the first copy, in file order, is kept.")
    flags.DEFINE_float("dev_fraction", 0.0, "Hold out this share of the documents (e.g. 0.01) into "
                       "OUTPUT_DIR/dev/ (whole documents, chosen by a hash of their text: the same corpus gives the "
                       "same split on any machine, for any --num_shards and --num_workers); `create --split=dev` "
                       "makes their records for train_gpu's held-out loss.")
    flags.DEFINE_integer("dev_documents", 0, "Hold out this many documents instead (as --dev_fraction).",
                         lower_bound=0)
    flags.DEFINE_integer("dev_shards", 1, "Files of the held-out documents in OUTPUT_DIR/dev/.", lower_bound=1)
    flags.DEFINE_bool("overwrite", False, "Replace the shards of an earlier run in --output_dir (never read as input, "
                      "even where --input_glob matches them).")


def main(argv):
    if len(argv) > 1:
        return cli.fail("prepare", f"unexpected arguments: {' '.join(argv[1:])}")
    start = time.time()
    config = cli.config_from_flags(PrepareConfig, input_glob=FLAGS.input_glob or "", output_dir=FLAGS.output_dir or "",
                                   num_workers=FLAGS.num_workers or workers.process_cores()).validate()
    summary = prepare(config)
    shards = len(summary.shards)
    empty_shards = f" ({summary.empty_shards} of them empty)" if summary.empty_shards else ""
    held = (f", {summary.dev_documents} of them held out into {os.path.dirname(summary.dev_shards[0])} "
            f"({len(summary.dev_shards)} shard(s))" if summary.dev_shards else "")
    print(f"done: {summary.documents} documents{held}, {summary.paragraphs} paragraphs, {summary.sentences} sentences, "
          f"{summary.characters} characters from {summary.files} file(s) into {shards} shard(s)"
          f"{empty_shards} in {config.output_dir} ({summary.bytes_written / 1e6:.1f} MB); dropped "
          f"{summary.empty_dropped} empty and {summary.duplicates_dropped} duplicate documents; "
          f"{time.time() - start:.1f} s", file=sys.stderr)
    warning = summary.layout_warning(config.text_layout)
    if warning:
        print(f"prepare: warning: {warning}", file=sys.stderr)
    return 0


def run():
    cli.run(main, "prepare", __doc__, define_flags, stopped_note="; no shard is half-written, but the run is "
            "incomplete: run the same command again with --overwrite")


if __name__ == "__main__":
    run()
