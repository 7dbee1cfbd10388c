"""python -m xlnet_data.export_hf: a checkpoint to a directory that Hugging Face Transformers loads.

    python -m xlnet_data.export_hf --model_dir=models/my --output_dir=hf/my

writes config.json (set for fine-tuning), model.safetensors, the tokenizer (spiece.model, tokenizer.json,
tokenizer_config.json), xlnet_pretraining.json (the training run's memory and attention settings, which
train_gpu --init_checkpoint=hf/my continues with) and a model card, README.md. Then
XLNetForSequenceClassification.from_pretrained("hf/my") and AutoTokenizer.from_pretrained("hf/my") load it, the
tokenizer normalising text as create did (--uncased, --keep_accents: the records', through the training run's
run_config.json); its agreement with create's ids is measured on lines of the corpus and printed. From the
latest checkpoint of --model_dir, or a given --checkpoint (ours or an original TF1 one, with --xlnet_config).
Needs safetensors, not PyTorch or Transformers (the agreement needs the tokenizers package).
"""

import dataclasses
import os
import sys

from absl import flags

from xlnet_data import cli
from xlnet_data.common.errors import ConfigError
from xlnet_data.dataformat import provenance, save_dir, settings
from xlnet_data.dataformat.corpus_info import CorpusInfo
from xlnet_data.pretrain import held_out
from xlnet_data.pretrain.config import ExportConfig, RunConfig, XLNetConfig

FLAGS = flags.FLAGS
_RUN_FLAGS = ("mem_len", "reuse_len", "bi_data", "clamp_len", "same_length")


def define_flags():
    # The defaults where the training run left no run_config.json are the config classes'.
    default = cli.field_defaults(ExportConfig, RunConfig)
    flags.DEFINE_string("model_dir", None, "A model_dir of train_gpu: its latest checkpoint, with its xlnet_config.json "
                        "and run_config.json.")
    flags.DEFINE_string("checkpoint", None, "Export this checkpoint instead (a prefix such as model.ckpt-1000, or a "
                        "directory with a `checkpoint` file; ours or an original TF1 one); `best`: --model_dir's "
                        "checkpoint of the lowest held-out loss (model_dir/best/).")
    flags.DEFINE_string("xlnet_config", None, "The model's xlnet_config.json (default: the one in --model_dir, or "
                        "beside --checkpoint).")
    flags.DEFINE_string("sp_path", None, "The SentencePiece model the records were made with (becomes the tokenizer; "
                        "default: the records' sp_path, from the corpus_info.json of the run's record dirs).")
    flags.DEFINE_string("output_dir", None, "The directory to write (created if needed).")
    flags.DEFINE_bool("overwrite", default["overwrite"], "Replace an export already in --output_dir.")
    flags.DEFINE_bool("uncased", None, "The tokenizer lower-cases, as create --uncased did (default: the training "
                      f"run's, from run_config.json; else {default['uncased']}). Refused where it contradicts "
                      "run_config.json.")
    flags.DEFINE_bool("keep_accents", None, "The tokenizer keeps accents, as create --keep_accents did (default: the "
                      f"records', from the training run's run_config.json; else {default['keep_accents']}, the "
                      "original's stripping). Refused where it contradicts run_config.json.")
    flags.DEFINE_integer("mem_len", None, "config.json's mem_len (default: none, as fine-tuning wants; the training "
                         "run's goes into xlnet_pretraining.json).")
    flags.DEFINE_integer("reuse_len", None, "config.json's reuse_len (default: none, as fine-tuning wants).")
    flags.DEFINE_bool("bi_data", None, "config.json's bi_data (default: False, as fine-tuning wants: with True, "
                      "Transformers splits every batch into forward and backward halves, and one text gets empty logits).")
    flags.DEFINE_integer("clamp_len", None, "config.json's clamp_len (default: the training run's; else "
                         f"{default['clamp_len']}).")
    flags.DEFINE_bool("same_length", None, "config.json's same_length (default: the training run's; else "
                      f"{default['same_length']}).")
    flags.DEFINE_integer("agreement_lines", 2000, "Compare the tokenizer with create's ids on this many lines of the "
                         "corpus (the records' input files, where they still are); 0: do not.")


def _settings_dir(checkpoint):
    """Where the checkpoint's xlnet_config.json and run_config.json are looked for."""
    return checkpoint if os.path.isdir(checkpoint) else os.path.dirname(os.path.abspath(checkpoint))


def _records(recorded) -> list[tuple[str, CorpusInfo]]:
    """(path, CorpusInfo) of the corpus_info.json of each record dir that the training run recorded and that is
    still there."""
    dirs = (recorded or {}).get("record_info_dir") or ""
    paths = [path for path in map(save_dir.find_corpus_info, filter(None, dirs.split(","))) if path]
    return [(path, CorpusInfo.read(path)) for path in dict.fromkeys(paths)]


def _sp_path(run_config, recorded, records) -> str:
    """--sp_path, else the records' sp_path; a model other than the one the records were made with is refused,
    naming that one."""
    made_with = [(path, info.sp_path) for path, info in records if info.sp_path]
    sp_path = FLAGS.sp_path or next((sp for _, sp in made_with if os.path.isfile(sp)), None)
    if not sp_path:
        where = f" (the records' {made_with[0][1]} is gone)" if made_with else ""
        raise ConfigError(f"--sp_path is needed: the SentencePiece model the records were made with{where}")
    expected = (recorded or {}).get("sp_model_sha256")
    if expected and provenance.sha256_of(sp_path) not in expected and not FLAGS.sp_path:
        raise ConfigError(f"{sp_path}, the records' sp_path, has changed since they were made ({run_config} records "
                          "another sha256): pass --sp_path=<the model they were made with>")
    if expected and provenance.sha256_of(sp_path) not in expected:
        named = (f"{made_with[0][1]} (sp_path in {made_with[0][0]})" if made_with
                 else f"the model of sha256 {expected[0][:12]}...")
        raise ConfigError(f"--sp_path={sp_path} is not the SentencePiece model of the records the model was trained "
                          f"on ({run_config} records its sha256): pass {named}")
    return sp_path


def config_from_flags():
    from xlnet_data.pretrain import checkpoints, hf

    if not FLAGS.output_dir:
        raise ConfigError("--output_dir is needed")
    if FLAGS.checkpoint == held_out.BEST_NAME:  # the lowest held-out loss of --model_dir's run
        if not FLAGS.model_dir:
            raise ConfigError(f"--checkpoint={held_out.BEST_NAME} needs the --model_dir whose best checkpoint it is")
        checkpoint, where = held_out.best_checkpoint(FLAGS.model_dir), FLAGS.model_dir
    elif FLAGS.checkpoint:
        checkpoint, where = FLAGS.checkpoint, _settings_dir(FLAGS.checkpoint)
    elif FLAGS.model_dir:
        checkpoint, where = checkpoints.latest(FLAGS.model_dir), FLAGS.model_dir
        if not checkpoint and hf.is_hf_dir(FLAGS.model_dir):  # train_torch's: the model_dir holds its latest weights
            checkpoint = FLAGS.model_dir
        if not checkpoint:
            raise ConfigError(f"--model_dir={FLAGS.model_dir} holds no checkpoint (no `checkpoint` file listing one)")
    else:
        raise ConfigError("--model_dir or --checkpoint is needed")
    xlnet_config = FLAGS.xlnet_config or os.path.join(where, "xlnet_config.json")
    if FLAGS.xlnet_config and not os.path.isfile(FLAGS.xlnet_config):
        raise ConfigError(f"--xlnet_config={FLAGS.xlnet_config}: no such file")
    if not os.path.isfile(xlnet_config):
        raise ConfigError(f"--xlnet_config is needed: no xlnet_config.json in {where}")
    run_config = os.path.join(where, "run_config.json")
    run, recorded = RunConfig(), None
    if os.path.isfile(run_config):
        run, recorded = RunConfig.from_json(run_config), save_dir.read_json(run_config)
    records = _records(recorded)
    sp_path = _sp_path(run_config, recorded, records)
    fine_tuning = dataclasses.replace(hf.fine_tuning_run(run),
                                      **{name: FLAGS[name].value for name in _RUN_FLAGS if FLAGS[name].present})
    config = ExportConfig(checkpoint=checkpoint, model=XLNetConfig.from_json(xlnet_config), run=fine_tuning,
                          pretraining=run if recorded else None, sp_path=sp_path, output_dir=FLAGS.output_dir,
                          overwrite=FLAGS.overwrite, **settings.tokenizer_settings(run_config, recorded, given={
                              name: FLAGS[name].value for name in settings.TOKENIZER_KEYS if FLAGS[name].present}))
    return config, records


def _agreement(config, records) -> tuple[str, str]:
    """The tokenizer's agreement with create's ids on lines of the records' corpus, in words, and the corpus's
    globs ("" when there are none), which the sentence leaves out (the card shows their file names only)."""
    from xlnet_data.dataformat import hf_tokenizer
    from xlnet_data.dataformat.vocab import load_sentencepiece
    from xlnet_data.datagen import hf_agreement

    globs = ",".join(info.input_glob for _, info in records if info.input_glob)
    lines = hf_agreement.corpus_lines(globs, FLAGS.agreement_lines) if globs and FLAGS.agreement_lines else []
    if not lines:
        return ("not measured: " + ("--agreement_lines=0" if not FLAGS.agreement_lines else
                                    "the corpus is not there" if globs else "no records recorded")), globs
    tokenizer = hf_tokenizer.tokenizer_files(config.sp_path, config.uncased, config.keep_accents)["tokenizer.json"]
    agreement = hf_agreement.measure(load_sentencepiece(config.sp_path), tokenizer.decode("utf-8"), lines,
                                     config.uncased, config.keep_accents)
    if agreement is None:
        return "not measured: needs the tokenizers package (pip install tokenizers, or xlnet-data[hf])", globs
    return agreement.describe(), globs


def main(argv):
    del argv
    config, records = config_from_flags()  # a UserError or OSError is cli.run's line
    import tensorflow as tf

    from xlnet_data.pretrain import hf, hf_card
    agreement, globs = _agreement(config, records)
    corpus = lambda shown: f" (the corpus: {shown})" if shown else ""
    try:
        result = hf.export(config, hf_card.model_card(config, records,
                                                      agreement + corpus(hf_card.public_name(globs))))
    except tf.errors.OpError as err:  # a checkpoint that is not there or not readable
        return cli.fail("export_hf", err.message)
    run = config.run
    print(f"wrote {config.output_dir}: {result.num_tensors} tensors ({result.num_parameters:,} parameters) of "
          f"{config.checkpoint}; config.json with mem_len={run.mem_len or None}, reuse_len={run.reuse_len or None}, "
          f"bi_data={run.bi_data}, clamp_len={run.clamp_len}, same_length={run.same_length}"
          f"{'; the training run in ' + hf.PRETRAINING_FILE if config.pretraining else ''}; tokenizer of "
          f"{config.sp_path} ({'uncased' if config.uncased else 'cased'}, "
          f"{'accents kept' if config.keep_accents else 'accents stripped'}): {agreement}{corpus(globs)}",
          file=sys.stderr)
    return 0


def run():
    cli.run(main, "export_hf", __doc__, define_flags)


if __name__ == "__main__":
    run()
