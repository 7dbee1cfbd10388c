"""python -m xlnet_data.export_hf: a checkpoint to a directory that Hugging Face Transformers loads.

    python -m xlnet_data.export_hf --model_dir=models/my --sp_path=spm/my.model --output_dir=hf/my

writes config.json, model.safetensors and the tokenizer (spiece.model, tokenizer.json,
tokenizer_config.json); then XLNetLMHeadModel.from_pretrained("hf/my") and
AutoTokenizer.from_pretrained("hf/my") load it, the tokenizer normalising text as create did
(--uncased, --keep_accents: the records', through the training run's run_config.json). From the
latest checkpoint of --model_dir, or a given --checkpoint (ours or an original TF1 one, with
--xlnet_config). Needs safetensors, not PyTorch or Transformers. train_gpu --init_checkpoint=hf/my
reads such a directory back.
"""

import dataclasses
import os
import sys

from absl import flags

from xlnet_data import cli
from xlnet_data.common.errors import ConfigError
from xlnet_data.dataformat import provenance, save_dir, settings
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
    flags.DEFINE_string("sp_path", None, "The SentencePiece model the records were made with (becomes the tokenizer).")
    flags.DEFINE_string("output_dir", None, "The directory to write (created if needed).")
    flags.DEFINE_bool("overwrite", default["overwrite"], "Replace an export already in --output_dir.")
    flags.DEFINE_bool("uncased", None, "The tokenizer lower-cases, as create --uncased did (default: the training "
                      f"run's, from run_config.json; else {default['uncased']}). Refused where it contradicts "
                      "run_config.json.")
    flags.DEFINE_bool("keep_accents", None, "The tokenizer keeps accents, as create --keep_accents did (default: the "
                      f"records', from the training run's run_config.json; else {default['keep_accents']}, the "
                      "original's stripping). Refused where it contradicts run_config.json.")
    flags.DEFINE_integer("mem_len", None, "config.json's mem_len (default: the training run's, from run_config.json; "
                         "else none). 0: no memory.")
    flags.DEFINE_integer("reuse_len", None, "config.json's reuse_len (default: the training run's; else none).")
    flags.DEFINE_bool("bi_data", None, "config.json's bi_data (default: the training run's; else "
                      f"{default['bi_data']}). Fine-tuning wants False: with True, half of every batch gets backward "
                      "positions.")
    flags.DEFINE_integer("clamp_len", None, "config.json's clamp_len (default: the training run's; else "
                         f"{default['clamp_len']}).")
    flags.DEFINE_bool("same_length", None, "config.json's same_length (default: the training run's; else "
                      f"{default['same_length']}).")


def _settings_dir(checkpoint):
    """Where the checkpoint's xlnet_config.json and run_config.json are looked for."""
    return checkpoint if os.path.isdir(checkpoint) else os.path.dirname(os.path.abspath(checkpoint))


def config_from_flags():
    from xlnet_data.pretrain import checkpoints

    for name in ("sp_path", "output_dir"):
        if not FLAGS[name].value:
            raise ConfigError(f"--{name} is needed")
    if FLAGS.checkpoint == held_out.BEST_NAME:  # the lowest held-out loss of --model_dir's run
        if not FLAGS.model_dir:
            raise ConfigError(f"--checkpoint={held_out.BEST_NAME} needs the --model_dir whose best checkpoint it is")
        checkpoint, where = held_out.best_checkpoint(FLAGS.model_dir), FLAGS.model_dir
    elif FLAGS.checkpoint:
        checkpoint, where = FLAGS.checkpoint, _settings_dir(FLAGS.checkpoint)
    elif FLAGS.model_dir:
        checkpoint, where = checkpoints.latest(FLAGS.model_dir), FLAGS.model_dir
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
        run = RunConfig.from_json(run_config)
        recorded = save_dir.read_json(run_config)
        if recorded.get("sp_model_sha256") and provenance.sha256_of(FLAGS.sp_path) not in recorded["sp_model_sha256"]:
            raise ConfigError(f"--sp_path={FLAGS.sp_path} is not the SentencePiece model of the records the model was "
                              f"trained on ({run_config} records its sha256): pass that model")
    run = dataclasses.replace(run, **{name: FLAGS[name].value for name in _RUN_FLAGS if FLAGS[name].present})
    return ExportConfig(checkpoint=checkpoint, model=XLNetConfig.from_json(xlnet_config), run=run,
                        sp_path=FLAGS.sp_path, output_dir=FLAGS.output_dir, overwrite=FLAGS.overwrite,
                        **settings.tokenizer_settings(run_config, recorded, given={
                            name: FLAGS[name].value for name in settings.TOKENIZER_KEYS if FLAGS[name].present}))


def main(argv):
    del argv
    config = config_from_flags()  # a UserError or OSError is cli.run's line
    import tensorflow as tf

    from xlnet_data.pretrain import hf
    try:
        result = hf.export(config)
    except tf.errors.OpError as err:  # a checkpoint that is not there or not readable
        return cli.fail("export_hf", err.message)
    run = config.run
    print(f"wrote {config.output_dir}: {result.num_tensors} tensors ({result.num_parameters:,} parameters) of "
          f"{config.checkpoint}; config.json with mem_len={run.mem_len or None}, reuse_len={run.reuse_len or None}, "
          f"bi_data={run.bi_data}, clamp_len={run.clamp_len}, same_length={run.same_length}; tokenizer of "
          f"{config.sp_path} ({'uncased' if config.uncased else 'cased'}, "
          f"{'accents kept' if config.keep_accents else 'accents stripped'})", file=sys.stderr)
    return 0


def run():
    cli.run(main, "export_hf", __doc__, define_flags)


if __name__ == "__main__":
    run()
