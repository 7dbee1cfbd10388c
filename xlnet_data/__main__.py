"""`xlnet-data COMMAND ...` (or `python -m xlnet_data COMMAND ...`): one entry point for every tool."""

import importlib
import sys

COMMANDS = {
    "prepare": ("xlnet_data.prepare", "raw documents (text, JSON lines, Parquet) → one sentence per line, <eop>, shards"),
    "create": ("xlnet_data.create", "text → XLNet pretraining TFRecords (identical to the original data_utils.py)"),
    "dump": ("xlnet_data.dump", "inspect records: decoded text, masks, segments, stats"),
    "spm-train": ("xlnet_data.spm_train", "train a SentencePiece model with XLNet's special ids"),
    "train": ("xlnet_data.train_gpu", "pretrain XLNet on the records (CPU, one or many GPUs)"),
    "train-torch": ("xlnet_data.train_torch", "pretrain XLNet in PyTorch on the records; checkpoints are Transformers dirs"),
    "curves": ("xlnet_data.curves", "a training run's loss (training, held-out) and learning rate as a PNG"),
    "export-hf": ("xlnet_data.export_hf", "a checkpoint to a Hugging Face Transformers directory (from_pretrained)"),
}


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print("usage: xlnet-data COMMAND [flags]   (COMMAND --help for its flags)\n", file=sys.stderr)
        for name, (_, what) in COMMANDS.items():
            print(f"  {name:10s} {what}", file=sys.stderr)
        sys.exit(0 if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help") else 2)
    module = COMMANDS[sys.argv[1]][0]
    sys.argv = [f"xlnet-data {sys.argv[1]}"] + sys.argv[2:]
    importlib.import_module(module).run()


if __name__ == "__main__":
    main()
