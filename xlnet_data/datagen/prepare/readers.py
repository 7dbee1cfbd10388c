"""Raw files → documents, each a list of paragraph strings, streamed (one document in memory at a time).

Formats: plain text (see config.TEXT_LAYOUTS), JSON lines (one object per line, the text in a field;
what `datasets` writes with to_json), Parquet (a string column; what `datasets` writes with to_parquet).
Text and JSON lines may be compressed (gzip, bzip2, xz, zstd), recognised by their first bytes as create
does (fileio.open_decompressed) and read to their end marker: a truncated file is refused. The format
is told by the name without its compression suffix (.gz, .bz2, .xz, .zst/.zstd). zstd needs the
zstandard package, Parquet pyarrow: the `prepare` extra.

Lines, in every format, end at \n, \r\n, \r and the Unicode line and paragraph separators (U+2028,
U+2029); a JSON or Parquet text is cut into paragraphs there, as a plain-text file into lines. The other
characters str.splitlines() would cut at (\v \f \x1c-\x1e \x85) are whitespace inside a paragraph:
a form feed between two pages of a PDF's text often falls inside a sentence, and \x85 is "…" in
mis-decoded Windows-1252. Every problem is a PrepareError naming the file and the line or row.
"""

import contextlib
import json
import lzma
import re
import zlib

from xlnet_data.datagen.prepare.config import PrepareError

COMPRESSIONS = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
PARQUET_BATCH_ROWS = 1024
# What a damaged or truncated compressed stream raises (fileio's zstd reader raises the same kinds).
_DECOMPRESSION_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error)
# Where a line ends inside a decoded text (see the module's docstring).
_LINE_BREAK = re.compile("\r\n|[\n\r\u2028\u2029]")
_LINE_BREAK_IN_LINE = re.compile("[\r\u2028\u2029]")  # in a line of a file, already cut at \n


def _split_compression(path):
    """(the name without its compression suffix, the compression or None)."""
    lower = path.lower()
    for suffix, compression in COMPRESSIONS.items():
        if lower.endswith(suffix):
            return path[:-len(suffix)], compression
    return path, None


def format_of(path, requested):
    """The format a file is read as: `requested`, or with "auto" the one its name says (text otherwise)."""
    stem, compression = _split_compression(path)
    fmt = requested
    if fmt == "auto":
        lower = stem.lower()
        fmt = "jsonl" if lower.endswith(JSONL_SUFFIXES) else "parquet" if lower.endswith(PARQUET_SUFFIXES) else "text"
    if fmt == "parquet" and compression:
        raise PrepareError(f"{path}: a Parquet file is compressed inside; it cannot be read as {compression}")
    return fmt


@contextlib.contextmanager
def _reading(path, where):
    """Turns a damaged or undecodable stream into a PrepareError at `where()` (the file and its line)."""
    try:
        yield
    except UnicodeDecodeError as err:
        raise PrepareError(f"{where()}: not valid UTF-8 (byte 0x{err.object[err.start]:02x} at byte {err.start + 1} "
                           "of the line); convert the file to UTF-8") from None
    except EOFError:
        raise PrepareError(f"{where()}: the compressed file is truncated (it ends before its end marker); "
                           "re-download or re-compress it") from None
    except _DECOMPRESSION_ERRORS as err:
        reason = (err.strerror if isinstance(err, OSError) else None) or err
        raise PrepareError(f"{where()}: cannot read the file: {reason}") from None


def lines_of(text):
    """A record's text (JSON, Parquet) cut into lines, as a plain-text file is (the module's docstring)."""
    return _LINE_BREAK.split(text)


def documents(path, stream, raw, config):
    """The documents of one file, each a list of paragraph strings. `stream` is its content (decompressed:
    fileio.open_decompressed), `raw` the file as stored (Parquet is read from it)."""
    fmt = format_of(path, config.format)
    if fmt == "parquet":
        yield from _parquet_documents(path, raw, config.text_key)
        return
    if fmt == "jsonl":
        yield from _jsonl_documents(path, stream, config.text_key)
    else:
        yield from _text_documents(path, stream, config.text_layout)


def _lines(path, stream, position):
    """(line number, decoded line with its line break) of a binary stream, cut at b"\\n" only; position[0]
    keeps the line number for errors."""
    with _reading(path, lambda: f"{path}:{position[0]}"):
        for number, raw_line in enumerate(stream, 1):
            position[0] = number
            yield number, raw_line.decode("utf-8")
        position[0] += 1  # a failure after the last line (a truncated stream) is reported past it


def _text_lines(path, stream, position):
    """The lines of a plain-text stream without their line breaks, cut at every line break of lines_of."""
    for _, line in _lines(path, stream, position):
        ended = line.endswith("\n")
        line = line[:-2] if line.endswith("\r\n") else line[:-1] if ended else line
        if not _LINE_BREAK_IN_LINE.search(line):
            yield line
            continue
        pieces = _LINE_BREAK_IN_LINE.split(line)
        if not ended and not pieces[-1]:
            pieces.pop()  # the file's last line ends with \r: no empty line after it
        yield from pieces


def _jsonl_documents(path, stream, key):
    position = [1]
    for number, line in _lines(path, stream, position):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise PrepareError(f"{path}:{number}: invalid JSON: {err.msg} (column {err.colno}); "
                               "the file must hold one JSON object per line") from None
        except RecursionError:
            raise PrepareError(f"{path}:{number}: JSON nested too deeply to read (arrays or objects inside "
                               "each other thousands deep); this is not a document record") from None
        if not isinstance(record, dict):
            raise PrepareError(f"{path}:{number}: a JSON object was expected, not {type(record).__name__}")
        if key not in record:
            fields = ", ".join(map(str, list(record)[:10])) or "none"
            raise PrepareError(f"{path}:{number}: no field {key!r} (fields: {fields}); pass --text_key=FIELD")
        text = record[key]
        if text is None:
            yield []
        elif isinstance(text, str):
            try:
                text.encode("utf-8")  # a JSON escape can make a lone surrogate, which no UTF-8 file can hold
            except UnicodeEncodeError as err:
                raise PrepareError(f"{path}:{number}: field {key!r} holds an unpaired surrogate "
                                   f"(\\u{ord(text[err.start]):04x}), which is not text") from None
            yield lines_of(text)
        else:
            raise PrepareError(f"{path}:{number}: field {key!r} holds {type(text).__name__}, not a string")


def _text_documents(path, stream, layout):
    lines = _text_lines(path, stream, [1])
    if layout == "blank_line":
        paragraphs = []
        for line in lines:
            if line.strip():
                paragraphs.append(line)
            elif paragraphs:
                yield paragraphs
                paragraphs = []
        if paragraphs:
            yield paragraphs
    elif layout == "file":
        yield [line for line in lines if line.strip()]
    else:  # file_wrapped: blank lines end paragraphs, the lines of one paragraph are joined
        paragraphs, current = [], []
        for line in lines:
            if line.strip():
                current.append(line)
            elif current:
                paragraphs.append(" ".join(current))
                current = []
        if current:
            paragraphs.append(" ".join(current))
        yield paragraphs


def _parquet_documents(path, raw, key):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise PrepareError("reading Parquet needs the pyarrow package: pip install 'xlnet-data[prepare]'") from None
    try:
        parquet = pq.ParquetFile(raw)
    except (pa.ArrowException, OSError) as err:
        raise PrepareError(f"{path}: not a readable Parquet file: {err}") from None
    schema = parquet.schema_arrow
    if key not in schema.names:
        columns = ", ".join(schema.names[:10]) or "none"
        raise PrepareError(f"{path}: no column {key!r} (columns: {columns}); pass --text_key=COLUMN")
    kind = schema.field(key).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or (hasattr(pa.types, "is_string_view") and pa.types.is_string_view(kind))):
        raise PrepareError(f"{path}: column {key!r} holds {kind}, not strings")
    row = 0
    try:
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[key]):
            for text in batch.column(0).to_pylist():
                row += 1
                yield lines_of(text) if text else []
    except (pa.ArrowException, OSError) as err:
        raise PrepareError(f"{path}: row {row + 1}: cannot read the file: {err}") from None
