// The host's capabilities a sink may call: the blob store under the root
// the operator granted, and the host's log. The `weir:sink/...` modules
// exist only inside the component (ComponentizeJS binds them to the WIT
// imports); the build script leaves them to it.

import * as blobstore from 'weir:sink/blobstore@0.1.0';
import * as hostLog from 'weir:sink/log@0.1.0';

/**
 * A failed blob call. `kind` is the WIT's `blob-error` case: `not-found`,
 * `already-exists`, `denied` or `io`. Left uncaught in a sink method it
 * becomes a `retryable` error (`io`: the store failed) or a `fatal` one
 * (anything else: the sink or its root is not what it expects).
 */
export class BlobError extends Error {
  constructor(kind, message, path) {
    super(`blob ${kind.replace('-', ' ')} at \`${path}\`: ${message}`);
    this.name = 'BlobError';
    this.kind = kind;
    this.path = path;
  }
}

/** Calls a blob import, turning its `err` into a BlobError. */
function call(path, fn) {
  try {
    return fn();
  } catch (error) {
    const payload = error?.payload;
    if (payload && typeof payload.tag === 'string') {
      throw new BlobError(payload.tag, String(payload.val), path);
    }
    throw error;
  }
}

/** Bytes of a string (UTF-8) or of a Uint8Array as given. */
function bytesOf(data) {
  return typeof data === 'string' ? ENCODER.encode(data) : data;
}

const ENCODER = new TextEncoder();

/**
 * Object storage under the root the operator granted this sink. Paths are
 * relative and `/`-separated; one outside the root fails with `denied`.
 */
export const blob = {
  /**
   * Reads a whole object.
   * @param {string} path
   * @returns {Uint8Array}
   */
  get(path) {
    return call(path, () => blobstore.get(path));
  },
  /**
   * Reads a whole object, or returns null when there is none.
   * @param {string} path
   * @returns {Uint8Array | null}
   */
  getIfExists(path) {
    try {
      return blob.get(path);
    } catch (error) {
      if (error instanceof BlobError && error.kind === 'not-found') return null;
      throw error;
    }
  },
  /**
   * Reads `length` bytes from `offset` (fewer at the end of the object).
   * @param {string} path
   * @param {number | bigint} offset
   * @param {number | bigint} length
   * @returns {Uint8Array}
   */
  getRange(path, offset, length) {
    return call(path, () => blobstore.getRange(path, BigInt(offset), BigInt(length)));
  },
  /**
   * Writes an object, replacing any at that path, atomically: a reader sees
   * the old object or the new one. A string is written as UTF-8.
   * @param {string} path
   * @param {Uint8Array | string} data
   */
  put(path, data) {
    call(path, () => blobstore.put(path, bytesOf(data)));
  },
  /**
   * Writes an object only if none exists at that path, atomically; throws a
   * BlobError of kind `already-exists` otherwise.
   * @param {string} path
   * @param {Uint8Array | string} data
   */
  putIfAbsent(path, data) {
    call(path, () => blobstore.putIfAbsent(path, bytesOf(data)));
  },
  /**
   * Every object whose path starts with `prefix`, in no particular order.
   * @param {string} prefix
   * @returns {{path: string, size: bigint}[]}
   */
  list(prefix) {
    return call(prefix, () => blobstore.list(prefix));
  },
  /**
   * Deletes an object; deleting a missing one is success.
   * @param {string} path
   */
  delete(path) {
    call(path, () => blobstore.delete(path));
  },
};

/**
 * Writes to the host's log, tagged with the sink's name. The host limits
 * how many lines a sink may write per second.
 */
export const log = {
  trace: (message) => hostLog.log('trace', String(message)),
  debug: (message) => hostLog.log('debug', String(message)),
  info: (message) => hostLog.log('info', String(message)),
  warn: (message) => hostLog.log('warn', String(message)),
  error: (message) => hostLog.log('error', String(message)),
};
