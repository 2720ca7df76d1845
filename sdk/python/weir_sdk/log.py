"""Logging into the host's log, tagged with the sink's name.

Inside a component messages go to the host; under ``weir_sdk.native`` they
go to standard error. Log what helps an operator (what was written where,
why something failed), not row contents: the host rate-limits a sink's log.
"""

import sys

__all__ = ["trace", "debug", "info", "warn", "error"]

_LEVELS = ("trace", "debug", "info", "warn", "error")

# Set by `_component` inside a component; None means standard error.
_host_log = None


def _write(level, message):
    if _host_log is not None:
        _host_log(level, str(message))
    else:
        print("[%s] %s" % (_LEVELS[level], message), file=sys.stderr)


def trace(message):
    """Step-by-step detail, off by default."""
    _write(0, message)


def debug(message):
    """Detail for debugging a sink."""
    _write(1, message)


def info(message):
    """Normal operation worth a line: a commit, an object written."""
    _write(2, message)


def warn(message):
    """Something odd that the sink could handle."""
    _write(3, message)


def error(message):
    """Something failed."""
    _write(4, message)
