"""The root of the errors a user can cause and fix, and the one for flags and settings.

Every command catches `UserError` (and OSError, and Stopped) and prints its first line as
`program: error: ...`; any other exception is a bug and keeps its traceback. Each area subclasses
it (VocabError, SaveDirError, RecordError, CreateError, InputError, HFFormatError, ...); those that
were ValueErrors before stay ValueErrors too, for callers that catch that.
"""


class UserError(Exception):
    """A flag, an input, a save_dir, a model or a machine the user must change: the message says what was
    wrong, where, and how to fix it."""


class ConfigError(UserError, ValueError):
    """A flag value or combination that cannot work (create's, train_gpu's, export_hf's)."""
