"""Errors a user can act on: the message names the value, the limit and the fix."""


class UserError(Exception):
    """Bad input or an impossible request; the CLI prints it and exits 2."""


class PlanError(UserError):
    """The host cannot run the requested plan."""


class ConfigError(UserError):
    """A configuration file or value is malformed or ruled out."""
