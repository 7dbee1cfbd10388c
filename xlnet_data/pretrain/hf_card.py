"""The model card (README.md) of an export: what the model was trained on, its settings, and how to load it."""

from __future__ import annotations

import os

from xlnet_data.dataformat import record_info, save_dir
from xlnet_data.dataformat.corpus_info import CorpusInfo
from xlnet_data.pretrain.config import ExportConfig

_RECORD_KEYS = ("vocab_size", "seq_len", "reuse_len", "bsz_per_host", "num_predict", "bi_data", "uncased",
                "keep_accents", "mask_alpha", "mask_beta")


def _train_tokens(corpus_info_path: str) -> int:
    """The train split's tokens, each task once (its pass 0), from the record_infos beside corpus_info.json:
    corpus_info.json's input_counts name only the files with <unk> or marks lost."""
    tokens = 0
    for info_path in save_dir.record_info_paths(save_dir.tfrecords_dir(os.path.dirname(corpus_info_path))):
        name = save_dir.parse_name(info_path)
        if name is not None and name.split == "train" and name.pass_id == 0:
            tokens += save_dir.read_json(info_path).get(record_info.COUNTS_KEY, {}).get("tokens", 0)
    return tokens


def public_name(path: str) -> str:
    """What the card shows of a path (or a comma-separated list of globs): the file name, the machine's folders
    left out (a card pushed to the Hub would publish a home directory)."""
    return ",".join(os.path.basename(part.rstrip("/")) for part in path.split(","))


def _records_lines(records: list[tuple[str, CorpusInfo]]) -> list[str]:
    if not records:
        return ["- not recorded (an original checkpoint, or a training run from before run_config.json named its "
                "records)"]
    lines = []
    for path, info in records:
        tokens = _train_tokens(path)
        settings = ", ".join(f"{key}={info.value(key)}" for key in _RECORD_KEYS if info.value(key) is not None)
        records_dir = public_name(os.path.dirname(os.path.abspath(path)))
        lines.append(f"- `{records_dir}` (its `corpus_info.json`): made by xlnet-data create from "
                     f"`{public_name(info.input_glob or '')}`{f' ({tokens:,} tokens)' if tokens else ''} with "
                     f"`{public_name(info.sp_path or '')}`; {settings}")
    return lines


def model_card(cfg: ExportConfig, records: list[tuple[str, CorpusInfo]], agreement: str) -> str:
    """README.md of the export of cfg: the data, the settings, the tokenizer's measured agreement (`agreement`,
    a sentence) and which tokenizer class to load it with."""
    model, run, pre = cfg.model, cfg.run, cfg.pretraining
    pretraining = (f"mem_len={pre.mem_len}, reuse_len={pre.reuse_len}, bi_data={pre.bi_data}, clamp_len="
                   f"{pre.clamp_len}, same_length={pre.same_length}, in `xlnet_pretraining.json`, which "
                   "`train_gpu --init_checkpoint=THIS_DIR` continues with" if pre else "not recorded")
    return "\n".join([
        "---", "library_name: transformers", "tags: [xlnet, xlnet-data]", "---", "",
        f"# XLNet ({model.n_layer} layers, d_model {model.d_model}, {model.n_token} pieces), pretrained with xlnet-data",
        "", "## Data", "", *_records_lines(records), "",
        "## Settings", "",
        f"- model: n_layer={model.n_layer}, d_model={model.d_model}, n_head={model.n_head}, d_head={model.d_head}, "
        f"d_inner={model.d_inner}, ff_activation={model.ff_activation}, untie_r={model.untie_r}",
        f"- weights: `{public_name(cfg.checkpoint)}`",
        f"- pretraining: {pretraining}",
        f"- `config.json`: set for fine-tuning: bi_data={run.bi_data}, mem_len={run.mem_len or None}, reuse_len="
        f"{run.reuse_len or None} (with bi_data, Transformers splits every batch into forward and backward halves: "
        "a batch of one text gets empty logits)", "",
        "## Tokenizer", "",
        f"The SentencePiece model of the records (`spiece.model`), normalising text as create did "
        f"({'uncased' if cfg.uncased else 'cased'}, {'accents kept' if cfg.keep_accents else 'accents stripped'}).",
        f"Agreement with create's ids, measured at export: {agreement}.", "",
        "Load it with `AutoTokenizer` or `XLNetTokenizer`: both run `tokenizer.json` as written and give create's "
        "pieces, Korean and Japanese included (`trust_remote_code` in `tokenizer_config.json` is what makes "
        "Transformers 5's `XLNetTokenizer` read `tokenizer.json`; no code is loaded, this folder has none).",
        "A tokenizer saved again by `save_pretrained` loses that key: `XLNetTokenizer` would then build its own "
        "normaliser, which turns Korean syllables into jamo (`<unk>` to this model) and drops Japanese voicing "
        "marks and every other nonspacing mark; load such a copy with `AutoTokenizer`, or copy this folder's "
        "`tokenizer_config.json` into it.", "",
        "## Use", "",
        "```python",
        "from transformers import AutoTokenizer, XLNetForSequenceClassification",
        'tokenizer = AutoTokenizer.from_pretrained("THIS_DIR")',
        'model = XLNetForSequenceClassification.from_pretrained("THIS_DIR", num_labels=2)',
        'logits = model(**tokenizer(["One text."], return_tensors="pt")).logits  # (1, 2)',
        "```", ""])
