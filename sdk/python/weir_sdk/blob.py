"""The blob store under the root the operator granted this sink.

Paths are relative and ``/``-separated; the host refuses paths that leave
the root (:class:`BlobDenied`). ``put`` and ``put_if_absent`` are atomic: a
reader sees the old object or the new one, never a part. Failures raise a
:class:`BlobError` subclass; let it escape a sink method and the SDK maps
it (an I/O failure is retried, the others stop the pipeline), or catch it.
"""

__all__ = ["BlobError", "BlobNotFound", "BlobAlreadyExists", "BlobDenied", "BlobIoError",
           "ObjectMeta", "get", "get_range", "put", "put_if_absent", "list", "delete"]

_list = list


class BlobError(Exception):
    """A blob call failed; the subclass says why."""


class BlobNotFound(BlobError):
    """No object at that path."""


class BlobAlreadyExists(BlobError):
    """``put_if_absent`` found an object already there."""


class BlobDenied(BlobError):
    """The path is outside the granted root, or malformed."""


class BlobIoError(BlobError):
    """The store failed; usually worth a retry."""


class ObjectMeta:
    """An object found by :func:`list`: its path relative to the root and
    its size in bytes."""

    __slots__ = ("path", "size")

    def __init__(self, path, size):
        self.path = path
        self.size = size

    def __repr__(self):
        return "ObjectMeta(%r, %d)" % (self.path, self.size)


# Where calls go: the host's imports inside a component, a local folder
# under `weir_sdk.native`. Set by whichever of the two is in use: exporting
# the sink (`export_sink`, `export_positioned_sink`) sets the host's.
_backend = None


def _store():
    if _backend is None:
        raise BlobIoError(
            "no blob store yet: the sink has not been exported (weir_sdk.export_sink) "
            "nor opened under weir_sdk.native"
        )
    return _backend


def get(path):
    """The whole object at ``path`` as bytes."""
    return _store().get(path)


def get_range(path, offset, length):
    """``length`` bytes of the object at ``path`` from ``offset`` (fewer at
    its end)."""
    return _store().get_range(path, offset, length)


def put(path, data):
    """Writes ``data`` (bytes) at ``path``, replacing any object there."""
    _store().put(path, bytes(data))


def put_if_absent(path, data):
    """Writes ``data`` at ``path`` only if no object is there; raises
    :class:`BlobAlreadyExists` otherwise."""
    _store().put_if_absent(path, bytes(data))


def list(prefix=""):
    """Every object whose path starts with ``prefix``, as
    :class:`ObjectMeta`, in no particular order."""
    return _list(_store().list(prefix))


def delete(path):
    """Deletes the object at ``path``; a missing object is success."""
    _store().delete(path)
