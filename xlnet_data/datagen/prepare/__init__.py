"""prepare: raw documents (plain text, JSON lines, Parquet; plain or compressed) → the input format of
create (one sentence per line, `<eop>` glued to a paragraph's last sentence, a blank line after each
document), in shards of similar size.

    config.py     PrepareConfig (every flag), PrepareError
    readers.py    files → documents (lists of paragraphs), by format and compression
    sentences.py  a document → its block of the input format (whitespace, sentence splitting, <eop>)
    languages.py  per-language rules over the splitter (abbreviations, initials, list numbers, Thai spaces)
    shards.py     the run: files in parallel into parts, duplicates dropped, parts cut into shards
"""

from xlnet_data.datagen.prepare.config import FORMATS, TEXT_LAYOUTS, PrepareConfig, PrepareError
from xlnet_data.datagen.prepare.shards import PrepareSummary, prepare, shard_paths

__all__ = ["FORMATS", "TEXT_LAYOUTS", "PrepareConfig", "PrepareError", "PrepareSummary", "prepare", "shard_paths"]
