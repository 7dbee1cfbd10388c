"""What the command-line tools share: absl's app.run with one-line flag errors and their own --help text."""

import sys

from absl import app, flags


def run(main, program, doc):
    """Runs `main` under absl. A bad or unknown flag is one line `program: error: ...` and exit status 2.

    `doc` heads --help (absl prints __main__'s docstring: a console-script wrapper has none, and under
    `python -m xlnet_data COMMAND` it would be the dispatcher's).
    """
    main_module = sys.modules.get("__main__")
    if main_module is not None:
        main_module.__doc__ = doc

    def parse(argv):
        try:
            return flags.FLAGS(argv)
        except flags.Error as err:
            print(f"{program}: error: {err} (see --help)", file=sys.stderr)
            sys.exit(2)

    app.run(main, flags_parser=parse)
