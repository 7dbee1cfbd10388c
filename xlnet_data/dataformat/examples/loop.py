"""How a (task, pass) unit's examples are made from its task's token stream: rows → A/B pairs + masks → records.

The per-example loop (pairing, masking, serialisation) runs in compiled code over chunks of steps; the random
streams are the original's (numpy's legacy generator for the file order and the masks, Python's `random` for
A/B), seeded with 100 * task + pass_id, so the records are the original's. create writes them
(datagen/units.py); train_gpu and dump make a cache-backed unit's again (generated.py), so both are the same
bytes.
"""

import contextlib
import dataclasses
from collections.abc import Callable

import numpy as np

from xlnet_data.common import compiled
from xlnet_data.common.config_types import check_field_types
from xlnet_data.common.errors import ConfigError
from xlnet_data.dataformat import records
from xlnet_data.dataformat.examples import layout
from xlnet_data.dataformat.examples.layout import BITS, copy_read, copy_values, value_at
from xlnet_data.dataformat.examples.masking import ngram_cdf, sample_mask
from xlnet_data.dataformat.examples.pairing import split_a_and_b
from xlnet_data.dataformat.record_info import created_num_core
from xlnet_data.dataformat.vocab import CLS_ID, SEP_ID


@dataclasses.dataclass(frozen=True)
class Unit:
    task: int
    pass_id: int

    @property
    def seed(self):
        return 100 * self.task + self.pass_id


# Upper bounds that keep the compiled loop's arithmetic within int64 and a batch's buffers within memory;
# far above any model's (the original's defaults: seq_len 512, bsz_per_host 32, mask_alpha 6).
LIMITS = {"bsz_per_host": 1 << 16, "num_core_per_host": 1 << 12, "seq_len": 1 << 16, "reuse_len": 1 << 16,
          "mask_alpha": 1 << 20, "mask_beta": 1 << 20, "num_task": 1 << 20, "num_predict": 1 << 16}
MAX_BATCH_TOKENS = 1 << 24
SPAN_UNITS = ("piece", "word")


def check_limit(name: str, value: int) -> None:
    """ConfigError unless create's flag `name` lies in [1, LIMITS[name]]."""
    if not 1 <= value <= LIMITS[name]:
        raise ConfigError(f"--{name}={value} must be in [1, {LIMITS[name]}]")


def num_predict_parts(num_predict: int) -> tuple[int, int]:
    """Mask goals of the memory part and of the A/B part (the original's split)."""
    second = num_predict // 2
    return num_predict - second, second


@dataclasses.dataclass(frozen=True)
class ExampleSettings:
    """What decides a unit's examples beyond its token stream and seed (create's flags of these names;
    `num_core` is the cores the rows are laid out for: num_core_per_host with use_tpu, else 1)."""
    bsz_per_host: int
    num_core: int
    seq_len: int
    reuse_len: int
    bi_data: bool
    mask_alpha: int
    mask_beta: int
    num_predict: int
    span_unit: str = "piece"

    def __post_init__(self):
        check_field_types(self)  # from a file (from_create_settings), a field may hold any JSON value

    def validate(self) -> "ExampleSettings":
        """ConfigError, one line naming create's flag, for settings the layout cannot use: the rules of create's
        flags that decide the examples (CreateConfig.validate runs them), which keep every index of the compiled
        loop inside its arrays; so a record_info's settings are held to them before its unit is generated."""
        for name in ("bsz_per_host", "seq_len", "reuse_len", "mask_alpha", "mask_beta", "num_predict"):
            check_limit(name, getattr(self, name))
        check_limit("num_core_per_host", self.num_core)  # num_core_per_host, or 1 without a TPU
        if self.bsz_per_host * self.seq_len > MAX_BATCH_TOKENS:
            raise ConfigError(f"--bsz_per_host={self.bsz_per_host} x --seq_len={self.seq_len} is more than "
                              f"{MAX_BATCH_TOKENS} tokens per batch")
        if self.span_unit not in SPAN_UNITS:
            raise ConfigError(f"--span_unit={self.span_unit} must be one of {', '.join(SPAN_UNITS)}")
        if self.seq_len - self.reuse_len - 3 < 1:  # tot_len: room for A and B
            raise ConfigError(
                f"--reuse_len={self.reuse_len} must be less than --seq_len - 3 = {self.seq_len - 3} "
                "(room is needed for A, B, two <sep> and <cls>)")
        rows_per_core = 2 if self.bi_data else 1
        if self.bsz_per_host % (rows_per_core * self.num_core):
            layout = "2 * num_core_per_host (bi_data)" if self.bi_data else "num_core_per_host"
            raise ConfigError(
                f"--bsz_per_host={self.bsz_per_host} must be divisible by {layout} = "
                f"{rows_per_core * self.num_core}")
        if self.mask_alpha < self.mask_beta:
            raise ConfigError(
                f"--mask_alpha={self.mask_alpha} must be >= --mask_beta={self.mask_beta} "
                "(about mask_beta of every mask_alpha tokens are masked)")
        goal_mem, goal_ab = num_predict_parts(self.num_predict)
        if goal_mem > self.reuse_len or goal_ab > self.seq_len - self.reuse_len:
            raise ConfigError(
                f"--num_predict={self.num_predict} does not fit: {goal_mem} masks in the memory part of "
                f"{self.reuse_len} tokens and {goal_ab} in the A/B part of {self.seq_len - self.reuse_len}")
        return self

    @classmethod
    def of(cls, config) -> "ExampleSettings":
        """The settings of a config with these fields' names (datagen's CreateConfig)."""
        return cls(**{field.name: getattr(config, field.name) for field in dataclasses.fields(cls)})

    @classmethod
    def from_create_settings(cls, settings: dict) -> "ExampleSettings":
        """The settings of a record_info's `create_settings` (create's flags as it ran), validated: ConfigError
        naming the flag where one is missing or breaks create's rules."""
        read = [field.name for field in dataclasses.fields(cls) if field.name not in ("num_core", "span_unit")]
        missing = [name for name in (*read, "num_core_per_host") if name not in settings]
        if missing:
            raise ConfigError(f"{', '.join(missing)} missing")
        return cls(**{name: settings[name] for name in read},
                   num_core=created_num_core(settings), span_unit=settings.get("span_unit", "piece")).validate()


INPUT, IS_MASKED, TARGET, SEG_ID, LABEL = (records.FEATURES.index(name)
                                          for name in ("input", "is_masked", "target", "seg_id", "label"))


@compiled.jit(inline="always")
def _put_features(payloads, begins, ends, ids, mask, a_sep, b_sep, after_a, after_b, label):
    """Writes an example's features as varints (records.put_record's payloads) at `begins`; sets `ends`.

    `ids` is the input: memory and A, <sep> at `a_sep`, B, <sep> at `b_sep`, <cls>; `after_a` and `after_b`
    are the row's tokens after A and after B. The target is each input token's next one in the row: the
    input shifted left by one, except that the tokens before the two <sep> are followed by `after_a` and
    `after_b`, and the last <cls> by <cls>. So the target's varints are copies of the input's bytes with
    those three put in between: 512 ids encoded once, not twice.
    """
    pos = records.put_varints(payloads, begins[INPUT], ids, 0, 1)
    second_at = pos  # where the input's second varint begins; a_sep_at, b_at, b_sep_at likewise
    pos = records.put_varints(payloads, pos, ids, 1, a_sep)
    a_sep_at = pos
    b_at = records.put_varints(payloads, pos, ids, a_sep, a_sep + 1)
    b_sep_at = records.put_varints(payloads, b_at, ids, a_sep + 1, b_sep)
    ends[INPUT] = records.put_varints(payloads, b_sep_at, ids, b_sep, ids.shape[0])

    pos = records.copy_bytes(payloads, begins[TARGET], payloads, second_at, a_sep_at)
    pos = records.put_varint(payloads, pos, after_a)
    pos = records.copy_bytes(payloads, pos, payloads, b_at, b_sep_at)
    pos = records.put_varint(payloads, pos, after_b)
    pos = records.put_varint(payloads, pos, CLS_ID)
    ends[TARGET] = records.put_varint(payloads, pos, CLS_ID)

    # is_masked, seg_id and label are below 128: each value is its own varint byte. Written through views,
    # indexed from 0: indices the compiler cannot tell are never negative made this loop 50x slower.
    seq_len = ids.shape[0]
    is_masked = payloads[begins[IS_MASKED]:begins[IS_MASKED] + seq_len]
    seg_id = payloads[begins[SEG_ID]:begins[SEG_ID] + seq_len]
    for k in range(seq_len):
        is_masked[k] = mask[k]
        seg_id[k] = 0 if k <= a_sep else 1 if k <= b_sep else 2  # memory, A, <sep>: 0; B, <sep>: 1; <cls>: 2
    ends[IS_MASKED] = begins[IS_MASKED] + seq_len
    ends[SEG_ID] = begins[SEG_ID] + seq_len
    payloads[begins[LABEL]] = label
    ends[LABEL] = begins[LABEL] + 1


@compiled.jit(inline="always")
def _gather(out, stream, width, base, row_len, reverse, i, reuse_len, a_begin, a_end, b_begin, b_end, b_read, scratch,
            window, sep, cls):
    """Fills `out` with an example's values from its row's (at stream position `base`, reversed where `reverse`;
    ids, or word-start bits where `width` is layout.BITS): memory, A, `sep`, B, `sep`, `cls`; returns the
    positions of the two `sep` and the value after B (B's target's last). `stream`: (source, segment starts,
    segment offsets, file descriptor); where `b_read`, B is read from the file (layout.copy_read, into `scratch`
    and `window`) rather than through the map."""
    source, seg_starts, seg_offsets, fd = stream
    n = copy_values(out, 0, source, width, seg_starts, seg_offsets, base, row_len, reverse, i, i + reuse_len)
    a_sep = copy_values(out, n, source, width, seg_starts, seg_offsets, base, row_len, reverse, a_begin, a_end)
    out[a_sep] = sep
    # B and the value after it, which the second `sep` then overwrites (split_a_and_b leaves it inside the row)
    if b_read:
        n = copy_read(out, a_sep + 1, fd, scratch, window, source, width, seg_starts, seg_offsets, base, row_len,
                      reverse, b_begin, b_end + 1) - 1
    else:
        n = copy_values(out, a_sep + 1, source, width, seg_starts, seg_offsets, base, row_len, reverse, b_begin,
                        b_end + 1) - 1
    after_b = out[n]
    out[n], out[n + 1] = sep, cls
    return a_sep, n, after_b


@compiled.jit(inline="always")
def _id_at(stream, width, base, row_len, reverse, k):
    source, seg_starts, seg_offsets, _ = stream
    return value_at(source, width, seg_starts, seg_offsets, base + (row_len - 1 - k if reverse else k), 0)[0]


@compiled.jit(nogil=True)
def _write_steps(ids_of, id_bytes, bits_of, by_position, row_len, bounds, bound_offsets, source, reverse,
                 first_step, max_steps, seq_len, reuse_len, goal_mem, goal_ab, mask_alpha, mask_beta, word_spans,
                 is_start, cdf, np_mt, py_mt, keys, key_lengths, keep, buf):
    """Serialises up to `max_steps` steps (one example per row each) from step `first_step` into `buf`.

    Returns (steps written, bytes written, done). `done` is True once the rows are used up or a row
    cannot give A/B any more; the original drops that whole step and stops there. The stream's ids are read
    through `ids_of` (layout.TokenStream's id source, segment starts, id offsets and file descriptor; `id_bytes`
    each) and its word starts through `bits_of` (alike); a B drawn anywhere in the row (label 0) from the file,
    not through the map (layout.copy_read). Row r is forward row source[r] of `row_len` tokens, reversed where
    reverse[r]. `bounds` and `bound_offsets` are the forward rows' sentence boundaries (pairing.row_boundaries). Only
    rows r with `keep[r]` are serialised; the others still draw their A/B and masks, which the rows after them
    depend on (a worker's share, pretrain/cache_input.py; a count of the steps). nogil: the training input
    pipeline runs it beside the step. A token starts a word where `is_start[id]` (the piece-id table), or, with
    `by_position`, where the stream's bits say (a segmenter's words); <sep> and <cls> always.
    """
    bsz = source.shape[0]
    tot_len = seq_len - reuse_len - 3
    ids = np.zeros(seq_len, dtype=np.int32)
    mask = np.zeros(seq_len, dtype=np.bool_)
    starts = np.ones(seq_len, dtype=np.bool_)
    scratch = np.empty(seq_len * 4 + 8, dtype=np.uint8)  # a B's ids (4 bytes at most) or bits, as read
    window = np.zeros(3, dtype=np.int64)
    region = records.varints_bytes_bound(seq_len)  # each feature's varints in a region of its own
    begins = np.arange(len(records.FEATURES)) * region
    ends = begins.copy()
    payloads = np.zeros(len(records.FEATURES) * region, dtype=np.uint8)
    pos = 0
    for step in range(max_steps):
        i = (first_step + step) * reuse_len
        if i + seq_len > row_len:
            return step, pos, True
        step_start = pos
        for r in range(bsz):
            direction = -1 if reverse[r] else 1
            base = source[r] * row_len
            ok, a_begin, a_end, b_begin, b_end, label = split_a_and_b(
                row_len, bounds[bound_offsets[source[r]]:bound_offsets[source[r] + 1]], reverse[r], i + reuse_len,
                tot_len, py_mt)
            if not ok:
                return step, step_start, True
            b_read = label == 0  # B anywhere in the row: from the file (a label 1 B follows A)
            a_sep, b_sep, after_b = _gather(ids, ids_of, id_bytes, base, row_len, reverse[r], i, reuse_len, a_begin,
                                            a_end, b_begin, b_end, b_read, scratch, window, SEP_ID, CLS_ID)
            if by_position:  # <sep> and <cls> start words
                _gather(starts, bits_of, BITS, base, row_len, reverse[r], i, reuse_len, a_begin, a_end, b_begin,
                        b_end, b_read, scratch, window, True, True)
            else:
                for k in range(seq_len):
                    starts[k] = is_start[ids[k]]

            for k in range(seq_len):  # not mask[:] = False: a slice assignment costs ~70 ns here
                mask[k] = False
            mask_mem, mask_ab = mask[:reuse_len], mask[reuse_len:]
            sample_mask(starts[:reuse_len][::direction], mask_mem[::direction], goal_mem, mask_alpha, mask_beta,
                        cdf, np_mt, word_spans)
            sample_mask(starts[reuse_len:][::direction], mask_ab[::direction], goal_ab, mask_alpha, mask_beta,
                        cdf, np_mt, word_spans)
            if keep[r]:
                after_a = _id_at(ids_of, id_bytes, base, row_len, reverse[r], a_end)
                _put_features(payloads, begins, ends, ids, mask, a_sep, b_sep, after_a, after_b, label)
                pos = records.put_record(buf, pos, payloads, begins, ends, keys, key_lengths)
    return max_steps, pos, False


# Bytes of ids the rows move on by between two releases of the mapped stream's pages (UnitLoop.write). Only where
# each row's examples stand is read through the map (a B drawn anywhere is read from the file: layout.copy_read),
# so about this much and a folio a row are resident. Dropping them every 128 examples while each B was read through
# the map: 308,000 faults and ~2 CPU s of 15 a pass of 26.5M tokens.
RELEASE_BYTES = 8 << 20


class UnitLoop:
    """A unit's rows as the compiled loop reads them, and its two random streams where they stand: `write` goes
    on from there. `is_start` is the model's piece-id table (vocab.start_piece_table), used where the stream has
    no word starts of its own."""

    def __init__(self, settings: ExampleSettings, rows: layout.Rows, is_start, np_mt, py_mt):
        self.settings, self.rows, self.is_start, self.np_mt, self.py_mt = settings, rows, is_start, np_mt, py_mt
        self.cdf = ngram_cdf()
        self.every_row = np.ones(rows.source.shape[0], dtype=np.bool_)

    @property
    def bsz(self):
        return self.rows.source.shape[0]

    def __enter__(self) -> "UnitLoop":
        return self

    def __exit__(self, *exc) -> None:
        self.rows.stream.close()  # the loop owns its rows' stream: the mapped file closed where the loop ends

    def write(self, first_step, max_steps, buf, keep=None):
        """Up to `max_steps` steps from `first_step` (where the random streams stand) into `buf`, the rows of
        `keep` only (default: all); returns (steps, bytes, done) as _write_steps. The mapped pages read are dropped
        from the process (TokenStream.release) every RELEASE_BYTES of the rows' ids and at the end, so that the
        unit's memory does not grow with its stream."""
        settings, rows = self.settings, self.rows
        stream = rows.stream
        goal_mem, goal_ab = num_predict_parts(settings.num_predict)
        per_call = max(1, RELEASE_BYTES // (self.bsz * settings.reuse_len * stream.id_bytes))
        steps = nbytes = 0
        done = False
        try:
            while steps < max_steps and not done:
                more, written, done = _write_steps(
                    (stream.id_source, stream.seg_starts, stream.seg_ids, stream.fd), stream.id_bytes,
                    (stream.bit_source, stream.seg_starts, stream.seg_bits, stream.fd), stream.word_starts, rows.row_len,
                    rows.bounds, rows.bound_offsets, rows.source, rows.reverse, first_step + steps,
                    min(per_call, max_steps - steps), settings.seq_len, settings.reuse_len, goal_mem, goal_ab,
                    settings.mask_alpha, settings.mask_beta, settings.span_unit == "word", self.is_start, self.cdf,
                    self.np_mt, self.py_mt, records.FEATURE_KEYS, records.FEATURE_KEY_LENGTHS,
                    self.every_row if keep is None else keep, buf[nbytes:])
                steps, nbytes = steps + more, nbytes + written
                stream.release()
        finally:
            stream.release()
        return steps, nbytes, done


def steps_per_chunk(bsz_per_host: int, seq_len: int, chunk_bytes: int) -> int:
    """Steps of records that fit `chunk_bytes` (at least one)."""
    return max(1, chunk_bytes // (bsz_per_host * records.max_record_bytes(seq_len)))


def unit_rows(settings: ExampleSettings, unit: Unit, num_shards: int, stream: Callable):
    """The unit's rows (its task's stream in the unit's seeded file order, laid out) and numpy's generator after
    the file-order draw (the masks' draws follow). `stream(order)` gives the task's layout.TokenStream with its
    `num_shards` files in `order` (token_cache.mapped_stream, or a task encoded in memory)."""
    random_state = np.random.RandomState(unit.seed)
    with contextlib.ExitStack() as on_error:  # the stream closed if its rows cannot be laid out (a damaged flag)
        opened = on_error.enter_context(stream(random_state.permutation(num_shards)))
        rows = layout.layout_stream(opened, settings.bsz_per_host, settings.num_core, settings.bi_data)
        on_error.pop_all()
    return rows, random_state
