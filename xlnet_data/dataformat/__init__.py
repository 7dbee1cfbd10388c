"""The on-disk contract: what a save_dir holds, for its writer (datagen/, create) and its readers (pretrain/,
train_gpu; dump; export_hf) alike. No TensorFlow.

    save_dir.py      file names both ways (records, record_info, corpus_info, token caches), JSON reading
    corpus_info.py   corpus_info.json as a typed CorpusInfo, with its format version
    record_info.py   what create adds to a unit's record_info (create_settings, counts, the token cache)
    settings.py      the one resolver of the data settings that readers read the records by
    records.py, record_reader.py, crc32c.py    the Example schema, the record writer and reader, CRC-32C
    validation.py    corpus_info, record_info and the records checked against each other
    provenance.py    what each unit was made from, checked on a re-run
    token_cache.py   a task's token cache: its files, index and stream
    vocab.py, hf_tokenizer.py    XLNet's special ids and SentencePiece; the Transformers tokenizer files
    examples/        how a unit's examples are made from its stream (written by create, made again from a cache)
    inspection.py, stats.py, selection.py    reading records back for people (dump's library)
"""
