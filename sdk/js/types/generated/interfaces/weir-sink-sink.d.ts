/// <reference path="./weir-sink-types.d.ts" />
declare module 'weir:sink/sink@0.1.0' {
  /**
   * Called once after the plugin is loaded, before any other call, with
   * the `config` map the operator wrote for this sink in the pipeline.
   * Reject configuration you cannot use with `fatal`, naming the key.
   */
  export function open(pipeline: string, config: Array<[string, string]>): void;
  /**
   * Stages one batch (`ipc` is an Arrow IPC stream). Nothing staged may
   * become visible before `commit`. Batches of one table arrive in
   * position order; a batch never mixes tables.
   */
  export function write(batch: Batch, ipc: Uint8Array): void;
  /**
   * Makes everything staged for `request.table` durable and visible in
   * one step. Return `ok` only when it is durable. A commit with nothing
   * staged is valid and must still record `request.high` if the sink has
   * `positions`, so that idle tables do not hold back recovery.
   */
  export function commit(request: CommitRequest): void;
  /**
   * Drops everything staged for `table` and not yet committed.
   */
  export function abort(table: string): void;
  export type Batch = import('weir:sink/types@0.1.0').Batch;
  export type CommitRequest = import('weir:sink/types@0.1.0').CommitRequest;
  export type SinkError = import('weir:sink/types@0.1.0').SinkError;
}
