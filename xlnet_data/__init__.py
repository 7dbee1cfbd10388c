"""xlnet-data: XLNet pretraining data, identical to the original's, made fast; and a TF2 XLNet to train on it.

The Python API (the commands `python -m xlnet_data.create|dump|spm_train|train_gpu` call the same):

    import xlnet_data as xd

    xd.train_sentencepiece(xd.SpmTrainConfig(input_files=("corpus/a.txt",), model_prefix="spm/my",
                                             vocab_size=8000))
    config = xd.CreateConfig(input_glob="corpus/*.txt", sp_path="spm/my.model", save_dir="proc_data/my",
                             seq_len=128, reuse_len=64, bsz_per_host=8, num_core_per_host=1,
                             num_predict=21, num_passes=2).validate()
    summary = xd.create_records(config, num_workers=2)       # -> CreateSummary
    for features in xd.read_examples("proc_data/my"):         # {"input": int64 array, ...}
        ...
    xd.train(xd.TrainConfig(...))                             # TensorFlow is imported only here

Names are imported when first used, so `import xlnet_data` stays cheap and never loads TensorFlow.
"""

import importlib

__version__ = "0.1.0"

_API = {
    "CreateConfig": "xlnet_data.datagen.config",
    "create_records": "xlnet_data.datagen.job",
    "CreateSummary": "xlnet_data.datagen.job",
    "read_examples": "xlnet_data.dataformat.selection",
    "decode_example": "xlnet_data.dataformat.inspection",
    "SpmTrainConfig": "xlnet_data.datagen.tokenizer",
    "train_sentencepiece": "xlnet_data.datagen.tokenizer",
    "TrainConfig": "xlnet_data.pretrain.config",
    "train": "xlnet_data.pretrain.training",
}
__all__ = sorted(_API)


def __getattr__(name):
    if name not in _API:
        raise AttributeError(f"module 'xlnet_data' has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)


def __dir__():
    return sorted(list(globals()) + __all__)
