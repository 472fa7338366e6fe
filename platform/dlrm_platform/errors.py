"""Errors a user can fix. The CLI prints them without a traceback and exits 2."""


class UserError(Exception):
    """Bad input: a config, a dataset, a request. The message says what to do."""
