"""Trains a SentencePiece model with XLNet's special symbols and checks their ids.

The original README's recipe, as one command:

  python -m xlnet_data.spm_train --input='corpus/*.txt' --model_prefix=sp10m.cased.v3 --nouncased

which runs SentencePiece with

  --vocab_size=32000 --character_coverage=0.99995 --model_type=unigram
  --control_symbols=<cls>,<sep>,<pad>,<mask>,<eod>
  --user_defined_symbols=<eop>,.,(,),",-,–,£,€
  --shuffle_input_sentence --input_sentence_size=10000000

on the text as create will feed it (read and normalised as create reads and normalises it: see
--uncased and --keep_accents, which should match create's), and then checks that the model gives
<unk>=0 <s>=1 </s>=2 <cls>=3 <sep>=4 <pad>=5 <mask>=6 <eod>=7 <eop>=8, and that `<eop>` glued to
the end of a sentence comes out as its own id 8. How the text was normalised, and the share of <unk>
on it, are written to PREFIX.text.json beside the model.
A small corpus cannot fill 32000 pieces: pass a smaller --vocab_size (the error says how
small) or --nohard_vocab_limit. A vocabulary that it fills but with many rare pieces (more than 10%
seen fewer than 5 times in the text) gets a warning with a size that fits the text. While SentencePiece
trains (one C++ call), a line every 15 s says where it is.
"""

import sys
import time

import sentencepiece as spm

from xlnet_data import cli
from xlnet_data.common import workers
from xlnet_data.datagen import spm_log
from xlnet_data.datagen.tokenizer import (
    RARE_PIECE_COUNT,
    SpmTrainConfig,
    SpmTrainError,
    expand_inputs,
    model_text_settings,
    text_settings_path,
    train_sentencepiece,
)


def define_flags():
    from absl import flags

    defaults = SpmTrainConfig(input_files=(), model_prefix="")
    flags.DEFINE_string(
        "input", None,
        "Text files to train on: comma-separated paths and/or globs (quote globs), e.g. "
        "'corpus/*.txt,extra.txt'. XLNet's input format: one sentence per line, an empty "
        "line between documents, <eop> glued to the end of a paragraph's last sentence "
        "(it is a user-defined symbol, so it stays one piece, id 8). Read as create reads them: "
        "gzip, bzip2 and xz files decompressed, a binary file refused.")
    flags.DEFINE_string(
        "model_prefix", None,
        "Output prefix: writes PREFIX.model, PREFIX.vocab and PREFIX.text.json (missing directories are created), "
        "e.g. out/sp10m.cased.v3.")
    flags.DEFINE_integer(
        "vocab_size", defaults.vocab_size,
        "Number of pieces, the 9 XLNet special ids and 8 more user-defined symbols included. "
        "The original's 32000 needs a large corpus; a few hundred KB of text supports a few "
        "thousand (the error message gives the largest possible).")
    flags.DEFINE_string(
        "model_type", defaults.model_type,
        "SentencePiece model type: unigram (XLNet's), bpe or char. word is not offered: a word "
        "model keeps <eop> glued to the word before it, so the paragraph ends would be lost.")
    flags.DEFINE_float(
        "character_coverage", defaults.character_coverage,
        "Share of the corpus's characters the vocabulary must cover; rarer characters become "
        "<unk>. 0.99995 as the original; 1.0 keeps every character.")
    flags.DEFINE_integer(
        "input_sentence_size", defaults.input_sentence_size,
        "At most this many lines (sampled) are used for training; 0 uses all of them.")
    flags.DEFINE_boolean(
        "shuffle_input_sentence", defaults.shuffle_input_sentence,
        "Sample the input_sentence_size lines at random rather than taking the first ones "
        "(--noshuffle_input_sentence for the first ones).")
    flags.DEFINE_boolean(
        "hard_vocab_limit", defaults.hard_vocab_limit,
        "Fail when the corpus cannot give --vocab_size pieces. --nohard_vocab_limit makes "
        "--vocab_size an upper bound instead, for small corpora.")
    flags.DEFINE_integer(
        "num_threads", min(workers.process_cores(), 16),
        "Training threads (default: the cores this process may use (taskset), at most 16).")
    flags.DEFINE_boolean(
        "uncased", defaults.uncased,
        "Train on lower-cased text, as create --uncased (its default, the original data_utils.py's) feeds it. "
        "--nouncased: a cased model (the original README's sp10m.cased.v3), for create --nouncased.")
    flags.DEFINE_boolean(
        "keep_accents", defaults.keep_accents,
        "Train on the text with its accents and marks (no NFKD), as create --keep_accents feeds it. Off, as "
        "create's default: the original's accent removal first (Thai tone marks, viramas, kana voicing, "
        "Vietnamese tones... dropped). Recorded in PREFIX.text.json; create warns when its setting differs.")
    flags.DEFINE_boolean(
        "verbose", False,
        "Show SentencePiece's own training log on stderr (by default only its warnings).")


def main(argv):
    from absl import flags

    FLAGS = flags.FLAGS
    if len(argv) > 1:
        print(f"spm_train: error: unexpected arguments: {' '.join(argv[1:])}", file=sys.stderr)
        return 2
    start = time.time()
    if not FLAGS.model_prefix:
        raise SpmTrainError("--model_prefix is required: the output prefix, e.g. out/sp10m.cased.v3")
    config = cli.config_from_flags(SpmTrainConfig, input_files=expand_inputs(FLAGS.input or ""))
    path = train_sentencepiece(config)
    size = spm.SentencePieceProcessor(model_file=path).get_piece_size()
    trained = model_text_settings(path)
    share = 100 * trained["unk"] / max(1, trained["pieces"])
    print(f"wrote {path}, {config.model_prefix}.vocab and {text_settings_path(path)}: {size} pieces from "
          f"{len(config.input_files)} file(s) in {time.time() - start:.1f} s; special ids 0-8 as XLNet expects; "
          f"trained {'uncased' if config.uncased else 'cased'}, accents {'kept' if config.keep_accents else 'removed'}; "
          f"<unk> {trained['unk']} of the {trained['pieces']} pieces of its text ({share:.3f}%)")
    warning = spm_log.vocabulary_warning(size, trained.get("rare_pieces", 0), RARE_PIECE_COUNT)
    if warning:
        print(f"spm_train: warning: {warning}", file=sys.stderr)
    return 0


def run():
    """Console entry point (`xlnet-data-spm-train`)."""
    cli.run(main, "spm_train", __doc__, define_flags)


if __name__ == "__main__":
    run()
