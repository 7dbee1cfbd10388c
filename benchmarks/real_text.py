"""The real prose the language benchmarks read, and a SentencePiece model made for each language from it.

    python benchmarks/real_text.py --output_dir=/work/bench_text [--clones=DIR] [--vocab_size=zh=32000,ja=8000]

Each set below names public GitHub repositories, the commit and the paths of its novels (clean UTF-8 prose, one
paragraph a line). For each set the script clones the repositories into `--clones` (or uses a clone already there,
as `DIR/OWNER+NAME` or `DIR/OWNER+NAME/repo`), takes the files at that commit (`git show COMMIT:PATH`), and runs what
a user runs: `prepare --language=LANG --text_layout=file` (one sentence a line, one document a novel) into
OUTPUT_DIR/SET/, then `spm_train --input=OUTPUT_DIR/SET/*.txt --model_prefix=OUTPUT_DIR/SET --vocab_size=N
--character_coverage=0.9995 --keep_accents` (Chinese and Japanese: see docs/languages.md). Nothing is written into
the repository: the texts are others' and stay out of its history.

Three Chinese sets of different novels, each with its own model: `zh` is what BENCHMARKS.md's figures read; `zh_b`
is kept aside to check that a figure holds on other novels with another model; `zh_c`, Project Gutenberg's
封神演義, 聊齋志異, 官場現形記 and 兒女英雄傳 in traditional characters (each file one line: prepare splits its sentences),
another check of the kind.
"""

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BOOK_TXT = ("hexhero/book-txt", "b46b8dda733b74f0173757d37a513099c9690173")
GUTENBERG_ZH = ("TzuYuJih/BDSE37_-_Project_Gutenberg", "4bb70455ee1af9f6f840e94019803e75c0c8f0de")  # traditional script
SETS = {  # set: (language, [(repository, commit, paths joined into one novel, in order)])
    "zh": ("zh", [(*BOOK_TXT, ["三国演义.txt"]), (*BOOK_TXT, ["水浒传.txt"]), (*BOOK_TXT, ["西游记.txt"])]),
    "zh_b": ("zh", [("EaconTang/gitbook-hongloumeng", "c8c41fdb5466f9813d484441423c86cf2e599fd2",  # 红楼梦, Cheng-Gao
                     [f"ch_cgb/{i:03d}.md" for i in range(1, 121)]),
                    (*BOOK_TXT, ["金瓶梅.txt"])]),
    "zh_c": ("zh", [(*GUTENBERG_ZH, [f"Project_Gutenberg/{name}.txt"]) for name in ("封神演義", "聊齋志異", "官場現形記",
                                                                                     "兒女英雄傳")]),
    "ja": ("ja", [("Mukudori9316/Sohseki", "5dcda998d5393d0423e1d3c5d3dbb12c9a25a61c",  # Natsume Soseki (Aozora)
                   ["kokoro.txt"]),
                  ("Mukudori9316/Sohseki", "5dcda998d5393d0423e1d3c5d3dbb12c9a25a61c", ["wagahaiwa_nekodearu.txt"])]),
}
CHARACTER_COVERAGE = 0.9995


def git_dir(clones: Path, repository: str) -> Path:
    name = repository.replace("/", "+")
    for candidate in (clones / name / "repo", clones / name / "repo" / ".git", clones / name):
        if (candidate / "HEAD").exists():
            return candidate
    subprocess.run(["git", "clone", "--quiet", "--bare", f"https://github.com/{repository}", str(clones / name)],
                   check=True)
    return clones / name


def plain(text: str) -> str:
    """The prose of a file: the Markdown chapters of gitbook-hongloumeng lose their HTML tags (a <br> ends a line),
    their heading marks and rules; a byte-order mark goes."""
    text = re.sub(r"<br\s*/?>", "\n", text.lstrip("\ufeff"))
    text = re.sub(r"<[^>]+>", "", text)
    lines = (re.sub(r"^#+\s*", "", line) for line in text.split("\n"))
    return "".join(line + "\n" for line in lines if line.strip() and not re.fullmatch(r"\s*-+\s*", line))


def make_set(name, output_dir: Path, clones: Path, vocab_size: int):
    language, novels = SETS[name]
    raw = output_dir / f"{name}_raw"
    raw.mkdir(parents=True, exist_ok=True)
    for number, (repository, commit, paths) in enumerate(novels):
        directory = git_dir(clones, repository)
        text = "".join(plain(subprocess.run(["git", f"--git-dir={directory}", "show", f"{commit}:{path}"], check=True,
                                            stdout=subprocess.PIPE).stdout.decode("utf-8"))  # UTF-8, or stop here
                       for path in paths)
        (raw / f"{number}_{Path(paths[0]).stem}.txt").write_text(text, encoding="utf-8")
    python = sys.executable
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([python, "-m", "xlnet_data.prepare", f"--input_glob={raw}/*.txt", f"--output_dir={output_dir / name}",
                    f"--language={language}", "--text_layout=file", f"--num_shards={len(novels)}", "--overwrite"],
                   check=True, env=env)
    subprocess.run([python, "-m", "xlnet_data.spm_train", f"--input={output_dir / name}/*.txt",
                    f"--model_prefix={output_dir / name}", f"--vocab_size={vocab_size}",
                    f"--character_coverage={CHARACTER_COVERAGE}", "--keep_accents"], check=True, env=env)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True, help="where the sets' text and models go (not the repository)")
    parser.add_argument("--clones", default=None, help="where the repositories are cloned (default: OUTPUT_DIR/clones)")
    parser.add_argument("--sets", default=",".join(SETS), help="comma-separated: " + ", ".join(SETS))
    parser.add_argument("--vocab_size", default="zh=32000,zh_b=32000,zh_c=32000,ja=8000",
                        help="pieces of each set's model (the Japanese text is 1.4 MB: 8,000 pieces)")
    args = parser.parse_args()
    output_dir = Path(args.output_dir).resolve()
    clones = Path(args.clones).resolve() if args.clones else output_dir / "clones"
    clones.mkdir(parents=True, exist_ok=True)
    sizes = dict(item.split("=") for item in args.vocab_size.split(","))
    for name in args.sets.split(","):
        make_set(name, output_dir, clones, int(sizes[name]))


if __name__ == "__main__":
    main()
