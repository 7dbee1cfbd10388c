"""The frozen configuration of a `prepare` run, and its validation."""

import dataclasses

from xlnet_data.common.errors import UserError

FORMATS = ("auto", "text", "jsonl", "parquet")
# How a plain-text file holds documents and paragraphs.
TEXT_LAYOUTS = {
    "blank_line": "a blank line ends a document; each line is a paragraph",
    "file": "each file is one document; each line is a paragraph (blank lines are ignored)",
    "file_wrapped": "each file is one document; a blank line ends a paragraph and the lines inside a paragraph "
                    "are joined (hard-wrapped text such as Project Gutenberg's)",
}


class PrepareError(UserError, ValueError):
    """A problem the user can fix: a flag, an input file (named with its line or row), the output directory."""


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
    input_glob: str
    output_dir: str
    format: str = "auto"  # auto: from the file name (.jsonl/.json/.ndjson, .parquet, else text)
    text_key: str = "text"  # the field (JSON lines) or column (Parquet) holding a document
    text_layout: str = "blank_line"
    language: str = "en"  # ISO 639 code for the sentence splitter's rules
    num_shards: int = 1
    num_workers: int = 1
    dedup: bool = True  # drop exact duplicates (after whitespace normalisation) of an earlier document
    overwrite: bool = False
    # The held-out share (shards.py's DEV_DIR): this fraction of the documents, or this many, chosen by their hash.
    dev_fraction: float = 0.0
    dev_documents: int = 0
    dev_shards: int = 1

    def validate(self):
        if not self.input_glob:
            raise PrepareError("--input_glob is required: the raw files, e.g. 'corpus/*.jsonl.gz'")
        if not self.output_dir:
            raise PrepareError("--output_dir is required: where the shards go")
        if self.format not in FORMATS:
            raise PrepareError(f"format must be one of {', '.join(FORMATS)}, not {self.format!r}")
        if self.text_layout not in TEXT_LAYOUTS:
            raise PrepareError(f"text_layout must be one of {', '.join(TEXT_LAYOUTS)}, not {self.text_layout!r}")
        if not self.text_key:
            raise PrepareError("--text_key must name the field or column holding the text")
        if not self.language:
            raise PrepareError("--language must be a language code such as en, zh or hi")
        if self.num_shards < 1:
            raise PrepareError(f"num_shards must be at least 1, not {self.num_shards}")
        if self.num_workers < 1:
            raise PrepareError(f"num_workers must be at least 1, not {self.num_workers}")
        if not 0 <= self.dev_fraction < 1:  # NaN fails too
            raise PrepareError(f"--dev_fraction={self.dev_fraction} must be in [0, 1)")
        if self.dev_documents < 0 or self.dev_shards < 1:
            raise PrepareError(f"--dev_documents={self.dev_documents} must be >= 0 and --dev_shards="
                               f"{self.dev_shards} >= 1")
        if self.dev_fraction and self.dev_documents:
            raise PrepareError("--dev_fraction and --dev_documents both set: give one (a share, or a count)")
        return self
