"""What the command-line tools share: running under absl, the shared data flags, flags → config, errors.

Every command module (prepare, create, dump, spm_train, train_gpu, export_hf) defines its flags in a function
`define_flags()` and calls `cli.run(main, program, __doc__, define_flags)`; nothing is defined at
import time, so any two commands can be imported in one process.
"""

import dataclasses
import os
import sys

from absl import app, flags

from xlnet_data.common import stopping
from xlnet_data.common.errors import UserError
from xlnet_data.dataformat.corpus_info import SETTING_TYPES

FLAGS = flags.FLAGS

# The data flags that create writes and train_gpu reads: name → help. Defined once here, typed as
# corpus_info.json holds them (CorpusInfo; num_passes, which it does not hold, is an integer); each command
# supplies its defaults (create: the original data_utils.py's; train: None, meaning "the records'
# corpus_info.json").
_DATA_FLAGS = {
    "seq_len": "Tokens per example.",
    "reuse_len": "Tokens of the memory part (reused as memory by the next batch); usually seq_len/2.",
    "bi_data": "Bidirectional data: half the rows are the others reversed.",
    "uncased": "Lower-case the text before encoding.",
    "keep_accents": "Keep accents and every combining mark (no NFKD): the original's preprocess_text option; "
                    "off, as the original, Thai tone marks, Indic viramas, kana voicing, Vietnamese tones... "
                    "are stripped.",
    "mask_alpha": "Span masking: a context of mask_alpha tokens ...",
    "mask_beta": "... holds about mask_beta masked tokens.",
    "num_predict": "Masked tokens per example: num_predict - num_predict//2 in the memory part, the rest in A/B.",
    "num_core_per_host": "TPU cores per host: with bi_data each core's forward rows are followed by their reverse.",
    "num_passes": "Passes 0..num_passes-1 (each a different sampling of A/B and masks).",
}


_HELP_FLAGS = {"--help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml"}


def define_data_flags(defaults, note=""):
    """Defines the shared data flags with this command's `defaults` ({name: value}); `note` ends each help."""
    for name, help_text in _DATA_FLAGS.items():
        kind = "bool" if SETTING_TYPES.get(name) is bool else "integer"
        getattr(flags, f"DEFINE_{kind}")(name, defaults.get(name), f"{help_text}{note}")


def field_defaults(*classes):
    """{name: default} of the dataclasses' fields that have a default (the first class names a shared one): the
    commands' flag defaults, stated once, in the config classes."""
    defaults = {}
    for cls in reversed(classes):
        defaults |= {field.name: field.default for field in dataclasses.fields(cls)
                     if field.default is not dataclasses.MISSING}
    return defaults


def config_from_flags(cls, **given):
    """An instance of the dataclass `cls` whose fields come from the flags of the same name; `given` wins."""
    values = {field.name: FLAGS[field.name].value for field in dataclasses.fields(cls)
              if field.name in FLAGS and field.name not in given}
    return cls(**values, **given)


def fail(program, err) -> int:
    """Prints `program: error: <first line of err>` on stderr and returns exit status 2."""
    message = str(err).splitlines()[0] if str(err) else type(err).__name__
    print(f"{program}: error: {message}", file=sys.stderr)
    return 2


def os_error_line(err: OSError) -> str:
    """`<path>: <reason>` of an I/O error (disk full, permission, missing file, ...)."""
    reason = err.strerror or str(err) or type(err).__name__
    return f"{err.filename}: {reason}" if err.filename is not None else reason


def run(main, program, doc, define_flags, stopped_note=""):
    """Defines the command's flags and runs `main` under absl. A bad or unknown flag is one line
    `program: error: ...` and exit status 2.

    This is the commands' one handler of what a user can fix: a UserError (the root of them, common/errors.py)
    or an OSError (a missing file, a full disk, a permission) out of `main` is one line and exit status 2, a
    signal (stopping.Stopped) `stopped by SIGNAL` and `stopped_note` (what is kept, what to do) and 130/143.
    Anything else is a bug and keeps its traceback.

    `doc` heads --help (absl prints __main__'s docstring: a console-script wrapper has none, and under
    `python -m xlnet_data COMMAND` it would be the dispatcher's), and the flags just defined are
    listed as the key flags of the program, whatever module defined them.
    """
    # TensorFlow's C++ start-up notices (oneDNN, "All log messages before absl::InitializeLog()") are not
    # for our users; set before TensorFlow is first imported, and only where the user has not chosen.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    before = set(FLAGS)
    define_flags()
    main_module = sys.modules.get("__main__")
    if main_module is not None:
        main_module.__doc__ = doc
    for name in sorted(set(FLAGS) - before):
        FLAGS.register_key_flag_for_module(sys.argv[0], FLAGS[name])

    def parse(argv):
        try:
            return FLAGS(argv)
        except flags.Error as err:
            print(f"{program}: error: {err} (see --help)", file=sys.stderr)
            sys.exit(2)
        except SystemExit:
            if _HELP_FLAGS & set(argv[1:]):
                sys.exit(0)  # absl exits 1 after printing the help; asking for help is not an error
            raise

    def main_until_stopped(argv):
        # Commands that stop in their own way (train_gpu saves a checkpoint first) catch Stopped themselves.
        try:
            with stopping.stop_on_signals():
                return main(argv)
        except stopping.Stopped as stop:
            fail(program, f"stopped by {stop.name}{stopped_note}")
            return stop.exit_status
        except UserError as err:
            sys.stdout.flush()  # what was shown before the error comes before its line
            return fail(program, err)
        except OSError as err:
            sys.stdout.flush()
            return fail(program, os_error_line(err))

    app.run(main_until_stopped, flags_parser=parse)
