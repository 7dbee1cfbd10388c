"""python -m xlnet_data.create: XLNet pretraining records from text, identical to the original data_utils.py.

Every flag of the original keeps its name, type and default; see README.md for a worked example.
"""

import dataclasses
import logging
import sys
import time

from absl import flags

from xlnet_data import cli
from xlnet_data.common import memory
from xlnet_data.dataformat.examples.loop import SPAN_UNITS
from xlnet_data.dataformat.words import WORD_BOUNDARIES
from xlnet_data.datagen import beam_runner
from xlnet_data.datagen.config import ENCODERS, SPLITS, CreateConfig
from xlnet_data.datagen.job import create_records

log = logging.getLogger("xlnet_data")
FLAGS = flags.FLAGS

def define_flags():
    """The original's flags, same names, types and defaults, then the new ones."""
    defaults = CreateConfig()
    cli.define_data_flags(dataclasses.asdict(defaults))
    flags.DEFINE_bool("use_tpu", defaults.use_tpu, "Lay rows out for TPU cores; without it num_core_per_host is 1.")
    flags.DEFINE_integer("bsz_per_host", defaults.bsz_per_host, "Examples per batch (rows of the layout).")
    flags.DEFINE_bool("use_eod", defaults.use_eod, "A blank line (end of document) becomes <eod>; else it is dropped.")
    flags.DEFINE_bool("from_raw_text", defaults.from_raw_text,
                      "Input lines are text to encode; with --nofrom_raw_text they are whitespace-separated ids.")
    flags.DEFINE_string("input_glob", defaults.input_glob, "Input files (a glob; local or gs:// paths).")
    flags.DEFINE_string("sp_path", defaults.sp_path,
                        "SentencePiece model with XLNet's special ids (spm_train makes one).")
    flags.DEFINE_string("save_dir", defaults.save_dir, "Output: corpus_info.json and tfrecords/ go here.")
    flags.DEFINE_enum("split", defaults.split, list(SPLITS), "Split name used in the file names.")
    flags.DEFINE_integer("pass_id", defaults.pass_id,
                         "Pass to write (seeds the file order, A/B and masks); ignored with --num_passes.")
    flags.DEFINE_integer("num_task", defaults.num_task, "Tasks the sorted file list is split into, interleaved.")
    flags.DEFINE_integer("task", None,
                         "The task to run; unset: every task of --num_task (the original's default was 0).")
    # New flags (num_passes is among the data flags).
    flags.DEFINE_integer("num_workers", None, "Parallel processes for the (task, pass) units; default: the CPU count.",
                         lower_bound=1)
    flags.DEFINE_enum("span_unit", defaults.span_unit, list(SPAN_UNITS),
                      "piece: spans of n pieces from a word start, as the original (may cut words); "
                      "word: spans of n whole words, as the paper describes.")
    flags.DEFINE_enum("word_boundaries", defaults.word_boundaries, list(WORD_BOUNDARIES),
                      "Where a masked span can start. spaces: the original's rule (a piece starting with '▁', a "
                      "special token or punctuation), which knows only space-separated scripts; zh, ja, th: also "
                      "at the words a segmenter finds in Chinese (jieba's dictionary), Japanese (MeCab: fugashi, unidic-lite) "
                      "or Thai (nlpo3) text (pip install 'xlnet-data[words]'); text in other scripts keeps the "
                      "original's rule. --span_unit=piece and word both follow it.")
    flags.DEFINE_bool("strict", False, "Stop on a line that is not valid UTF-8 instead of replacing its bad bytes.")
    flags.DEFINE_bool("allow_binary", False,
                      "Read input files that look binary (a NUL byte, or mostly invalid UTF-8) as text instead of "
                      "refusing them. gzip, bzip2 and xz files are always read decompressed.")
    flags.DEFINE_bool("overwrite", False,
                      "Remove every unit of the earlier run in save_dir (except, with --task, the other tasks' units "
                      "of the same flags) and make it again: for a save_dir written with other flags or from inputs "
                      "that changed since, which is refused without it.")
    flags.DEFINE_bool("keep_cache", False,
                      "Keep save_dir/token_cache (each task's encoded files, read by all its passes) after the run "
                      "completes; by default it is deleted then. A run stopped early always keeps it for the re-run.")
    flags.DEFINE_bool("write_records", True,
                      "Write each (task, pass) unit's tfrecords. --nowrite_records keeps save_dir/token_cache instead "
                      "(about 2.1 bytes a token, once, against ~24 bytes a token per pass of records), and each unit's "
                      "record_info (num_batch included) names it: train_gpu and dump make the very same records from "
                      "it as they read them.")
    flags.DEFINE_bool("allow_accents_mismatch", False,
                      "Make the records although spm_train trained the model with the other --keep_accents (its "
                      "PREFIX.text.json says which), which is refused without it: the model's pieces would not fit "
                      "the text.")
    flags.DEFINE_enum("encoder", defaults.encoder, list(ENCODERS),
                      "Who turns the text into ids (the same ids either way): auto: our own encoder (several times "
                      "SentencePiece's speed) where it supports the model and agrees with the installed SentencePiece "
                      "on its check lines and the corpus's first lines, else SentencePiece; ours: our encoder, "
                      "unchecked; sentencepiece: SentencePiece alone.")
    flags.DEFINE_enum("runner", "local", ["local", "beam"],
                      "local: worker processes on this machine; beam: an Apache Beam pipeline, one element per unit.")
    flags.DEFINE_string("beam_runner", "DirectRunner",
                        "With --runner=beam: DirectRunner, DaskRunner, DataflowRunner, FlinkRunner, ...")
    flags.DEFINE_string("beam_options", "", "With --runner=beam: more Beam pipeline options, as one string "
                        "(e.g. \"--project=p --region=r --temp_location=gs://b/tmp --setup_file=./setup.py\"; "
                        "DaskRunner: \"--dask_client_address=tcp://HOST:8786\").")


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.INFO)
    memory.release_large_blocks_promptly()  # the process's, as in the workers (--num_workers=1 runs here)
    start = time.time()
    config = cli.config_from_flags(CreateConfig).validate()
    beam_args = None
    if FLAGS.runner == "beam":  # Beam and its options are checked before anything is written
        beam_args = beam_runner.pipeline_args(FLAGS.beam_runner, FLAGS.beam_options)
    summary = create_records(config, overwrite=FLAGS.overwrite, num_workers=FLAGS.num_workers,
                             beam_args=beam_args, keep_cache=FLAGS.keep_cache)
    for r in summary.units:
        if r.skipped:
            log.warning("task %d pass %d: %s", r.unit.task, r.unit.pass_id, r.skipped)
    print(summary.line(time.time() - start), file=sys.stderr)
    for warning in (summary.unk_warning(), summary.marks_warning()):
        if warning:  # last, where it is seen
            log.warning("%s", warning)
    return 0


def run():
    cli.run(main, "create", __doc__, define_flags, stopped_note="; complete units are kept and nothing is "
            "half-written: run the same command again to do the rest")


if __name__ == "__main__":
    run()
