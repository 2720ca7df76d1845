declare module 'weir:sink/blobstore@0.1.0' {
  /**
   * Reads a whole object.
   */
  export function get(path: string): Uint8Array;
  /**
   * Reads `length` bytes starting at `offset` (fewer at the end of the
   * object).
   */
  export function getRange(path: string, offset: bigint, length: bigint): Uint8Array;
  /**
   * Writes an object, replacing any object at that path. The write is
   * atomic: a reader sees the old object or the new one, never a part.
   */
  export function put(path: string, data: Uint8Array): void;
  /**
   * Writes an object only if none exists at that path, atomically; the
   * building block for a commit that two writers may race for.
   */
  export function putIfAbsent(path: string, data: Uint8Array): void;
  /**
   * Lists every object whose path starts with `prefix` (a folder path
   * such as `orders/`, or empty for everything), in no particular order.
   */
  export function list(prefix: string): Array<ObjectMeta>;
  /**
   * Deletes an object; deleting a missing object is success.
   */
  export { _delete as delete };
  function _delete(path: string): void;
  /**
   * Why a blob call failed.
   */
  export type BlobError = BlobErrorNotFound | BlobErrorAlreadyExists | BlobErrorDenied | BlobErrorIo;
  /**
   * No object at that path.
   */
  export interface BlobErrorNotFound {
    tag: 'not-found',
    val: string,
  }
  /**
   * `put-if-absent` found an object already there.
   */
  export interface BlobErrorAlreadyExists {
    tag: 'already-exists',
    val: string,
  }
  /**
   * The path is outside the granted root, or malformed.
   */
  export interface BlobErrorDenied {
    tag: 'denied',
    val: string,
  }
  /**
   * The store failed; usually worth a retry.
   */
  export interface BlobErrorIo {
    tag: 'io',
    val: string,
  }
  /**
   * An object found by `list`.
   */
  export interface ObjectMeta {
    /**
     * Path relative to the granted root.
     */
    path: string,
    /**
     * Size in bytes.
     */
    size: bigint,
  }
}
