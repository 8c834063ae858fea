"""Errors a user can act on: the CLI prints their message (no traceback unless TIRL_DEBUG=1) and exits with 2."""


class TirlError(Exception):
    """Base of tirl's actionable errors."""


class ConfigError(ValueError):
    """A config value, key or file is invalid; the message names the dotted key or the file."""
