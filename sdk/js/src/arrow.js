// A reader for the Arrow IPC streams the weir host sends to `write`.
//
// Why our own reader and not the `apache-arrow` package: the sink runs in
// StarlingMonkey, SpiderMonkey compiled to WebAssembly, where JavaScript is
// interpreted, not JIT-compiled. A reader that walks each column once in a
// plain loop costs a few interpreted operations per value; a general Arrow
// library's visitors and row proxies cost many more, and its bundle is
// larger than this whole SDK. The host writes one schema message and record
// batches (arrow-rs `StreamWriter`, no compression, no dictionaries), and
// this reader handles exactly the column types a sink can meet there.
//
// Values, per Arrow type (see docs/sinks/javascript.md):
//   null                          -> null
//   bool                          -> boolean
//   int8..int32, uint8..uint32    -> number
//   int64, uint64                 -> bigint (exact; JSON.stringify needs help, see json.js)
//   float32, float64              -> number
//   utf8, large_utf8              -> string
//   binary, large_binary          -> Uint8Array
//   date32                        -> string `YYYY-MM-DD`
//   timestamp (any unit)          -> string, ISO 8601 in UTC, exact to the unit;
//                                    `Z` suffix when the column has a time zone
//   decimal128                    -> Decimal (exact; `String(d)` is `123.45`)
// Anything else is refused with an error naming the column.

/** The kinds a column can be, as `field.type.kind`. */
const TYPE_NULL = 1;
const TYPE_INT = 2;
const TYPE_FLOAT = 3;
const TYPE_BINARY = 4;
const TYPE_UTF8 = 5;
const TYPE_BOOL = 6;
const TYPE_DECIMAL = 7;
const TYPE_DATE = 8;
const TYPE_TIMESTAMP = 10;
const TYPE_LARGE_BINARY = 19;
const TYPE_LARGE_UTF8 = 20;

/** Arrow's type names, to name what is refused. */
const TYPE_NAMES = [
  'none', 'null', 'int', 'floating point', 'binary', 'utf8', 'bool', 'decimal', 'date', 'time',
  'timestamp', 'interval', 'list', 'struct', 'union', 'fixed size binary', 'fixed size list',
  'map', 'duration', 'large binary', 'large utf8', 'large list', 'run end encoded',
  'binary view', 'utf8 view', 'list view', 'large list view',
];

const MESSAGE_SCHEMA = 1;
const MESSAGE_DICTIONARY_BATCH = 2;
const MESSAGE_RECORD_BATCH = 3;

/**
 * An IPC stream that cannot be read, or a column type this reader does not
 * support. The SDK reports it to the host as a poison batch: retrying the
 * same bytes cannot help.
 */
export class ArrowReadError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ArrowReadError';
  }
}

/** An exact decimal: `unscaled / 10^scale`. */
export class Decimal {
  /**
   * @param {bigint} unscaled
   * @param {number} scale
   */
  constructor(unscaled, scale) {
    this.unscaled = unscaled;
    this.scale = scale;
  }

  /** The exact value in plain notation, keeping `scale` digits: `-12.50`. */
  toString() {
    const scale = this.scale;
    if (scale <= 0) {
      return scale === 0 ? this.unscaled.toString() : this.unscaled.toString() + '0'.repeat(-scale);
    }
    const negative = this.unscaled < 0n;
    let digits = (negative ? -this.unscaled : this.unscaled).toString();
    if (digits.length <= scale) digits = '0'.repeat(scale - digits.length + 1) + digits;
    const point = digits.length - scale;
    return (negative ? '-' : '') + digits.slice(0, point) + '.' + digits.slice(point);
  }

  /** The nearest number, for arithmetic that can afford to round. */
  valueOf() {
    return Number(this.toString());
  }

  /** JSON.stringify writes the exact text as a string. */
  toJSON() {
    return this.toString();
  }
}

// ---------------------------------------------------------------------------
// FlatBuffers: just enough to read Arrow's Message, Schema and RecordBatch
// tables. A table starts with an int32 offset back to its vtable; the vtable
// holds the table's field offsets (uint16, 0 = absent, so the default).

class Table {
  constructor(view, position) {
    this.view = view;
    this.position = position;
    const vtable = position - view.getInt32(position, true);
    this.vtable = vtable;
    this.vtableSize = view.getUint16(vtable, true);
  }

  /** Where field `index` lies, or 0 when absent. */
  field(index) {
    const at = 4 + 2 * index;
    if (at >= this.vtableSize) return 0;
    const offset = this.view.getUint16(this.vtable + at, true);
    return offset === 0 ? 0 : this.position + offset;
  }

  int8(index, fallback) {
    const at = this.field(index);
    return at ? this.view.getInt8(at) : fallback;
  }

  uint8(index, fallback) {
    const at = this.field(index);
    return at ? this.view.getUint8(at) : fallback;
  }

  int16(index, fallback) {
    const at = this.field(index);
    return at ? this.view.getInt16(at, true) : fallback;
  }

  int32(index, fallback) {
    const at = this.field(index);
    return at ? this.view.getInt32(at, true) : fallback;
  }

  int64(index) {
    const at = this.field(index);
    return at ? readLength(this.view, at) : 0;
  }

  /** Follows an offset field to where it points. */
  indirect(index) {
    const at = this.field(index);
    return at ? at + this.view.getUint32(at, true) : 0;
  }

  table(index) {
    const at = this.indirect(index);
    return at ? new Table(this.view, at) : null;
  }

  string(index) {
    const at = this.indirect(index);
    if (!at) return null;
    const length = this.view.getUint32(at, true);
    return UTF8.decode(new Uint8Array(this.view.buffer, this.view.byteOffset + at + 4, length));
  }

  /** A vector: its length and where its first element lies. */
  vector(index) {
    const at = this.indirect(index);
    if (!at) return { length: 0, start: 0 };
    return { length: this.view.getUint32(at, true), start: at + 4 };
  }

  /** The `index`-th table of a vector of tables. */
  tableAt(vector, index) {
    const at = vector.start + 4 * index;
    return new Table(this.view, at + this.view.getUint32(at, true));
  }
}

const UTF8 = new TextDecoder('utf-8', { fatal: true });

/** An int64 length or offset, as a number (Arrow bodies are far below 2^53). */
function readLength(view, at) {
  const low = view.getUint32(at, true);
  const high = view.getInt32(at + 4, true);
  return high * 4294967296 + low;
}

// ---------------------------------------------------------------------------
// The stream: messages, each `0xFFFFFFFF`, an int32 metadata length, the
// FlatBuffer `Message`, then its body. A zero length ends the stream.

/**
 * Decodes an Arrow IPC stream into its fields and columns.
 *
 * @param {Uint8Array} bytes the stream, as `write` got it
 * @returns {{fields: Field[], length: number, columns: unknown[][]}} one
 *   array of values per field, each `length` long (record batches of the
 *   stream concatenated)
 * @throws {ArrowReadError} malformed stream, or a column type not supported
 */
export function readIpcStream(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let at = 0;
  let fields = null;
  let columns = null;
  let length = 0;
  while (at + 4 <= bytes.byteLength) {
    let metadataLength = view.getInt32(at, true);
    at += 4;
    if (metadataLength === -1) {
      if (at + 4 > bytes.byteLength) break;
      metadataLength = view.getInt32(at, true);
      at += 4;
    }
    if (metadataLength === 0) break;
    if (metadataLength < 0 || at + metadataLength > bytes.byteLength) {
      throw new ArrowReadError(`Arrow IPC stream: message at byte ${at - 8} runs past the end of the stream`);
    }
    const message = new Table(view, at + view.getUint32(at, true));
    const headerType = message.uint8(1, 0);
    const header = message.table(2);
    const bodyLength = message.int64(3);
    const body = at + metadataLength;
    if (body + bodyLength > bytes.byteLength) {
      throw new ArrowReadError(`Arrow IPC stream: body at byte ${body} runs past the end of the stream`);
    }
    if (headerType === MESSAGE_SCHEMA) {
      fields = readSchema(header);
      columns = fields.map(() => []);
    } else if (headerType === MESSAGE_RECORD_BATCH) {
      if (!fields) throw new ArrowReadError('Arrow IPC stream: a record batch comes before the schema');
      length += readRecordBatch(header, view, body, bodyLength, fields, columns);
    } else if (headerType === MESSAGE_DICTIONARY_BATCH) {
      throw new ArrowReadError('Arrow IPC stream: dictionary-encoded columns are not supported');
    } else {
      throw new ArrowReadError(`Arrow IPC stream: unexpected message type ${headerType}`);
    }
    at = body + bodyLength;
  }
  if (!fields) throw new ArrowReadError('Arrow IPC stream: no schema message');
  return { fields, length, columns };
}

/**
 * @typedef {{name: string, nullable: boolean, type: ArrowType}} Field
 * @typedef {{kind: string, bits?: number, signed?: boolean, precision?: number,
 *   scale?: number, unit?: string, timezone?: string | null, id: number}} ArrowType
 */

const TIME_UNITS = ['s', 'ms', 'us', 'ns'];

function readSchema(schema) {
  const vector = schema.vector(1);
  const fields = [];
  for (let i = 0; i < vector.length; i++) {
    const field = schema.tableAt(vector, i);
    const name = field.string(0) ?? '';
    const nullable = field.uint8(1, 0) !== 0;
    const typeId = field.uint8(2, 0);
    const type = field.table(3);
    const refuse = (what) => {
      throw new ArrowReadError(`column \`${name}\` has type ${what}, which the weir JavaScript SDK does not read`);
    };
    if (field.table(4)) refuse(`dictionary-encoded ${TYPE_NAMES[typeId] ?? typeId}`);
    if (field.vector(5).length > 0) refuse(TYPE_NAMES[typeId] ?? `#${typeId}`);
    fields.push({ name, nullable, type: readType(typeId, type, refuse) });
  }
  return fields;
}

function readType(id, type, refuse) {
  switch (id) {
    case TYPE_NULL:
      return { id, kind: 'null' };
    case TYPE_BOOL:
      return { id, kind: 'bool' };
    case TYPE_INT: {
      const bits = type.int32(0, 0);
      const signed = type.uint8(1, 0) !== 0;
      if (![8, 16, 32, 64].includes(bits)) refuse(`int${bits}`);
      return { id, kind: 'int', bits, signed };
    }
    case TYPE_FLOAT: {
      const precision = type.int16(0, 0);
      if (precision === 0) refuse('float16');
      return { id, kind: 'float', bits: precision === 1 ? 32 : 64 };
    }
    case TYPE_UTF8:
    case TYPE_LARGE_UTF8:
      return { id, kind: 'utf8', large: id === TYPE_LARGE_UTF8 };
    case TYPE_BINARY:
    case TYPE_LARGE_BINARY:
      return { id, kind: 'binary', large: id === TYPE_LARGE_BINARY };
    case TYPE_DATE: {
      // DateUnit: DAY = 0, MILLISECOND = 1 (the FlatBuffers default).
      if (type.int16(0, 1) !== 0) refuse('date64');
      return { id, kind: 'date', unit: 'day' };
    }
    case TYPE_TIMESTAMP: {
      const unit = TIME_UNITS[type.int16(0, 0)];
      if (!unit) refuse('timestamp with an unknown unit');
      return { id, kind: 'timestamp', unit, timezone: type.string(1) };
    }
    case TYPE_DECIMAL: {
      const bits = type.int32(2, 128);
      if (bits !== 128) refuse(`decimal${bits}`);
      return { id, kind: 'decimal', bits, precision: type.int32(0, 0), scale: type.int32(1, 0) };
    }
    default:
      return refuse(TYPE_NAMES[id] ?? `#${id}`);
  }
}

function readRecordBatch(batch, view, body, bodyLength, fields, columns) {
  if (batch.field(3)) throw new ArrowReadError('Arrow IPC stream: compressed record batches are not supported');
  const rows = batch.int64(0);
  const nodes = batch.vector(1);
  const buffers = batch.vector(2);
  let nextBuffer = 0;
  // Each buffer is (offset, length) relative to the body, 16 bytes apiece.
  const buffer = (field) => {
    if (nextBuffer >= buffers.length) {
      throw new ArrowReadError(`column \`${field.name}\`: the record batch lists too few buffers`);
    }
    const at = buffers.start + 16 * nextBuffer++;
    const offset = readLength(view, at);
    const length = readLength(view, at + 8);
    if (offset + length > bodyLength) {
      throw new ArrowReadError(`column \`${field.name}\`: a buffer runs past the end of the message body`);
    }
    return { start: body + offset, length };
  };
  if (nodes.length !== fields.length) {
    throw new ArrowReadError(`Arrow IPC stream: record batch has ${nodes.length} columns, the schema ${fields.length}`);
  }
  for (let f = 0; f < fields.length; f++) {
    const field = fields[f];
    const nodeLength = readLength(view, nodes.start + 16 * f);
    const nullCount = readLength(view, nodes.start + 16 * f + 8);
    if (nodeLength !== rows) {
      throw new ArrowReadError(`column \`${field.name}\` has ${nodeLength} values in a batch of ${rows} rows`);
    }
    const out = columns[f];
    if (field.type.kind === 'null') {
      for (let i = 0; i < rows; i++) out.push(null);
      continue;
    }
    const validity = buffer(field);
    const valid = nullCount === 0 || validity.length === 0 ? null : validity.start;
    readColumn(field, view, rows, valid, buffer, out);
  }
  return rows;
}

/** Whether row `i` is valid, given the validity bitmap at `valid`. */
function isValid(view, valid, i) {
  return (view.getUint8(valid + (i >> 3)) & (1 << (i & 7))) !== 0;
}

function readColumn(field, view, rows, valid, buffer, out) {
  const type = field.type;
  const bytes = new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
  switch (type.kind) {
    case 'bool': {
      const values = buffer(field).start;
      for (let i = 0; i < rows; i++) {
        out.push(valid !== null && !isValid(view, valid, i)
          ? null
          : (view.getUint8(values + (i >> 3)) & (1 << (i & 7))) !== 0);
      }
      return;
    }
    case 'int':
    case 'float':
    case 'date': {
      const values = buffer(field).start;
      const get = numberReader(view, type);
      const width = (type.bits ?? 32) >> 3;
      for (let i = 0; i < rows; i++) {
        out.push(valid !== null && !isValid(view, valid, i) ? null : get(values + width * i));
      }
      return;
    }
    case 'timestamp': {
      const values = buffer(field).start;
      const format = timestampFormatter(type);
      for (let i = 0; i < rows; i++) {
        out.push(valid !== null && !isValid(view, valid, i) ? null : format(view.getBigInt64(values + 8 * i, true)));
      }
      return;
    }
    case 'decimal': {
      const values = buffer(field).start;
      const scale = type.scale;
      for (let i = 0; i < rows; i++) {
        if (valid !== null && !isValid(view, valid, i)) {
          out.push(null);
          continue;
        }
        const at = values + 16 * i;
        const unscaled = (view.getBigInt64(at + 8, true) << 64n) | view.getBigUint64(at, true);
        out.push(new Decimal(unscaled, scale));
      }
      return;
    }
    case 'utf8':
    case 'binary': {
      const offsets = buffer(field).start;
      const data = buffer(field);
      const large = type.large;
      const offset = large
        ? (i) => readLength(view, offsets + 8 * i)
        : (i) => view.getInt32(offsets + 4 * i, true);
      const text = type.kind === 'utf8';
      let end = offset(0);
      for (let i = 0; i < rows; i++) {
        const start = end;
        end = offset(i + 1);
        if (valid !== null && !isValid(view, valid, i)) {
          out.push(null);
          continue;
        }
        if (start < 0 || end < start || end > data.length) {
          throw new ArrowReadError(`column \`${field.name}\`, row ${i}: value offsets ${start}..${end} lie outside its data`);
        }
        const value = bytes.subarray(data.start + start, data.start + end);
        if (!text) {
          out.push(value.slice());
          continue;
        }
        try {
          out.push(UTF8.decode(value));
        } catch {
          throw new ArrowReadError(`column \`${field.name}\`, row ${i}: not valid UTF-8`);
        }
      }
      return;
    }
    default:
      throw new ArrowReadError(`column \`${field.name}\`: type ${type.kind} is not read`);
  }
}

/** Reads one fixed-width value at a byte offset. */
function numberReader(view, type) {
  if (type.kind === 'date') {
    return (at) => dateString(view.getInt32(at, true));
  }
  if (type.kind === 'float') {
    return type.bits === 32 ? (at) => view.getFloat32(at, true) : (at) => view.getFloat64(at, true);
  }
  switch (type.bits * (type.signed ? 1 : -1)) {
    case 8: return (at) => view.getInt8(at);
    case -8: return (at) => view.getUint8(at);
    case 16: return (at) => view.getInt16(at, true);
    case -16: return (at) => view.getUint16(at, true);
    case 32: return (at) => view.getInt32(at, true);
    case -32: return (at) => view.getUint32(at, true);
    case 64: return (at) => view.getBigInt64(at, true);
    default: return (at) => view.getBigUint64(at, true);
  }
}

const DAY_MS = 86400000;

/** `YYYY-MM-DD` of a day count since 1970-01-01. */
function dateString(days) {
  return new Date(days * DAY_MS).toISOString().slice(0, 10);
}

const UNITS_PER_SECOND = { s: 1n, ms: 1000n, us: 1000000n, ns: 1000000000n };

/**
 * Formats timestamps as ISO 8601 in UTC with as many fraction digits as the
 * value needs, in groups of three (`.5` is written `.500`, whole seconds get
 * none), and `Z` when the column has a time zone: the same text arrow-rs
 * (and so the Rust hello-sink's JSON) writes for UTC.
 */
function timestampFormatter(type) {
  const perSecond = UNITS_PER_SECOND[type.unit];
  const suffix = type.timezone ? 'Z' : '';
  return (value) => {
    let seconds = value / perSecond;
    let fraction = value % perSecond;
    if (fraction < 0n) {
      fraction += perSecond;
      seconds -= 1n;
    }
    const whole = new Date(Number(seconds) * 1000).toISOString().slice(0, 19);
    if (fraction === 0n) return whole + suffix;
    let nanos = (fraction * 1000000000n) / perSecond;
    let digits = 9;
    while (digits > 3 && nanos % 1000n === 0n) {
      nanos /= 1000n;
      digits -= 3;
    }
    return whole + '.' + nanos.toString().padStart(digits, '0') + suffix;
  };
}
