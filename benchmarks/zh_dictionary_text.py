"""Chinese text for the benchmarks where no Chinese book is at hand: sentences of words drawn from jieba's
dictionary by their frequency (a full-width comma every six words, a full stop at the end), one a line.

    python benchmarks/zh_dictionary_text.py --lines=20000 --output=/tmp/zh_dictionary.txt

Not Chinese prose (no grammar), but Chinese characters in the proportions of jieba's word counts, all Han,
like a novel's running text and unlike the man pages (command names in ASCII). Seeded: the same file each time.
"""

import argparse
import importlib.util
import os

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    spec = importlib.util.find_spec("jieba")
    if spec is None:
        raise SystemExit("needs jieba (pip install 'xlnet-data[words]')")
    words, counts = [], []
    with open(os.path.join(spec.submodule_search_locations[0], "dict.txt"), encoding="utf-8") as f:
        for line in f:
            word, count = line.split()[:2]
            if all("\u4e00" <= char <= "\u9fff" for char in word):
                words.append(word)
                counts.append(int(count))
    rng = np.random.default_rng(args.seed)
    p = np.array(counts, dtype=np.float64) / sum(counts)
    with open(args.output, "w", encoding="utf-8") as out:
        for _ in range(args.lines):
            drawn = rng.choice(len(words), size=int(rng.integers(8, 30)), p=p)
            parts = [words[w] + ("，" if i % 6 == 5 and i < len(drawn) - 1 else "") for i, w in enumerate(drawn)]
            out.write("".join(parts) + "。\n")


if __name__ == "__main__":
    main()
