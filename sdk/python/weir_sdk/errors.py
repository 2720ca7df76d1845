"""The contract's errors as Python exceptions.

Raise one of these from a sink method to tell the host what to do; the SDK
turns it into the contract's ``sink-error``. Any other exception that
escapes a method becomes ``fatal`` with its type, message and line, except
the blob store's: :class:`~weir_sdk.blob.BlobIoError` becomes ``retryable``
and the other :class:`~weir_sdk.blob.BlobError` kinds ``fatal``, as in the
Rust SDK.
"""

__all__ = ["SinkError", "Retryable", "Poison", "Fenced", "Fatal"]


class SinkError(Exception):
    """Base of the four errors a sink may return; raise a subclass."""

    #: The contract's name for this kind of error.
    kind = "fatal"

    def __init__(self, message):
        super().__init__(message)
        self.message = str(message)

    def __str__(self):
        return self.message


class Retryable(SinkError):
    """Transient (a timeout, a lost race, a throttled store): the host
    retries the same call with backoff; staged data stays staged."""

    kind = "retryable"


class Poison(SinkError):
    """This batch can never be written (a value the destination cannot hold,
    an incompatible schema change): the host stops the pipeline without
    advancing past it, naming the table and position."""

    kind = "poison"


class Fenced(SinkError):
    """A newer host owns this table (its commit carried a higher epoch): the
    host stops at once and commits nothing more."""

    kind = "fenced"


class Fatal(SinkError):
    """The sink cannot go on (bad configuration, corrupt destination)."""

    kind = "fatal"
