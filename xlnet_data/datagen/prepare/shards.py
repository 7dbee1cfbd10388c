"""The prepare run: the files in parallel into temporary parts, exact duplicates dropped, the parts cut into shards.

Each worker turns whole files into parts (the input format, one part per file, written as it reads:
memory holds one document and, per document, 40 bytes of index: hash, end offset and counts). When
every file is done, the main process drops empty documents (never written) and exact duplicates (the
first in file order is kept), and copies the kept documents, in file order, into `num_shards` shards
of similar size (cut at document ends). So the shards are the same for any --num_workers, and bad
input stops the run before any shard is written.
"""

import contextlib
import dataclasses
import hashlib
import os
import shutil
import sys
import tempfile
import time
from typing import Optional

import numpy as np

from xlnet_data.common import fileio, workers
from xlnet_data.common.progress import Progress, format_count, format_duration
from xlnet_data.datagen.prepare import readers
from xlnet_data.datagen.prepare.config import PrepareError
from xlnet_data.datagen.prepare.sentences import format_document, require_splitter

SHARD_NAME = "shard-{index:05d}-of-{count:05d}.txt"
SHARD_GLOB = "shard-*-of-*.txt"
# The held-out documents' shards (--dev_fraction, --dev_documents) go into this subfolder of output_dir, so that
# a glob of the train shards (OUT/*.txt) never matches them; `create --split=dev` makes their records.
DEV_DIR = "dev"
# One entry per written document: its 128-bit hash, where it ends in its part, and what it holds.
INDEX_DTYPE = np.dtype([("hash_hi", "<u8"), ("hash_lo", "<u8"), ("end", "<i8"), ("paragraphs", "<u4"),
                        ("sentences", "<u4"), ("characters", "<u8")])
INDEX_CHUNK_ROWS = 1 << 16
COPY_CHUNK = 1 << 20


@dataclasses.dataclass
class FileResult:
    """What a worker made of one file: its part (documents in the input format) and the part's index."""
    path: str
    part: str
    index: np.ndarray  # INDEX_DTYPE, one row per non-empty document, in file order
    documents: int  # all documents read, empty ones included
    empty: int


LAYOUT_WARNING_FILES = 10  # fewer files than this: too few to tell a folder of one-document files


@dataclasses.dataclass
class PrepareSummary:
    """What a run read, dropped and wrote (paragraphs, sentences, characters: of the documents written)."""
    files: int
    documents_read: int
    empty_dropped: int
    duplicates_dropped: int
    documents: int
    paragraphs: int
    sentences: int
    characters: int
    bytes_written: int
    shards: list
    empty_shards: int
    text_files: int = 0  # of `files`, those read as plain text, and the documents read from them
    text_documents: int = 0
    dev_documents: int = 0  # of `documents`, held out into dev_shards
    dev_shards: list = dataclasses.field(default_factory=list)

    def layout_warning(self, text_layout: str) -> Optional[str]:
        """One line when the plain-text files look like one document each (many files, each cut into a few to a
        hundred documents: an article's or a book's paragraphs) but were read with --text_layout=blank_line."""
        per_file = self.text_documents / max(1, self.text_files)
        if text_layout != "blank_line" or self.text_files < LAYOUT_WARNING_FILES or not 2 <= per_file <= 100:
            return None
        return (f"--text_layout=blank_line cut the {self.text_files} text files into {self.text_documents} documents "
                f"({per_file:.0f} a file: a blank line ends a document); if each file is one document (an article, a "
                "book), run again with --text_layout=file (or file_wrapped for hard-wrapped text)")


def shard_paths(output_dir, num_shards):
    """The shard files of a run, in order."""
    return [os.path.join(output_dir, SHARD_NAME.format(index=i, count=num_shards)) for i in range(num_shards)]


class _PrepareProgress(Progress):
    """prepare's progress line: files done, input bytes read (compressed, as stored), their rate, ETA."""

    def line(self, files_done, files, bytes_done):
        elapsed = max(1e-9, time.time() - self.start)
        fraction = min(1.0, bytes_done / self.total_bytes)
        eta = elapsed * (1 - fraction) / fraction if fraction > 0 else 0
        return (f"files {files_done}/{files} | input {format_count(bytes_done)}B | {bytes_done / elapsed / 1e6:.1f} MB/s | "
                f"{100 * fraction:.0f}% | ETA {format_duration(eta)}")


def _document_hash(text):
    digest = hashlib.blake2b(text, digest_size=16).digest()
    return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little")


def _prepare_file(job):
    """Worker: one input file → its part file and index (see FileResult)."""
    path, size, part, config = job
    chunks, rows, documents, empty, end, reported = [], [], 0, 0, 0, 0
    with fileio.open_decompressed(path) as (stream, raw, _), open(part, "wb") as out:
        for paragraphs in readers.documents(path, stream, raw, config):
            documents += 1
            block = format_document(paragraphs, config.language)
            if block is None:
                empty += 1
                continue
            data = block.text.encode("utf-8")
            out.write(data)
            end += len(data)
            rows.append((*_document_hash(data), end, block.paragraphs, block.sentences, block.characters))
            if len(rows) == INDEX_CHUNK_ROWS:  # as numpy rows: 40 bytes a document instead of a tuple's ~200
                chunks.append(np.array(rows, dtype=INDEX_DTYPE))
                rows = []
            if documents % 256 == 0:
                position = min(raw.tell(), size)
                workers.report(position - reported)
                reported = position
    workers.report(size - reported)
    chunks.append(np.array(rows, dtype=INDEX_DTYPE))
    return FileResult(path, part, np.concatenate(chunks), documents, empty)


def _input_files(config, earlier):
    """The files of --input_glob, without the shards of an earlier run in --output_dir (`earlier`): those are
    this command's output, replaced by the run (compared as real paths, so that an absolute glob and a
    relative --output_dir, or a symbolic link, do not make the earlier shards input)."""
    shards = {_real(path) for path in earlier}
    matched = [path for path in fileio.glob(config.input_glob) if fileio.is_remote(path) or os.path.isfile(path)]
    files = [path for path in matched if _real(path) not in shards]
    if not files:
        raise PrepareError(f"no file matches --input_glob={config.input_glob}" + (
            f" but the shards of an earlier run in {config.output_dir}, which are output, not input" if matched else ""))
    for path in files:
        readers.format_of(path, config.format)  # a Parquet file with a compression suffix stops the run here
    return files


def _real(path):
    return path if fileio.is_remote(path) else os.path.realpath(path)


def _check_output_dir(config):
    """Refuses to mix with shards of an earlier run (its held-out ones included) unless --overwrite; returns
    those shards."""
    earlier = [path for folder in (config.output_dir, os.path.join(config.output_dir, DEV_DIR))
               if fileio.exists(folder) for path in fileio.glob(os.path.join(folder, SHARD_GLOB))]
    if earlier and not config.overwrite:
        raise PrepareError(f"{config.output_dir} already holds {len(earlier)} shard file(s) "
                           f"({os.path.basename(earlier[0])}, ...); pass --overwrite to replace them")
    return earlier


def _run_workers(config, jobs, progress):
    """The FileResults of every job, in job order, made by `num_workers` processes; `progress` shows them."""
    results = [None] * len(jobs)
    bytes_read = 0

    def on_done(index, result):
        results[index] = result

    def on_counts(nbytes=0):
        nonlocal bytes_read
        bytes_read += nbytes
        progress.update(sum(r is not None for r in results), len(jobs), bytes_read)

    num_workers = min(config.num_workers, len(jobs))
    if num_workers == 1:
        with workers.reporting_to(on_counts):
            for index, job in enumerate(jobs):
                on_done(index, _prepare_file(job))
    else:
        with workers.Workers(num_workers) as pool:
            pool.run(_prepare_file, [(job,) for job in jobs], on_done=on_done, on_counts=on_counts)
    progress.close()
    return results


def _kept(index, dedup):
    """A mask over the index rows (all files, in file order): False for a repeat of an earlier document."""
    keep = np.ones(len(index), dtype=bool)
    if dedup and len(index) > 1:
        order = np.lexsort((index["hash_lo"], index["hash_hi"]))  # stable: the first copy comes first
        hi, lo = index["hash_hi"][order], index["hash_lo"][order]
        repeat = (hi[1:] == hi[:-1]) & (lo[1:] == lo[:-1])
        keep[order[1:][repeat]] = False
    return keep


def held_out(index, keep, config):
    """A mask over the index rows: the kept documents set aside as held-out (--dev_fraction of them, or
    --dev_documents), those of the smallest hashes of their text, so that the split depends on the documents
    alone, not on their files, the shards or the workers (and a repeated text, with --nodedup, goes with its
    copies)."""
    rows = np.flatnonzero(keep)
    count = config.dev_documents or round(config.dev_fraction * len(rows))
    held = np.zeros(len(index), dtype=bool)
    if not count:
        return held
    if count >= len(rows):
        raise PrepareError(f"--dev_documents={count} leaves no document to train on: the input has {len(rows)} "
                           "(after dropping empty and repeated ones); hold out fewer")
    hi, lo = index["hash_hi"][rows], index["hash_lo"][rows]
    last = np.lexsort((lo, hi))[count - 1]
    held[rows[(hi < hi[last]) | ((hi == hi[last]) & (lo <= lo[last]))]] = True
    return held


def _write_shards(results, keep, paths):
    """Copies the kept documents, in file order, into len(paths) shards of similar size.

    Returns (bytes written, shards left empty)."""
    ends = np.concatenate([r.index["end"] for r in results])
    starts = ends - np.concatenate([np.diff(r.index["end"], prepend=0) for r in results])
    sizes = np.where(keep, ends - starts, 0)
    total = int(sizes.sum())
    # The kept bytes are cut into len(paths) equal ranges; a document goes to the range its middle byte falls in,
    # so a shard is off its share by less than a document at each end.
    shard_of = (2 * np.cumsum(sizes) - sizes) * len(paths) // max(2 * total, 1)
    ranges = [[] for _ in paths]  # per shard: (part, start, end), runs of consecutive kept documents
    first = 0
    for result in results:
        rows = np.flatnonzero(keep[first:first + len(result.index)]) + first
        first += len(result.index)
        if not len(rows):
            continue
        new_run = np.ones(len(rows), dtype=bool)
        new_run[1:] = (np.diff(rows) != 1) | (shard_of[rows[1:]] != shard_of[rows[:-1]])
        run_first = np.flatnonzero(new_run)
        run_last = np.append(run_first[1:], len(rows)) - 1
        for i, j in zip(rows[run_first], rows[run_last]):
            ranges[int(shard_of[i])].append((result.part, int(starts[i]), int(ends[j])))
    for path, spans in zip(paths, ranges):
        with fileio.atomic_write(path) as out:
            for part, start, end in spans:
                with open(part, "rb") as f:
                    f.seek(start)
                    _copy(f, out, end - start)
    return total, sum(1 for spans in ranges if not spans)


def _copy(source, target, length):
    while length > 0:
        chunk = source.read(min(COPY_CHUNK, length))
        if not chunk:
            raise OSError(f"{source.name}: the part file ended early")
        target.write(chunk)
        length -= len(chunk)


def prepare(config, stream=None):
    """Runs prepare as `config` (validated) says; returns a PrepareSummary. Raises PrepareError.

    `stream` gets the progress line (default: stderr).
    """
    config.validate()
    require_splitter()
    earlier = _check_output_dir(config)
    files = _input_files(config, earlier)
    sizes = [fileio.size(path) for path in files]
    new_dir = not fileio.exists(config.output_dir)  # a failed run removes it again
    fileio.makedirs(config.output_dir)
    paths = shard_paths(config.output_dir, config.num_shards)
    dev_paths = shard_paths(os.path.join(config.output_dir, DEV_DIR), config.dev_shards)
    work_dir = tempfile.mkdtemp(prefix=f"{fileio.TMP_MARK}prepare-",
                                dir=None if fileio.is_remote(config.output_dir) else config.output_dir)
    try:
        jobs = [(path, size, os.path.join(work_dir, f"part-{i:06d}"), config)
                for i, (path, size) in enumerate(zip(files, sizes))]
        results = _run_workers(config, jobs, _PrepareProgress(sum(sizes), stream=stream or sys.stderr))
        index = np.concatenate([r.index for r in results])
        keep = _kept(index, config.dedup)
        held = held_out(index, keep, config)
        written, empty_shards = _write_shards(results, keep & ~held, paths)
        if held.any():
            fileio.makedirs(os.path.dirname(dev_paths[0]))
            written += _write_shards(results, held, dev_paths)[0]
    except BaseException:
        shutil.rmtree(work_dir, ignore_errors=True)
        if new_dir and not fileio.is_remote(config.output_dir):
            with contextlib.suppress(OSError):
                os.rmdir(config.output_dir)  # only if empty: shards already written stay
        raise
    shutil.rmtree(work_dir, ignore_errors=True)
    for path in earlier:
        if path not in paths and not (held.any() and path in dev_paths):
            fileio.remove(path)
    kept = index[keep]
    text = [r for r in results if readers.format_of(r.path, config.format) == "text"]
    return PrepareSummary(
        files=len(files), documents_read=sum(r.documents for r in results), empty_dropped=sum(r.empty for r in results),
        duplicates_dropped=int(len(index) - keep.sum()), documents=len(kept),
        paragraphs=int(kept["paragraphs"].sum()), sentences=int(kept["sentences"].sum()),
        characters=int(kept["characters"].sum()), bytes_written=written, shards=paths,
        empty_shards=empty_shards, text_files=len(text), text_documents=sum(r.documents for r in text),
        dev_documents=int(held.sum()), dev_shards=dev_paths if held.any() else [])
