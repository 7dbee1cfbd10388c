"""The Chinese word starts alone, in process: `WordStarts` on 4,096-token blocks and jieba's route on the whole
text, in ns a token (CPU time, best of --rounds).

    taskset -c 0 python benchmarks/bench_zh_route.py --zh_text=/work/bench_text/zh/shard-00000-of-00003.txt \
        --sp_model=/work/bench_text/zh.model

--zh_text: Chinese prose, one sentence a line; --sp_model: a SentencePiece model of such text (spm_train's); both as
benchmarks/real_text.py makes them. Needs jieba (the `words` extra).
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import sentencepiece as spm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_words import cpu_seconds  # noqa: E402

from xlnet_data.dataformat import words, zh_words  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zh_text", required=True)
    parser.add_argument("--sp_model", required=True)
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    lines = Path(args.zh_text).read_text(encoding="utf-8").splitlines()[:args.lines]
    sp = spm.SentencePieceProcessor(model_file=args.sp_model)
    ids = np.array([i for line in lines for i in sp.encode(line)], dtype=np.int32)
    word_starts = words.WordStarts.of(sp, "zh")
    blocks = np.array_split(ids, max(1, ids.size // 4096))
    word_starts(blocks[0])  # compiled before timing
    per_token = cpu_seconds(lambda: [word_starts(block) for block in blocks], args.rounds) / ids.size * 1e9
    code_points, in_script, _ = word_starts.pieces.joined(ids)
    dictionary = words._zh_dictionary()
    route = cpu_seconds(lambda: zh_words.char_starts(dictionary, code_points, in_script), args.rounds) / ids.size * 1e9
    print(f"{ids.size} tokens, {code_points.size} characters: WordStarts {per_token:.0f} ns a token, "
          f"jieba's route {route:.0f} ns a token (best of {args.rounds})")


if __name__ == "__main__":
    main()
