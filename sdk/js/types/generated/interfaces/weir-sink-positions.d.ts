/// <reference path="./weir-sink-types.d.ts" />
declare module 'weir:sink/positions@0.1.0' {
  /**
   * Where `table` stands for `pipeline`, or `none` if nothing was ever
   * committed for it.
   */
  export function committed(pipeline: string, table: string): CommittedPosition | undefined;
  export type Position = import('weir:sink/types@0.1.0').Position;
  export type SinkError = import('weir:sink/types@0.1.0').SinkError;
  /**
   * What a table's last durable commit recorded.
   */
  export interface CommittedPosition {
    /**
     * The `high` of the last durable commit.
     */
    position: Position,
    /**
     * The epoch of that commit.
     */
    epoch: bigint,
  }
}
