"""Errors raised by the runtime for problems in user-supplied input."""


class RuntimeInputError(Exception):
    """Bad input the user can fix: a missing file, a corrupt checkpoint, a bad device name."""
