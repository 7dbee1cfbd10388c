"""The data settings a reader reads records by, from what create recorded: one resolver, one policy per reader.

create writes the settings into corpus_info.json (corpus_info.py); train_gpu, dump and export_hf read them back
here. They differ only in what a flag may do, and in what stands in for a missing corpus_info.json:

    train_settings     train_gpu: a flag must agree with every record dir's corpus_info.json (else ConfigError);
                       without one, the flags or their defaults
    records_settings   dump: a flag overrides corpus_info.json (it is for looking at odd records); without one,
                       the records' file name, with a warning where the two disagree
    tokenizer_settings export_hf: uncased and keep_accents as train_gpu recorded them (run_config.json, from the
                       records' corpus_info.json); a flag must agree

`resolve` is the rule they share; TRAIN_FLAGS maps train_gpu's flags (the original's names) to the keys.
"""

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from xlnet_data.common.errors import ConfigError
from xlnet_data.dataformat import provenance, save_dir, validation
from xlnet_data.dataformat.corpus_info import CorpusInfo
from xlnet_data.dataformat.examples import generated

# train_gpu's flag -> corpus_info.json's key.
TRAIN_FLAGS = {"train_batch_size": "bsz_per_host", "num_core_per_host": "num_core_per_host", "seq_len": "seq_len",
               "reuse_len": "reuse_len", "bi_data": "bi_data", "uncased": "uncased", "mask_alpha": "mask_alpha",
               "mask_beta": "mask_beta", "num_predict": "num_predict", "n_token": "vocab_size",
               "keep_accents": "keep_accents"}
# What reading a record needs beyond the record itself (dump's flags have the keys' names).
READ_KEYS = ("seq_len", "reuse_len", "bsz_per_host", "num_core_per_host", "bi_data", "num_predict")
# How create normalised the text: what a tokenizer of the trained model must repeat.
TOKENIZER_KEYS = ("uncased", "keep_accents")


def _contradiction(flag, given, key, value, where) -> str:
    return f"--{flag}={given} contradicts the records: {key}={value} in {where}"


def resolve(recorded_in: Sequence[tuple[str, Any]], names: Mapping[str, str], given: Mapping[str, Any],
            defaults: Mapping[str, Any], *, given_wins: bool = False,
            contradiction: Callable[..., str] = _contradiction) -> dict[str, tuple[Any, Optional[str]]]:
    """{flag: (value, where it comes from)} of the flags `names` (flag -> key).

    recorded_in: (where, a CorpusInfo or a {key: value}) in order of trust; given: the flags the user set;
    defaults: where nothing is recorded or given (where None). given_wins: a given flag is taken as it is
    (dump); else it must equal every recorded value (ConfigError with `contradiction`'s line), and the places
    must agree with each other; where they may not (given_wins), the first one that has the key wins.
    """
    values = {}
    for flag, key in names.items():
        if given_wins and flag in given:
            values[flag] = (given[flag], "flag")
            continue
        for where, info in recorded_in:
            value = info.value(key) if isinstance(info, CorpusInfo) else info.get(key)
            if value is None:
                continue
            if flag in given and given[flag] != value:
                raise ConfigError(contradiction(flag, given[flag], key, value, where))
            if flag in values:
                if given_wins:
                    continue
                if values[flag][0] != value:
                    raise ConfigError(f"--record_info_dir: the records disagree: {key}={values[flag][0]} in "
                                      f"{values[flag][1]}, {key}={value} in {where}")
            values[flag] = (value, where)
        if flag not in values:
            values[flag] = (given[flag], f"--{flag}") if flag in given else (defaults.get(flag), None)
    return values


# ----- train_gpu ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RecordDir:
    """One of train_gpu's --record_info_dir: its tfrecords/ folder and corpus_info.json (None: there is none)."""

    tfrecords: str
    corpus_info_path: Optional[str]
    corpus_info: Optional[CorpusInfo]


def find_record_dirs(record_info_dir: str, sp_path: Optional[str] = None) -> list[RecordDir]:
    """The comma-separated record dirs, each checked (its units one run's, its corpus_info.json against its
    records or token cache; `sp_path`, a --sp_path given, against the model they were made with); ConfigError
    when one holds no records."""
    found = []
    for given in record_info_dir.split(","):
        tfrecords = save_dir.tfrecords_dir(given)
        if not save_dir.record_info_paths(tfrecords):
            raise ConfigError(f"--record_info_dir: no records (record_info-*.json) in {os.path.abspath(tfrecords)}")
        model_sha256 = validation.check_units_agree(tfrecords)
        if sp_path and model_sha256 and provenance.sha256_of(sp_path) != model_sha256:
            raise ConfigError(f"--sp_path={sp_path} is not the SentencePiece model the records of {given} were made "
                              "with (their record_info's made_from.model_sha256 is another); give that model")
        path = save_dir.find_corpus_info(tfrecords)
        info = CorpusInfo.read(path) if path else None
        if info:
            validation.check_corpus_info(path, info, tfrecords)
        for unit in generated.find_cache_units(tfrecords, sp_path):  # create --write_records=false: its token cache
            generated.check_cache(unit)
            if info:
                generated.check_corpus_info(path, info, unit)
        found.append(RecordDir(tfrecords, path, info))
    return found


def train_settings(record_dirs: Sequence[RecordDir], given: Mapping[str, Any],
                   defaults: Mapping[str, Any]) -> dict[str, tuple[Any, Optional[str]]]:
    """{flag: (value, where from)} of TRAIN_FLAGS: those the user set (`given`) checked against every record
    dir's corpus_info.json, the others taken from it, else `defaults`; ConfigError for a contradiction, and
    for a setting nothing gives (num_predict may stay None: every position is predicted)."""
    infos = [(d.corpus_info_path, d.corpus_info) for d in record_dirs if d.corpus_info]
    values = resolve(infos, TRAIN_FLAGS, given, defaults)
    missing = [f"--{flag}" for flag, (value, _) in values.items() if value is None and flag != "num_predict"]
    if missing:
        raise ConfigError(f"{', '.join(missing)} needed: no corpus_info.json next to {record_dirs[0].tfrecords} to "
                          "read them from")
    return values


def check_train_config(tfrecords_dirs: Sequence[str], given: Mapping[str, Any], fields: Mapping[str, str]) -> None:
    """The Python API's train_settings: a TrainConfig states every setting itself (its defaults are the original
    train_gpu.py's, not the records'), so each must agree with every record dir's corpus_info.json. given: {flag
    of TRAIN_FLAGS: the config's value}; fields: {flag: the field's name for the message}. ConfigError names the
    field, the records' value and the file."""
    def contradiction(flag, value, key, recorded, where):
        return (f"{fields[flag]}={value!r} contradicts the records: {key}={recorded!r} in {where}; set it to the "
                "records' value")
    infos = [(path, CorpusInfo.read(path)) for path in map(save_dir.find_corpus_info, tfrecords_dirs) if path]
    resolve(infos, {flag: TRAIN_FLAGS[flag] for flag in given}, given, {}, contradiction=contradiction)


# ----- dump --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RecordsSettings:
    """What dump reads records by (READ_KEYS, those known), where each comes from ("flag", "corpus_info.json",
    "file name", "default"), the corpus_info.json used, and what the user should hear of it."""

    values: dict
    sources: dict
    corpus_info: Optional[CorpusInfo]
    corpus_info_path: Optional[str]
    warnings: list


def name_settings(path: str) -> dict:
    """The settings a records file name encodes (save_dir.py's scheme), or {} where it has none."""
    parsed = save_dir.parse_name(path)
    if parsed is None:
        return {}
    return {key: value for key, value in dataclasses.asdict(parsed.settings).items() if value is not None}


def records_settings(files: Sequence[str], info_candidates: Sequence[str], overrides: Mapping[str, Any],
                     corpus_info_path: Optional[str] = None) -> RecordsSettings:
    """The settings to read `files` by: flags (`overrides`, None: not given) > corpus_info.json (the given
    `corpus_info_path`, else the first of `info_candidates` that exists) > the first file's name > defaults."""
    if corpus_info_path and not os.path.isfile(corpus_info_path):
        raise save_dir.SaveDirError(f"corpus_info.json not found: {corpus_info_path}")
    info_path = corpus_info_path or next((c for c in info_candidates if os.path.isfile(c)), None)
    info = None
    if info_path:
        try:
            info = CorpusInfo.read(info_path)
        except OSError as err:
            raise save_dir.SaveDirError(f"cannot read {info_path}: {err}") from None
    from_name = name_settings(files[0]) if files else {}
    given = {key: value for key, value in overrides.items() if value is not None}
    places = [("corpus_info.json", info)] if info else []
    resolved = resolve(places + [("file name", from_name)], dict(zip(READ_KEYS, READ_KEYS)), given, {},
                       given_wins=True)
    values = {key: value for key, (value, _) in resolved.items() if value is not None}
    sources = {key: where for key, (value, where) in resolved.items() if value is not None}
    warnings = []
    clash = [key for key in ("seq_len", "reuse_len", "bsz_per_host", "bi_data")
             if info and getattr(info, key) is not None and key in from_name and from_name[key] != getattr(info, key)]
    if clash:
        warnings.append(f"{info_path} disagrees with the file name on {', '.join(clash)}; "
                        "using corpus_info.json (override with flags)")
    if values.get("bi_data") and "num_core_per_host" not in values:
        values["num_core_per_host"], sources["num_core_per_host"] = 1, "default"
        warnings.append("num_core_per_host unknown (no corpus_info.json): assuming 1 to tell backward rows; "
                        "pass --num_core_per_host")
    if "bi_data" not in values:
        values["bi_data"], sources["bi_data"] = False, "default"
        warnings.append("bi_data unknown: treating every row as forward; pass --bi_data")
    return RecordsSettings(values, sources, info, info_path, warnings)


# ----- export_hf ---------------------------------------------------------------------------------------------


def _tokenizer_contradiction(flag, given, key, value, where) -> str:
    return (f"--{'' if given else 'no'}{flag} contradicts the records the model was trained on: "
            f"{key}={str(value).lower()} in {where}; drop the flag (the tokenizer must normalise text as create did)")


def tokenizer_settings(run_config_path: str, run_config: Optional[Mapping[str, Any]],
                       given: Mapping[str, Any]) -> dict[str, bool]:
    """TOKENIZER_KEYS as the training run recorded them (run_config.json: train_gpu took them from the records'
    corpus_info.json; None: there is none), else the flags, else False; a flag that contradicts the run's would
    make a tokenizer that gives other pieces than the model learnt from: ConfigError."""
    places = [(run_config_path, run_config)] if run_config else []  # a key it lacks is left to the flag
    resolved = resolve(places, dict(zip(TOKENIZER_KEYS, TOKENIZER_KEYS)), given, {},
                       contradiction=_tokenizer_contradiction)
    return {key: bool(value) for key, (value, _) in resolved.items()}
