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
                  masked pieces in [brackets] (coloured on a terminal), the
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

import importlib.util
import itertools
import json
import os
import sys

import numpy as np

from xlnet_data.common.errors import UserError
from xlnet_data.dataformat import provenance, save_dir, validation
from xlnet_data.dataformat import vocab as _vocab
from xlnet_data.dataformat.examples import generated
from xlnet_data.dataformat.inspection import (
    SETTING_KEYS,
    InspectionError,
    decode_example,
    example_to_json,
    format_example,
    is_backward_row,
    record_info_batches,
    resolve_inputs,
    resolve_settings,
    resolve_sp_path,
)
from xlnet_data.dataformat.record_reader import parse_example, read_records
from xlnet_data.dataformat.stats import UnkCounter, compute_stats, format_stats, plot_stats

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


def _selected_records(files, skip, limit, verify_crc, cache_units=None):
    """(global index, (file, record index, offset, payload)) of the selected records, read lazily (made from the
    token cache for `cache_units`: `files` are then their record_info paths, offsets None)."""
    if cache_units:
        every = ((unit.info_path, index, None, payload) for unit in cache_units
                 for index, payload in enumerate(generated.unit_payloads(unit)))
    else:
        every = ((path, *record) for path in files for record in read_records(path, verify_crc))
    return itertools.islice(enumerate(every), skip, None if limit is None else skip + limit)


def _of_unit(path, task, pass_id):
    """Whether a records or record_info file belongs to the --task / --pass_id selection."""
    parsed = save_dir.parse_name(path)
    if task is None and pass_id is None:
        return True
    return parsed is not None and task in (None, parsed.task) and pass_id in (None, parsed.pass_id)


def _cache_units(paths, task, pass_id):
    """The selected units of a cache-backed save_dir given as the only PATH, else None."""
    if len(paths) != 1 or not os.path.isdir(paths[0]):
        return None
    found = generated.find_cache_units(paths[0])
    if not found:
        return None
    chosen = [unit for unit in found if _of_unit(unit.info_path, task, pass_id)]
    if not chosen:
        raise InspectionError(f"no unit of --task={task} --pass_id={pass_id} in {paths[0]}")
    for unit in chosen:  # a missing or stale cache: one line
        generated.check_cache(unit)
    return chosen


def _main(argv):
    from absl import flags

    from xlnet_data import cli

    FLAGS = flags.FLAGS
    out, err = sys.stdout, sys.stderr
    for stream in (out, err):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):
            pass
    try:
        return _dump(argv[1:], FLAGS, out, err)
    except BrokenPipeError:  # the reader went away (`dump ... | head`): stop quietly (before OSError, its parent)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except UserError as error:  # records, settings, a save_dir, a SentencePiece model, a token cache
        out.flush()
        return cli.fail("dump", error)
    except OSError as error:  # e.g. an unwritable --plot path, an unreadable folder
        out.flush()
        return cli.fail("dump", cli.os_error_line(error))


def _dump(paths, FLAGS, out, err):
    skip, limit = FLAGS.skip, FLAGS.limit
    if FLAGS.example is not None:
        if FLAGS.skip or FLAGS.limit is not None:
            raise InspectionError("--example cannot be combined with --skip or --limit")
        skip, limit = FLAGS.example, 1
    want_stats = FLAGS.stats or FLAGS.plot
    if FLAGS.plot and importlib.util.find_spec("matplotlib") is None:
        raise InspectionError("--plot needs matplotlib: pip install matplotlib (or pip install 'xlnet-data[plot]')")

    cache_units = _cache_units(paths, FLAGS.task, FLAGS.pass_id)
    if cache_units:  # a cache-backed save_dir: its units' record_infos stand for the files
        files = [unit.info_path for unit in cache_units]
        candidates = [save_dir.corpus_info_path(paths[0])]
    else:
        files, candidates = resolve_inputs(paths)
        files = [path for path in files if _of_unit(path, FLAGS.task, FLAGS.pass_id)]
        if not files:
            raise InspectionError(f"no records file of --task={FLAGS.task} --pass_id={FLAGS.pass_id} in {paths}")
        validation.check_record_files(files)  # each file holds the records its record_info lists
    model_sha256 = {validation.check_units_agree(folder)  # one run's units (data flags, SentencePiece model)
                    for folder in sorted({os.path.dirname(os.path.abspath(path)) for path in files})} - {None}
    overrides = {k: getattr(FLAGS, k) for k in SETTING_KEYS if k != "num_predict"}
    settings, sources, info, info_path, warnings = resolve_settings(
        files, candidates, overrides, corpus_info_path=FLAGS.corpus_info)
    if info_path:  # corpus_info.json against the record_infos beside the records and their first records
        validation.check_corpus_info(info_path, info, os.path.dirname(os.path.abspath(files[0])))
        for unit in cache_units or ():
            generated.check_corpus_info(info_path, info, unit)

    sp = sp_where = None
    if FLAGS.sp_path:
        sp = _vocab.load_sentencepiece(FLAGS.sp_path)
        sp_where = FLAGS.sp_path
    else:
        declared = (info or {}).get("sp_path")
        found = resolve_sp_path(declared, info_path, (info or {}).get("input_glob"))
        if found:
            try:
                sp = _vocab.load_sentencepiece(found)
                sp_where = found
                if model_sha256 and provenance.sha256_of(found) not in model_sha256:
                    raise InspectionError(f"{found} (corpus_info.json's sp_path) is not the SentencePiece model the "
                                          "records were made with (it changed since): pass that model's "
                                          "--sp_path, or make the records again")
            except _vocab.VocabError as error:
                warnings.append(f"{error}; showing ids (pass --sp_path)")
        else:
            why = (f"corpus_info.json's sp_path {declared!r} not found" if declared
                   else "no SentencePiece model known")
            warnings.append(f"{why}: showing ids, no word statistics (pass --sp_path)")
    for warning in warnings:
        print(f"warning: {warning}", file=err)

    # Not a setting to read the records by: how their text was made (see create --keep_accents).
    accents = validation.recorded(info, "keep_accents") if info else None
    keep_accents = (f"{accents} (corpus_info.json{'' if 'keep_accents' in info else ', absent: the original accent removal'})"
                    if info else "unknown (no corpus_info.json)")
    seq_len = settings.get("seq_len")
    reuse_len = settings.get("reuse_len")
    bsz = settings.get("bsz_per_host")
    vocab_size = sp.get_piece_size() if sp is not None else None
    color = FLAGS.color == "always" or (FLAGS.color == "auto" and out.isatty() and not os.environ.get("NO_COLOR"))

    def decoded_stream(with_sp):
        for index, (path, record, offset, payload) in _selected_records(files, skip, limit, FLAGS.verify_crc,
                                                                        cache_units):
            features = parse_example(payload, seq_len, vocab_size, path, record, offset)
            reverse = is_backward_row(record, bsz, settings.get("num_core_per_host"), settings.get("bi_data"))
            decoded = decode_example(features, sp if with_sp else None, reuse_len, reverse)
            yield index, path, record, decoded

    if want_stats:
        table = _vocab.start_piece_table(sp) if sp is not None else None
        unk = UnkCounter()

        def counted(stream):
            for _, path, _, decoded in stream:
                unk.add(path, decoded.input)
                yield decoded
        stats = compute_stats(counted(decoded_stream(False)), start_table=table, bsz_per_host=bsz)
        stats["files"] = files
        stats["settings"] = settings
        stats["keep_accents"] = accents
        stats["unk_per_file"] = unk.per_file
        if skip == 0 and limit is None:
            stats["record_info_num_batch"] = (sum(unit.num_batch for unit in cache_units) if cache_units
                                              else record_info_batches(files))
        if FLAGS.format == "json":
            print(json.dumps(stats, default=_json_default), file=out)
        else:
            print(_preamble(files, settings, sources, info_path, sp_where, keep_accents), file=out)
            print(format_stats(stats), file=out)
        if FLAGS.plot:
            plot_stats(stats, FLAGS.plot)
            print(f"wrote {FLAGS.plot}", file=err)
        return 1 if FLAGS.strict and stats["records_failing_checks"] else 0

    if FLAGS.format == "text":
        print(_preamble(files, settings, sources, info_path, sp_where, keep_accents), file=out)
    shown = failing = 0
    for index, path, record, decoded in decoded_stream(True):
        shown += 1
        check = decoded.target_check
        if decoded.problems or check.num_violations:
            failing += 1
        if FLAGS.format == "json":
            print(json.dumps(example_to_json(decoded, index=index, file=path, record=record),
                             ensure_ascii=False), file=out)
        else:
            row = record % bsz if bsz else None
            where = f"{os.path.basename(path)}:{record}" if len(files) > 1 or index != record else f"record {record}"
            print(format_example(decoded, index=index, where=where, color=color, row=row), file=out)
            print(file=out)
    if FLAGS.format == "text":
        verdict = "all checks pass" if not failing else f"{failing} FAIL the layout/target checks"
        print(f"# {shown} example(s) shown; {verdict}", file=out)
    return 1 if FLAGS.strict and failing else 0


def _json_default(value):
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    raise TypeError(type(value).__name__)


def _preamble(files, settings, sources, info_path, sp_where, keep_accents):
    shown = ", ".join(files[:3]) + (f" … ({len(files)} files)" if len(files) > 3 else "")
    parts = [f"{k} {settings[k]} ({sources.get(k)})" for k in SETTING_KEYS if k in settings]
    parts.append(f"keep_accents {keep_accents}")
    lines = [f"# files: {shown}", f"# settings: {'; '.join(parts)}"]
    lines.append(f"# corpus_info: {info_path or 'none'}; SentencePiece: {sp_where or 'none (ids shown)'}")
    return "\n".join(lines)


def run():
    """Entry point of `python -m xlnet_data.dump` and `xlnet-data-dump`."""
    from xlnet_data import cli

    cli.run(_main, "dump", __doc__, define_flags)


if __name__ == "__main__":
    run()
