declare module 'weir:sink/types@0.1.0' {
  /**
   * Where a change sits in its source's order, as an opaque byte string.
   * 
   * Comparing two positions byte by byte (lexicographically, shorter
   * prefix first) compares their order in the source. A sink may store,
   * compare and return positions without knowing which source made them.
   */
  export type Position = Uint8Array;
  /**
   * A context column the operator asked to see in the destination.
   */
  export interface MetadataColumn {
    /**
     * Which context value: one of `op`, `pos`, `commit-ts`, `ingest-ts`,
     * `snapshot`, `phase`.
     */
    source: string,
    /**
     * The column name the operator chose for it in the destination.
     */
    name: string,
  }
  /**
   * What the sink needs to know about the table a batch belongs to.
   */
  export interface Table {
    /**
     * The table's name in the source, for example `public.orders`.
     */
    name: string,
    /**
     * The table's key columns, in key order. Empty means the table has
     * no key: apply its changes as an append-only log.
     */
    keyColumns: Array<string>,
    /**
     * How the pipeline maps this table onto the destination: `upsert`
     * (the destination mirrors the source: apply updates and deletes at
     * the key) or `append` (every change becomes a new row).
     */
    mode: string,
    /**
     * The destination name the operator chose, for example
     * `sales.orders`; equal to `name` when not mapped.
     */
    destination: string,
    /**
     * Context columns the operator asked for, already present in every
     * batch under their chosen names.
     */
    metadata: Array<MetadataColumn>,
  }
  /**
   * One batch of changes for one table.
   * 
   * The Arrow IPC stream that comes with it holds the table's columns, the
   * metadata columns of `table.metadata`, and two control columns that are
   * always present and never meant for the destination:
   * `__op` (utf8: `insert`, `update`, `delete` or `read`) and
   * `__pos` (binary: the change's position). Within a batch there is at
   * most one row per key: the last change to a key wins. A `delete` row
   * carries the key columns; its other columns are null. Deleting a key
   * the destination does not have is success, not an error.
   */
  export interface Batch {
    table: Table,
    /**
     * Deterministic for the same table and position range, also across
     * restarts: a sink without `positions` can name what it writes
     * after it so that a replayed batch overwrites instead of adding.
     */
    id: string,
    /**
     * Position of the first change in the batch (inclusive).
     */
    low: Position,
    /**
     * Position the table is committed at once this batch is committed.
     * It may lie beyond the last change in the batch: positions also
     * advance over changes to other tables and over idle time.
     */
    high: Position,
    /**
     * Number of rows in the Arrow stream.
     */
    rows: number,
  }
  /**
   * A request to make everything staged for one table durable and visible.
   */
  export interface CommitRequest {
    /**
     * The table, as in the batches staged for it.
     */
    table: string,
    /**
     * The position the table is at once this commit is durable. A sink
     * with `positions` stores it atomically with the data.
     */
    high: Position,
    /**
     * The pipeline that commits, so several pipelines can share a
     * destination.
     */
    pipeline: string,
    /**
     * Grows by one each time a host starts the pipeline. A sink with
     * `positions` must refuse (`fenced`) a commit whose epoch is lower
     * than one it already committed for this table: that is a zombie
     * host that lost its lease.
     */
    epoch: bigint,
  }
  /**
   * What went wrong, and so what the host should do about it.
   */
  export type SinkError = SinkErrorRetryable | SinkErrorPoison | SinkErrorFenced | SinkErrorFatal;
  /**
   * Transient (a timeout, a lost race, a throttled store). The host
   * retries the same call with backoff; staged data stays staged.
   */
  export interface SinkErrorRetryable {
    tag: 'retryable',
    val: string,
  }
  /**
   * This batch can never be written (a value the destination cannot
   * hold, an incompatible schema change). The host stops the pipeline
   * without advancing past the batch, naming the table and position.
   */
  export interface SinkErrorPoison {
    tag: 'poison',
    val: string,
  }
  /**
   * A newer host owns this table (see `commit-request.epoch`). The host
   * stops at once and commits nothing more.
   */
  export interface SinkErrorFenced {
    tag: 'fenced',
    val: string,
  }
  /**
   * The sink cannot go on (bad configuration, corrupt destination).
   */
  export interface SinkErrorFatal {
    tag: 'fatal',
    val: string,
  }
}
