// The IPC reader against streams written by apache-arrow (a writer we did
// not write), for every type the SDK reads and for those it refuses.
// Run: `npm test` in sdk/js.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import * as arrow from 'apache-arrow';

import { ArrowReadError, Decimal, readIpcStream } from '../src/arrow.js';
import { jsonObject } from '../src/json.js';

function stream(columns) {
  const table = new arrow.Table(columns);
  return arrow.tableToIPC(table, 'stream');
}

function vector(type, values) {
  return arrow.vectorFromArray(values, type);
}

test('reads every supported type, nulls included', () => {
  const bytes = stream({
    flag: vector(new arrow.Bool(), [true, null, false]),
    i8: vector(new arrow.Int8(), [-128, null, 127]),
    i16: vector(new arrow.Int16(), [-32768, 7, null]),
    i32: vector(new arrow.Int32(), [-2147483648, 0, 2147483647]),
    i64: vector(new arrow.Int64(), [-(2n ** 63n), null, 2n ** 53n + 1n]),
    u8: vector(new arrow.Uint8(), [255, 0, null]),
    u16: vector(new arrow.Uint16(), [65535, 1, 2]),
    u32: vector(new arrow.Uint32(), [4294967295, null, 3]),
    u64: vector(new arrow.Uint64(), [2n ** 64n - 1n, 0n, null]),
    f32: vector(new arrow.Float32(), [1.5, null, -0.25]),
    f64: vector(new arrow.Float64(), [3894, 0.1, null]),
    text: vector(new arrow.Utf8(), ['ada', null, 'Größe ✓']),
    big_text: vector(new arrow.LargeUtf8(), ['', 'x', null]),
    bytes: vector(new arrow.Binary(), [new Uint8Array([0, 255]), null, new Uint8Array([])]),
    day: vector(new arrow.DateDay(), [new Date(Date.UTC(2024, 0, 31)), null, new Date(Date.UTC(1969, 11, 31))]),
    nothing: vector(new arrow.Null(), [null, null, null]),
  });
  const { fields, length, columns } = readIpcStream(bytes);
  assert.equal(length, 3);
  const byName = Object.fromEntries(fields.map((f, i) => [f.name, columns[i]]));
  assert.deepEqual(byName.flag, [true, null, false]);
  assert.deepEqual(byName.i8, [-128, null, 127]);
  assert.deepEqual(byName.i16, [-32768, 7, null]);
  assert.deepEqual(byName.i32, [-2147483648, 0, 2147483647]);
  assert.deepEqual(byName.i64, [-(2n ** 63n), null, 2n ** 53n + 1n]);
  assert.deepEqual(byName.u8, [255, 0, null]);
  assert.deepEqual(byName.u16, [65535, 1, 2]);
  assert.deepEqual(byName.u32, [4294967295, null, 3]);
  assert.deepEqual(byName.u64, [2n ** 64n - 1n, 0n, null]);
  assert.deepEqual(byName.f32, [1.5, null, -0.25]);
  assert.deepEqual(byName.f64, [3894, 0.1, null]);
  assert.deepEqual(byName.text, ['ada', null, 'Größe ✓']);
  assert.deepEqual(byName.big_text, ['', 'x', null]);
  assert.deepEqual(byName.bytes, [new Uint8Array([0, 255]), null, new Uint8Array([])]);
  assert.deepEqual(byName.day, ['2024-01-31', null, '1969-12-31']);
  assert.deepEqual(byName.nothing, [null, null, null]);
  assert.deepEqual(
    fields.find((f) => f.name === 'i64').type,
    { id: 2, kind: 'int', bits: 64, signed: true },
  );
});

test('timestamps keep their unit and say UTC with Z when zoned', () => {
  // Built from raw int64 values: apache-arrow's builders take milliseconds.
  const column = (type, values) => {
    const nulls = values.map((v) => v !== null);
    const bitmap = new Uint8Array([nulls.reduce((bits, ok, i) => bits | (ok ? 1 << i : 0), 0)]);
    return arrow.makeVector(arrow.makeData({
      type,
      length: values.length,
      nullCount: nulls.filter((ok) => !ok).length,
      nullBitmap: bitmap,
      data: new BigInt64Array(values.map((v) => v ?? 0n)),
    }));
  };
  const bytes = arrow.tableToIPC(new arrow.Table({
    naive: column(new arrow.TimestampMicrosecond(), [1_704_067_200_084_000n, null, -1n]),
    zoned: column(new arrow.TimestampMillisecond('UTC'), [1_704_067_200_166n, 1_704_067_200_000n, null]),
    nanos: column(new arrow.TimestampNanosecond(), [1_704_067_200_000_000_001n, null, 0n]),
    seconds: column(new arrow.TimestampSecond('+02:00'), [1_704_067_200n, null, 0n]),
  }), 'stream');
  const { fields, columns } = readIpcStream(bytes);
  const byName = Object.fromEntries(fields.map((f, i) => [f.name, columns[i]]));
  assert.deepEqual(byName.naive, ['2024-01-01T00:00:00.084', null, '1969-12-31T23:59:59.999999']);
  assert.deepEqual(byName.zoned, ['2024-01-01T00:00:00.166Z', '2024-01-01T00:00:00Z', null]);
  assert.deepEqual(byName.nanos, ['2024-01-01T00:00:00.000000001', null, '1970-01-01T00:00:00']);
  assert.deepEqual(byName.seconds, ['2024-01-01T00:00:00Z', null, '1970-01-01T00:00:00Z']);
  assert.deepEqual(fields[1].type, { id: 10, kind: 'timestamp', unit: 'ms', timezone: 'UTC' });
});

test('decimal128 is exact, with its scale', () => {
  // apache-arrow takes decimals as their unscaled 128-bit value in four
  // little-endian uint32 words.
  const words = (unscaled) => {
    const out = new Uint32Array(4);
    let v = BigInt.asUintN(128, unscaled);
    for (let i = 0; i < 4; i++) {
      out[i] = Number(v & 0xffffffffn);
      v >>= 32n;
    }
    return out;
  };
  const type = new arrow.Decimal(2, 38, 128);
  const data = arrow.makeData({
    type,
    length: 4,
    nullCount: 1,
    nullBitmap: new Uint8Array([0b1011]),
    data: new Uint32Array([
      ...words(96440n),
      ...words(-5n),
      ...words(0n),
      ...words(10n ** 37n + 1n),
    ]),
  });
  const bytes = arrow.tableToIPC(new arrow.Table({ price: arrow.makeVector(data) }), 'stream');
  const { columns } = readIpcStream(bytes);
  const prices = columns[0];
  assert.ok(prices[0] instanceof Decimal);
  assert.deepEqual(prices.map((p) => (p === null ? null : String(p))), [
    '964.40',
    '-0.05',
    null,
    '100000000000000000000000000000000000.01',
  ]);
  assert.equal(Number(prices[0]), 964.4);
});

test('batches of one stream are concatenated', () => {
  const schema = new arrow.Schema([new arrow.Field('id', new arrow.Int32(), true)]);
  const first = arrow.makeData({ type: new arrow.Int32(), length: 2, data: new Int32Array([1, 2]) });
  const second = arrow.makeData({ type: new arrow.Int32(), length: 1, data: new Int32Array([3]) });
  const table = new arrow.Table(schema, [
    new arrow.RecordBatch(schema, arrow.makeData({ type: new arrow.Struct(schema.fields), length: 2, children: [first] })),
    new arrow.RecordBatch(schema, arrow.makeData({ type: new arrow.Struct(schema.fields), length: 1, children: [second] })),
  ]);
  const { length, columns } = readIpcStream(arrow.tableToIPC(table, 'stream'));
  assert.equal(length, 3);
  assert.deepEqual(columns[0], [1, 2, 3]);
});

test('refuses an unsupported type, naming the column', () => {
  const bytes = stream({
    id: vector(new arrow.Int64(), [1n]),
    tags: vector(new arrow.List(new arrow.Field('item', new arrow.Utf8(), true)), [['a']]),
  });
  assert.throws(() => readIpcStream(bytes), (error) => {
    assert.ok(error instanceof ArrowReadError);
    assert.match(error.message, /column `tags` has type list/);
    return true;
  });
  const halves = stream({ h: vector(new arrow.Float16(), [1]) });
  assert.throws(() => readIpcStream(halves), /column `h` has type float16/);
  const dictionary = stream({
    d: vector(new arrow.Dictionary(new arrow.Utf8(), new arrow.Int32()), ['a', 'b']),
  });
  assert.throws(() => readIpcStream(dictionary), /column `d` has type dictionary-encoded utf8/);
});

test('a cut stream is an error, not a guess', () => {
  const bytes = stream({ id: vector(new arrow.Int64(), [1n, 2n, 3n]) });
  assert.throws(() => readIpcStream(bytes.subarray(0, bytes.length - 40)), ArrowReadError);
  assert.throws(() => readIpcStream(new Uint8Array(0)), /no schema message/);
});

test('JSON objects write what JSON.stringify cannot', () => {
  const bytes = stream({
    id: vector(new arrow.Int64(), [2n ** 60n]),
    amount: vector(new arrow.Float64(), [3894]),
    qty: vector(new arrow.Int32(), [3]),
    payload: vector(new arrow.Binary(), [new Uint8Array([0xb0, 0x8d])]),
    note: vector(new arrow.Utf8(), [null]),
  });
  const { fields, columns } = readIpcStream(bytes);
  const row = Object.fromEntries(fields.map((f, i) => [f.name, columns[i][0]]));
  row.op = 'insert';
  assert.equal(
    jsonObject(row, fields),
    '{"id":1152921504606846976,"amount":3894.0,"qty":3,"payload":"b08d","op":"insert"}',
  );
  assert.equal(jsonObject({ price: new Decimal(-1250n, 2) }), '{"price":-12.50}');
});
