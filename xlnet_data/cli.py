"""What the command-line tools share: absl's app.run with one-line flag errors and their own --help text."""

import sys

from absl import app, flags


def run(main, program, doc):
    """Runs `main` under absl. A bad or unknown flag is one line `program: error: ...` and exit status 2.

    `doc` heads --help (absl prints __main__'s docstring, which a console-script wrapper lacks).
    """
    main_module = sys.modules.get("__main__")
    if main_module is not None and not getattr(main_module, "__doc__", None):
        main_module.__doc__ = doc

    def parse(argv):
        try:
            return flags.FLAGS(argv)
        except flags.Error as err:
            print(f"{program}: error: {err} (see --help)", file=sys.stderr)
            sys.exit(2)

    app.run(main, flags_parser=parse)
