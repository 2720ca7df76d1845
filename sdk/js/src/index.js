// Write a weir sink in JavaScript.
//
// Implement an object with `write(batch)` and `commit(request)` (and
// optionally `open` and `abort`), hand it to `exportSink`, and export
// what it returns:
//
//   export const { sink } = exportSink(new MySink());
//
// A sink that stores positions with its data (exactly-once) also has
// `committed(pipeline, table)` and exports `positions` too:
//
//   export const { sink, positions } = exportSink(new MySink());
//
// `scripts/build.mjs` bundles the module and builds the component with
// ComponentizeJS. See docs/sinks/javascript.md.

import { ArrowReadError, Decimal, readIpcStream } from './arrow.js';
import { BlobError, blob, log } from './host.js';

export { ArrowReadError, BlobError, Decimal, blob, log };
export { jsonObject, jsonValue } from './json.js';

/** The control columns every batch carries and no destination wants. */
export const OP_COLUMN = '__op';
export const POS_COLUMN = '__pos';

const KINDS = ['retryable', 'poison', 'fenced', 'fatal'];

/**
 * What went wrong, and so what the host should do about it: throw one from
 * a sink method. `retryable`: the host retries the call with backoff;
 * `poison`: this batch can never be written, the pipeline stops at it;
 * `fenced`: a newer host owns the table; `fatal`: the sink cannot go on.
 */
export class SinkError extends Error {
  /**
   * @param {'retryable' | 'poison' | 'fenced' | 'fatal'} kind
   * @param {string} message what failed and why; the operator reads it
   */
  constructor(kind, message) {
    if (!KINDS.includes(kind)) {
      throw new TypeError(`SinkError kind must be one of ${KINDS.join(', ')}, not ${kind}`);
    }
    super(`${kind}: ${message}`);
    this.name = 'SinkError';
    this.kind = kind;
    // ComponentizeJS returns an exception's own `payload` as the `err` of
    // a `result`; for `sink-error` that is `{ tag, val }`.
    this.payload = { tag: kind, val: String(message) };
  }

  static retryable(message) {
    return new SinkError('retryable', message);
  }

  static poison(message) {
    return new SinkError('poison', message);
  }

  static fenced(message) {
    return new SinkError('fenced', message);
  }

  static fatal(message) {
    return new SinkError('fatal', message);
  }
}

/** The `config` map the operator wrote for this sink in the pipeline. */
export class Config {
  /** @param {Iterable<[string, string]>} entries */
  constructor(entries) {
    this.entries = new Map(entries);
  }

  /** The value of `key`, or `fallback` when it is not set. */
  get(key, fallback = undefined) {
    return this.entries.has(key) ? this.entries.get(key) : fallback;
  }

  /** The value of `key`; a `fatal` error naming it when it is not set. */
  require(key) {
    if (!this.entries.has(key)) throw SinkError.fatal(`config: \`${key}\` is required`);
    return this.entries.get(key);
  }

  /** Throws a `fatal` error naming any key not in `known` (a typo, usually). */
  allowOnly(known) {
    for (const key of this.entries.keys()) {
      if (!known.includes(key)) {
        const expected = known.length ? known.map((k) => `\`${k}\``).join(', ') : 'none';
        throw SinkError.fatal(`config: unknown key \`${key}\` (this sink knows: ${expected})`);
      }
    }
  }
}

/**
 * One batch of changes for one table, decoded from the Arrow IPC stream.
 *
 * Values are plain JavaScript; how each Arrow type reads is in
 * docs/sinks/javascript.md (64-bit integers are bigint, decimals Decimal,
 * dates and timestamps ISO 8601 strings, binary Uint8Array).
 */
export class Batch {
  /**
   * @param {import('weir:sink/types@0.1.0').Batch} meta what the host says about the batch
   * @param {Uint8Array} ipc the Arrow IPC stream
   */
  constructor(meta, ipc) {
    /** The table: `name`, `keyColumns`, `mode`, `destination`, `metadata`. */
    this.table = meta.table;
    /** Deterministic for the same table and position range, also across restarts. */
    this.id = meta.id;
    /** Position of the first change (bytes; compare byte by byte). */
    this.low = meta.low;
    /** Position the table is at once this batch is committed. */
    this.high = meta.high;
    let decoded;
    try {
      decoded = readIpcStream(ipc);
    } catch (error) {
      if (error instanceof ArrowReadError) {
        throw SinkError.poison(`table ${meta.table.name}, batch ${meta.id}: ${error.message}`);
      }
      throw error;
    }
    /** Every column's name, type and nullability, control columns included. */
    this.fields = decoded.fields;
    /** Number of rows. */
    this.length = decoded.length;
    this.columnsByName = new Map();
    decoded.fields.forEach((field, i) => this.columnsByName.set(field.name, decoded.columns[i]));
    /** The columns meant for the destination: all but `__op` and `__pos`. */
    this.dataFields = decoded.fields.filter((f) => f.name !== OP_COLUMN && f.name !== POS_COLUMN);
    if (!this.columnsByName.has(OP_COLUMN) || !this.columnsByName.has(POS_COLUMN)) {
      throw SinkError.poison(`table ${meta.table.name}, batch ${meta.id}: the batch lacks the \`__op\` or \`__pos\` column`);
    }
  }

  /** The values of one column, by name (undefined when there is none). */
  column(name) {
    return this.columnsByName.get(name);
  }

  /** Each row's operation: `insert`, `update`, `delete` or `read`. */
  ops() {
    return this.columnsByName.get(OP_COLUMN);
  }

  /** Each row's position (bytes; compare byte by byte). */
  positions() {
    return this.columnsByName.get(POS_COLUMN);
  }

  /** One object per row with the destination's columns (no `__op`, `__pos`). */
  rows() {
    return this.#objects(this.dataFields);
  }

  /** One object per row with every column, control columns included. */
  records() {
    return this.#objects(this.fields);
  }

  #objects(fields) {
    const names = fields.map((f) => f.name);
    const columns = names.map((name) => this.columnsByName.get(name));
    const rows = new Array(this.length);
    for (let r = 0; r < this.length; r++) {
      const row = {};
      for (let c = 0; c < names.length; c++) row[names[c]] = columns[c][r];
      rows[r] = row;
    }
    return rows;
  }
}

/**
 * Turns what a sink method threw into what the host understands: a
 * SinkError as it is; a BlobError left uncaught as `retryable` (`io`) or
 * `fatal`. Anything else is a bug in the sink: it is thrown on, the
 * component traps and the host quotes the message, as for a Rust panic.
 */
function forHost(error) {
  if (error instanceof SinkError) return error;
  if (error instanceof BlobError) {
    return error.kind === 'io' ? SinkError.retryable(error.message) : SinkError.fatal(error.message);
  }
  return error;
}

/** Runs a sink method, mapping what it throws, also from a returned promise. */
function guarded(call) {
  let result;
  try {
    result = call();
  } catch (error) {
    throw forHost(error);
  }
  if (result && typeof result.then === 'function') {
    return result.then(
      (value) => value,
      (error) => {
        throw forHost(error);
      },
    );
  }
  return result;
}

/**
 * Wraps a sink object into the interfaces the component exports.
 *
 * `impl.write(batch)` gets a decoded Batch; `impl.open(pipeline, config)`
 * a Config; `impl.commit(request)` the request as the host sent it
 * (`table`, `high`, `pipeline`, `epoch` as bigint). A sink that stores
 * positions with its data also has `impl.committed(pipeline, table)`,
 * returning `null` or `{ position: Uint8Array, epoch: bigint | number }`.
 *
 * @returns {{sink: object, positions?: object}} export `sink`, and
 *   `positions` when the sink has `committed`: the build chooses the world
 *   (`sink-plugin` or `positioned-sink-plugin`) by whether the module
 *   exports `positions`.
 */
export function exportSink(impl) {
  for (const method of ['write', 'commit']) {
    if (typeof impl?.[method] !== 'function') {
      throw new TypeError(`exportSink: the sink has no \`${method}\` method`);
    }
  }
  const sink = {
    open(pipeline, config) {
      return guarded(() => impl.open?.(pipeline, new Config(config)));
    },
    write(meta, ipc) {
      return guarded(() => impl.write(new Batch(meta, ipc)));
    },
    commit(request) {
      return guarded(() => impl.commit(request));
    },
    abort(table) {
      impl.abort?.(table);
    },
  };
  if (typeof impl.committed !== 'function') return { sink };
  const positions = {
    committed(pipeline, table) {
      return guarded(() => {
        const answer = impl.committed(pipeline, table);
        const check = (found) => {
          if (found === null || found === undefined) return undefined;
          return { position: found.position, epoch: BigInt(found.epoch) };
        };
        return answer && typeof answer.then === 'function' ? answer.then(check) : check(answer);
      });
    },
  };
  return { sink, positions };
}
