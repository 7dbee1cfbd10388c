"""Random mutants of a SentencePiece model's charsmap, of a cache-backed save_dir's token cache and of its
record_infos' create_settings, run through the
loaders that feed the compiled loops (the normaliser's tables and a walk of some lines; a unit's records made from
its cache, as dump and train_gpu make them). Run by test_fuzz_files.py in a subprocess, with numba's bounds checks
on and off: a mutant must be refused in a UserError or read; any other exception is a failure, a signal kills
the process. Prints one JSON object: the counts and the failures (the mutation, the exception's last line).

    python tests/fuzz_files.py --seed=S --charsmaps=N --caches=N --settings=N --model=M.model \
        --save_dir=CACHE_BACKED_DIR --work=DIR
"""

import argparse
import copy
import functools
import glob
import json
import os
import random
import shutil
import sys
import traceback

import numpy as np

from xlnet_data.common.errors import UserError
from xlnet_data.dataformat import spm_model
from xlnet_data.dataformat.crc32c import crc32c
from xlnet_data.dataformat.examples import generated
from xlnet_data.datagen import spm_normalize
from xlnet_data.datagen.utf8_lines import Utf8Lines

LINES = ["Hello, World! 123", "Ａｂｃ　ｄｅｆ ① ½ ﬁ", "café naïve Ångström", "東京タワーで がぎぐ ｶﾞｷﾞ", "  spaces   here  ",
         "ไทย ภาษา", "हिन्दी", "x" * 300]
PALETTE = [-1, 0, 1, 2, 3, 7, 8, 255, 1 << 16, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 10 ** 12, -(2 ** 31), 2 ** 63 - 1, "x",
           None, 1.5, True, [], {}, "<u2", "<i4", "<i8", "|u1"]


def boundscheck_cache():
    """numba's cache for code compiled with bounds checks (NUMBA_BOUNDSCHECK=1): apart from the usual one (numba's
    cache does not key on the setting), kept between runs, and shared by test_fuzz_files and test_unigram's
    bounds test (the normaliser and the line reader compiled once for both)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "xlnet-data", "numba-boundscheck")


# ---------------------------------------------------------------------------------------------------- charsmaps

def mutate_charsmap(charsmap: bytes, rng: random.Random):
    """(a mutant of a charsmap, what was done)."""
    data = bytearray(charsmap)
    size = int.from_bytes(data[:4], "little")
    kind = rng.choice(["unit bytes", "units", "offset", "size", "cut strings", "no strings", "string bytes",
                       "truncate", "label"])
    if kind == "unit bytes":
        for _ in range(rng.randint(1, 16)):
            data[4 + rng.randrange(size)] = rng.randrange(256)
    elif kind == "units":
        for _ in range(rng.randint(1, 8)):
            at = 4 + 4 * rng.randrange(size // 4)
            data[at:at + 4] = rng.getrandbits(32).to_bytes(4, "little")
    elif kind in ("offset", "label"):  # a unit whose label matches (walks go on) with an offset anywhere
        for _ in range(rng.randint(1, 8)):
            at = 4 + 4 * rng.randrange(size // 4)
            unit = int.from_bytes(data[at:at + 4], "little")
            if kind == "offset":
                unit = (unit & 0x3FF) | (rng.getrandbits(22) << 10)
            else:
                unit = (unit & ~0x800000FF & 0xFFFFFFFF) | rng.randrange(256) | (rng.randrange(2) << 8)
            data[at:at + 4] = unit.to_bytes(4, "little")
    elif kind == "size":
        new = rng.choice([0, 4, 1024, size - 1024, size + 1024, 2 * size, len(data) - 4, len(data), rng.getrandbits(32)])
        data[:4] = (new & 0xFFFFFFFF).to_bytes(4, "little")
    elif kind == "cut strings":
        del data[rng.randrange(4 + size, len(data)):]
    elif kind == "no strings":
        del data[4 + size:]
    elif kind == "string bytes":
        for _ in range(rng.randint(1, 16)):
            data[rng.randrange(4 + size, len(data))] = rng.randrange(256)
    else:
        del data[rng.randrange(len(data)):]
    return bytes(data), kind


def _with_sub_field(data: bytes, number: int, index: int, sub: int, value: bytes) -> bytes:
    """A serialized ModelProto whose `index`-th field `number` (a message) has its field `sub` set to `value`."""
    out, seen = [], 0
    for field, payload, raw in spm_model._raw_fields(data):
        if field == number:
            if seen == index:
                inner = [spm_model._length_delimited(sub, value) if inner_field == sub else inner_raw
                         for inner_field, _, inner_raw in spm_model._raw_fields(payload)]
                raw = spm_model._length_delimited(number, b"".join(inner))
            seen += 1
        out.append(raw)
    return b"".join(out)


def with_charsmap(data: bytes, charsmap: bytes) -> bytes:
    """A model file with another normalizer_spec.precompiled_charsmap."""
    return _with_sub_field(data, 3, 0, 2, charsmap)


def with_piece(data: bytes, number: int, piece: bytes) -> bytes:
    """A model file whose piece `number` is the bytes `piece`."""
    return _with_sub_field(data, 1, number, 1, piece)


def walk_charsmap(model):
    """Builds the normaliser's tables and normalises LINES with them (spm_normalize), as create's encoder does."""
    tables = spm_normalize.normalizer_tables(model)
    lines = Utf8Lines.of(LINES)
    out = np.empty(64 * lines.data.size + 1024, dtype=np.uint8)
    ends = np.zeros(len(LINES), dtype=np.int64)
    done = spm_normalize.normalize_lines(lines.data, lines.line_starts, 0, out, ends, tables.units, tables.replacements,
                                         tables.replacement_lengths, tables.ud_slots, tables.ud_first,
                                         tables.ascii_fast, tables.ascii_from, tables.ascii_length, tables.plain,
                                         tables.char_nodes, tables.char_matches, tables.flags)
    return done


# ---------------------------------------------------------------------------------------------------- caches

def _regions(index):
    return ("ids", "flags", "starts") if index.get("word_starts") else ("ids", "flags")


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def recompute_crcs(index, data):
    """Every CRC list made valid again for the data, where the fields let a region be found in it."""
    step, itemsize = index.get("chunk_tokens", 1 << 20), 4 if index.get("ids", "<i4") == "<i4" else 2
    if not _is_int(step) or step < 1 or index.get("format", 1) != 2 or not isinstance(index.get("shards"), list):
        return
    for shard in index["shards"]:
        if not isinstance(shard, dict) or not _is_int(shard.get("tokens")) or not 0 < shard["tokens"] < 1 << 24:
            continue
        for name in _regions(index):
            offset = shard.get(f"{name}_offset")
            if not _is_int(offset) or offset < 0:
                continue
            crcs = []
            for begin in range(0, shard["tokens"], step):
                count = min(step, shard["tokens"] - begin)
                if name == "ids":
                    piece = data[offset + begin * itemsize:offset + (begin + count) * itemsize]
                else:
                    piece = data[offset + begin // 8:offset + begin // 8 + (count + 7) // 8]
                crcs.append(int(crc32c(np.frombuffer(bytes(piece), dtype=np.uint8))))
            shard[f"{name}_crc32c"] = crcs


def as_format_1(index, data):
    """The cache as create wrote it before format 2: ids int32, no checksums."""
    out, shards = bytearray(), []
    for shard in index["shards"]:
        ids = np.frombuffer(bytes(data[shard["ids_offset"]:shard["ids_offset"] + 2 * shard["tokens"]]), dtype="<u2")
        flags = bytes(data[shard["flags_offset"]:shard["flags_offset"] + (shard["tokens"] + 7) // 8])
        kept = {k: v for k, v in shard.items() if not k.startswith(("ids_", "flags_", "starts_"))}
        shards.append({**kept, "ids_offset": len(out), "flags_offset": len(out) + 4 * ids.size})
        out += ids.astype("<i4").tobytes() + flags
    new = {k: v for k, v in index.items() if k not in ("ids", "chunk_tokens", "word_starts")}
    return {**new, "format": 1, "shards": shards}, out


def mutate_cache(index, data, rng: random.Random):
    """(mutated index, mutated data, what was done): one to three mutations, the checksums made valid after
    those that do not aim at them."""
    index, data, done = copy.deepcopy(index), bytearray(data), []
    if rng.random() < 0.3:
        index, data = as_format_1(index, data)
        done.append("format 1")
    for _ in range(rng.randint(1, 3)):
        shards = index["shards"] if isinstance(index.get("shards"), list) else []
        kind = rng.choice(["field", "shard field", "delete", "ids bytes", "big ids", "flag bytes", "duplicate",
                           "swap", "truncate", "nudge"])
        shard = rng.choice(shards) if shards else {}
        shard = shard if isinstance(shard, dict) else {}
        if kind == "field":
            key = rng.choice(["format", "ids", "chunk_tokens", "word_starts", "skipped_files", "task", "shards"])
            index[key] = rng.choice(PALETTE)
        elif kind == "shard field":
            key = rng.choice(["tokens", "ids_offset", "flags_offset", "starts_offset", "ids_crc32c", "flags_crc32c",
                              "lines", "unk", "path"])
            shard[key] = rng.choice(PALETTE)
        elif kind == "delete" and shard:
            key = rng.choice(sorted(shard))
            del shard[key]
        elif kind == "nudge" and shard:
            key = rng.choice([k for k in shard if _is_int(shard[k])] or ["tokens"])
            shard[key] = shard.get(key, 0) + rng.choice([-9, -8, -1, 1, 7, 8, 4096])
        elif kind in ("ids bytes", "big ids", "flag bytes") and data:
            at, count = rng.randrange(len(data)), rng.randint(1, 64)
            fill = (b"\xff\xff\xff\x7f" * 16 if kind == "big ids" else
                    bytes(rng.randrange(256) for _ in range(count)))
            data[at:at + count] = fill[:count]
        elif kind == "duplicate" and shards:
            shards.append(copy.deepcopy(rng.choice(shards)))
        elif kind == "swap" and shard:
            other = rng.choice(shards)
            if isinstance(other, dict):
                shard["ids_offset"], other["flags_offset"] = other.get("flags_offset"), shard.get("ids_offset")
        elif kind == "truncate":
            del data[rng.randrange(len(data) + 1):]
        done.append(kind)
        if kind != "shard field" or not str(key).endswith("crc32c"):
            recompute_crcs(index, data)
    return index, data, "+".join(done)


SETTINGS = ("bsz_per_host", "num_core_per_host", "use_tpu", "seq_len", "reuse_len", "bi_data", "mask_alpha",
            "mask_beta", "num_predict", "span_unit")


def mutate_settings(infos, rng: random.Random):
    """(the record_infos with one to three create_settings values changed alike in each, what was done): values
    of the palette or random ints, negative and huge among them."""
    infos, done = copy.deepcopy(infos), []
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(SETTINGS)
        value = rng.choice(PALETTE) if rng.random() < 0.5 else rng.randint(-(1 << rng.randrange(64)), 1 << 20)
        for info in infos.values():
            info["create_settings"][key] = value
        done.append(f"{key}={value!r}")
    return infos, ",".join(done)


def read_units(save_dir):
    """Every record of the save_dir's cache-backed units, made as dump makes them (train_gpu's input pipeline
    makes them by the same GeneratedStream)."""
    count = 0
    for unit in generated.find_cache_units(save_dir):
        for _ in generated.unit_payloads(unit):
            count += 1
    return count


def write_cache_mutant(save_dir, index, data, infos):
    """Puts the mutant in save_dir, with the record_infos' cache reference (tokens, bytes) made to match it, as a
    crafted save_dir would have them."""
    (index_path,) = glob.glob(os.path.join(save_dir, "token_cache", "*.json"))
    with open(index_path.replace(".json", ".bin"), "wb") as f:
        f.write(data)
    with open(index_path, "w") as f:
        json.dump(index, f)
    shards = index.get("shards") if isinstance(index, dict) else None
    tokens = (sum(s["tokens"] for s in shards) if isinstance(shards, list) and
              all(isinstance(s, dict) and _is_int(s.get("tokens")) for s in shards) else 0)
    for path, info in infos.items():
        info = copy.deepcopy(info)
        info["token_cache"].update(tokens=tokens, bytes=len(data))
        with open(path, "w") as f:
            json.dump(info, f)


# ---------------------------------------------------------------------------------------------------- the run

def run_one(results, what, action):
    try:
        action()
        results["accepted"] += 1
    except UserError:
        results["refused"] += 1
    except Exception as err:  # any other exception is what the fuzz looks for
        last = traceback.format_exception_only(type(err), err)[-1].strip()
        frame = traceback.extract_tb(err.__traceback__)[-1]
        results["failures"].append(f"{what}: {last} ({os.path.basename(frame.filename)}:{frame.lineno})")


def main():
    parser = argparse.ArgumentParser()
    for name in ("seed", "charsmaps", "caches", "settings"):
        parser.add_argument(f"--{name}", type=int, required=True)
    for name in ("model", "save_dir", "work"):
        parser.add_argument(f"--{name}", required=True)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    results = {"seed": args.seed, "accepted": 0, "refused": 0, "failures": []}

    with open(args.model, "rb") as f:
        model = spm_model.read_model_proto(f.read())
    for number in range(args.charsmaps):
        charsmap, kind = mutate_charsmap(model.charsmap, rng)
        run_one(results, f"charsmap mutant {number} ({kind})",
                functools.partial(walk_charsmap, model._replace(charsmap=charsmap)))

    save_dir = os.path.join(args.work, "save_dir")
    shutil.copytree(args.save_dir, save_dir)
    (index_path,) = glob.glob(os.path.join(save_dir, "token_cache", "*.json"))
    with open(index_path) as f:
        index = json.load(f)
    with open(index_path.replace(".json", ".bin"), "rb") as f:
        data = f.read()
    infos = {}
    for path in glob.glob(os.path.join(save_dir, "tfrecords", "record_info-*.json")):
        with open(path) as f:
            infos[path] = json.load(f)
    for number in range(args.caches):
        mutant, mutant_data, kind = mutate_cache(index, data, rng)
        write_cache_mutant(save_dir, mutant, bytes(mutant_data), infos)
        run_one(results, f"cache mutant {number} ({kind})", functools.partial(read_units, save_dir))
    for number in range(args.settings):
        mutant_infos, kind = mutate_settings(infos, rng)
        write_cache_mutant(save_dir, index, data, mutant_infos)
        run_one(results, f"settings mutant {number} ({kind})", functools.partial(read_units, save_dir))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
