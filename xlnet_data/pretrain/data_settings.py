"""The data settings of a training run, read from the records that create wrote (train_gpu's library).

    find_record_dirs   the comma-separated record dirs, checked, with their corpus_info.json
    data_settings      the data flags' values: the records' corpus_info.json, or the user's (checked
                       against it), or the defaults
    check_vocabulary   a Transformers directory's spiece.model must be the records' SentencePiece model

No TensorFlow here: a wrong flag or missing records fail before it loads.
"""

import os
from collections.abc import Mapping
from typing import Any

from xlnet_data.common.errors import ConfigError
from xlnet_data.dataformat import save_dir, validation
from xlnet_data.dataformat.examples import generated

# flag -> corpus_info.json key
DATA_FLAGS = {"train_batch_size": "bsz_per_host", "num_core_per_host": "num_core_per_host", "seq_len": "seq_len",
              "reuse_len": "reuse_len", "bi_data": "bi_data", "uncased": "uncased", "mask_alpha": "mask_alpha",
              "mask_beta": "mask_beta", "num_predict": "num_predict", "n_token": "vocab_size",
              "keep_accents": "keep_accents"}


def find_record_dirs(record_info_dir: str):
    """[(tfrecords dir, corpus_info.json path or None)] of the comma-separated dirs; ConfigError when one
    holds no records."""
    found = []
    for given in record_info_dir.split(","):
        tfrecords = save_dir.tfrecords_dir(given)
        if not save_dir.record_info_paths(tfrecords):
            raise ConfigError(f"--record_info_dir: no records (record_info-*.json) in {os.path.abspath(tfrecords)}")
        validation.check_units_agree(tfrecords)
        corpus_info = save_dir.find_corpus_info(tfrecords)
        if corpus_info:
            validation.check_corpus_info(corpus_info, save_dir.read_json(corpus_info), tfrecords)
        for unit in generated.find_cache_units(tfrecords):  # create --write_records=false: its token cache
            generated.check_cache(unit)
            if corpus_info:
                generated.check_corpus_info(corpus_info, save_dir.read_json(corpus_info), unit)
        found.append((tfrecords, corpus_info))
    return found


def data_settings(record_dirs, given: Mapping[str, Any], defaults: Mapping[str, Any]):
    """{flag: (value, where it comes from)} of the DATA_FLAGS: those the user set (`given`, flag -> value)
    checked against the records' corpus_info.json, the others taken from it (or from `defaults`, flag ->
    value, where there is none). record_dirs as find_record_dirs returns them."""
    infos = [(path, save_dir.read_json(path)) for _, path in record_dirs if path]
    values = {}
    for flag, key in DATA_FLAGS.items():
        for path, info in infos:
            recorded = validation.recorded(info, key)
            if recorded is None:
                continue
            if flag in given and given[flag] != recorded:
                raise ConfigError(f"--{flag}={given[flag]} contradicts the records: {key}={recorded} in {path}")
            if flag in values and values[flag][0] != recorded:
                raise ConfigError(f"--record_info_dir: the records disagree: {key}={values[flag][0]} in "
                                  f"{values[flag][1]}, {key}={recorded} in {path}")
            values[flag] = (recorded, path)
        if flag not in values:
            values[flag] = (given[flag], f"--{flag}") if flag in given else (defaults.get(flag), None)
    missing = [f"--{flag}" for flag, (value, _) in values.items() if value is None and flag != "num_predict"]
    if missing:
        raise ConfigError(f"{', '.join(missing)} needed: no corpus_info.json next to {record_dirs[0][0]} to read "
                          "them from")
    return values


def check_vocabulary(hf_dir, record_dirs):
    """A Transformers directory's spiece.model must be the records' SentencePiece model (corpus_info.json's
    sp_path), where both files are there to compare."""
    from xlnet_data.dataformat import hf_tokenizer
    ours = os.path.join(hf_dir, "spiece.model")
    for _, info_path in record_dirs:
        sp_path = save_dir.read_json(info_path).get("sp_path") if info_path else None
        if not (sp_path and os.path.isfile(sp_path) and os.path.isfile(ours)):
            continue
        difference = hf_tokenizer.vocabulary_difference(ours, sp_path)
        if difference:
            raise ConfigError(f"--init_checkpoint={hf_dir} has another vocabulary than the records (sp_path in "
                              f"{info_path}): {difference}")
