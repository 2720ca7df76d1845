// JSON text for the values the Arrow reader makes, which JSON.stringify
// cannot write as a destination wants them: a bigint (it throws), a decimal
// (it would quote it), bytes (it would write an object of indices).

import { Decimal } from './arrow.js';

const HEX = Array.from({ length: 256 }, (_, byte) => byte.toString(16).padStart(2, '0'));

/**
 * The JSON text of one value: bigint and Decimal as exact JSON numbers,
 * Uint8Array as lowercase hex, a non-finite number as `null`, anything else
 * as JSON.stringify writes it.
 *
 * @param {unknown} value
 * @returns {string}
 */
export function jsonValue(value) {
  switch (typeof value) {
    case 'string':
      return JSON.stringify(value);
    case 'number':
      return Number.isFinite(value) ? String(value) : 'null';
    case 'bigint':
      return value.toString();
    case 'boolean':
      return value ? 'true' : 'false';
    default:
      if (value === null || value === undefined) return 'null';
      if (value instanceof Decimal) return value.toString();
      if (value instanceof Uint8Array) {
        let hex = '';
        for (let i = 0; i < value.length; i++) hex += HEX[value[i]];
        return '"' + hex + '"';
      }
      return JSON.stringify(value);
  }
}

/**
 * A float as JSON keeps a `.0` when it is whole, so a reader that tells
 * integers from floats (serde_json, Python's json) reads a float back, as it
 * does from the Rust sinks' `arrow_json` output.
 */
function jsonFloat(value) {
  if (!Number.isFinite(value)) return 'null';
  if (!Number.isInteger(value)) return String(value);
  return Math.abs(value) < 1e16 ? value + '.0' : value.toExponential();
}

/**
 * One JSON object of a row's fields, nulls left out (as the Rust
 * hello-sink's `arrow_json` writer does), with no trailing newline.
 *
 * @param {Record<string, unknown>} row
 * @param {{name: string, type: {kind: string}}[]} [fields] the batch's
 *   fields (`batch.fields`): with them, float columns keep their `.0`
 * @returns {string}
 */
export function jsonObject(row, fields) {
  const floats = fields ? floatNames(fields) : EMPTY;
  let text = '{';
  for (const key in row) {
    const value = row[key];
    if (value === null || value === undefined) continue;
    if (text.length > 1) text += ',';
    text += JSON.stringify(key) + ':' + (floats.has(key) ? jsonFloat(value) : jsonValue(value));
  }
  return text + '}';
}

const EMPTY = new Set();
// The float columns of the last fields asked about: a batch's rows share them.
let lastFields = null;
let lastFloats = EMPTY;

function floatNames(fields) {
  if (fields !== lastFields) {
    lastFields = fields;
    lastFloats = new Set(fields.filter((f) => f.type.kind === 'float').map((f) => f.name));
  }
  return lastFloats;
}
