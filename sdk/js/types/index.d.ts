// Types of the helper layer (src/index.js). The contract's own types,
// generated from wit/since_v0.1.0/sink.wit by `npm run types`, are in
// ./generated/.
/// <reference path="./generated/positioned-sink-plugin.d.ts" />
import type { Table, CommitRequest } from 'weir:sink/types@0.1.0';

export type ArrowType =
  | { id: number; kind: 'null' | 'bool' }
  | { id: number; kind: 'int'; bits: 8 | 16 | 32 | 64; signed: boolean }
  | { id: number; kind: 'float'; bits: 32 | 64 }
  | { id: number; kind: 'utf8' | 'binary'; large: boolean }
  | { id: number; kind: 'date'; unit: 'day' }
  | { id: number; kind: 'timestamp'; unit: 's' | 'ms' | 'us' | 'ns'; timezone: string | null }
  | { id: number; kind: 'decimal'; bits: 128; precision: number; scale: number };

export interface Field { name: string; nullable: boolean; type: ArrowType }

/** null | boolean | number | bigint (64-bit ints) | string (text, dates, timestamps) | Uint8Array | Decimal */
export type Value = null | boolean | number | bigint | string | Uint8Array | Decimal;

export class Decimal {
  constructor(unscaled: bigint, scale: number);
  unscaled: bigint;
  scale: number;
  toString(): string;
  valueOf(): number;
  toJSON(): string;
}

export class ArrowReadError extends Error {}

export type SinkErrorKind = 'retryable' | 'poison' | 'fenced' | 'fatal';
export class SinkError extends Error {
  constructor(kind: SinkErrorKind, message: string);
  kind: SinkErrorKind;
  payload: { tag: SinkErrorKind; val: string };
  static retryable(message: string): SinkError;
  static poison(message: string): SinkError;
  static fenced(message: string): SinkError;
  static fatal(message: string): SinkError;
}

export class BlobError extends Error {
  kind: 'not-found' | 'already-exists' | 'denied' | 'io';
  path: string;
}

export class Config {
  get(key: string): string | undefined;
  get(key: string, fallback: string): string;
  require(key: string): string;
  allowOnly(known: string[]): void;
}

export class Batch {
  table: Table;
  id: string;
  low: Uint8Array;
  high: Uint8Array;
  fields: Field[];
  dataFields: Field[];
  length: number;
  column(name: string): Value[] | undefined;
  ops(): ('insert' | 'update' | 'delete' | 'read')[];
  positions(): Uint8Array[];
  rows(): Record<string, Value>[];
  records(): Record<string, Value>[];
}

export interface SinkImpl {
  open?(pipeline: string, config: Config): void | Promise<void>;
  write(batch: Batch): void | Promise<void>;
  commit(request: CommitRequest): void | Promise<void>;
  abort?(table: string): void;
  committed?(pipeline: string, table: string):
    | { position: Uint8Array; epoch: bigint | number } | null
    | Promise<{ position: Uint8Array; epoch: bigint | number } | null>;
}

export function exportSink(impl: SinkImpl): { sink: object; positions?: object };

export const blob: {
  get(path: string): Uint8Array;
  getIfExists(path: string): Uint8Array | null;
  getRange(path: string, offset: number | bigint, length: number | bigint): Uint8Array;
  put(path: string, data: Uint8Array | string): void;
  putIfAbsent(path: string, data: Uint8Array | string): void;
  list(prefix: string): { path: string; size: bigint }[];
  delete(path: string): void;
};

export const log: Record<'trace' | 'debug' | 'info' | 'warn' | 'error', (message: unknown) => void>;

export function jsonValue(value: unknown): string;
export function jsonObject(row: Record<string, unknown>, fields?: Field[]): string;

export const OP_COLUMN: '__op';
export const POS_COLUMN: '__pos';
