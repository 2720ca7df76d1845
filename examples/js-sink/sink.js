// js-sink: the hello-sink of examples/hello-sink, in JavaScript.
//
// Every committed batch becomes one JSON Lines file, `<table>/<batch id>.jsonl`
// (under `prefix/` when the config sets one), one object per row: the
// table's columns plus `op` (`insert`, `update`, `delete` or `read`).

import { SinkError, blob, exportSink, jsonObject } from '@weir/sink-sdk';

class JsonLinesSink {
  constructor() {
    // Nothing may become visible before `commit`, so `write` only stages:
    // table name -> the staged files, in order.
    this.staged = new Map();
    this.prefix = '';
  }

  open(pipeline, config) {
    config.allowOnly(['prefix']);
    const prefix = config.get('prefix', '');
    // The blob store refuses such paths too, but only at the first commit;
    // saying so now names the key the operator has to fix.
    if (prefix.startsWith('/') || prefix.split('/').some((part) => part === '..' || part === '.')) {
      throw SinkError.fatal(`config: \`prefix\` must be a relative folder without \`.\` or \`..\`, not \`${prefix}\``);
    }
    this.prefix = prefix === '' || prefix.endsWith('/') ? prefix : prefix + '/';
  }

  write(batch) {
    // Turned into text now, so a value JSON cannot hold fails this batch
    // (as poison) rather than a later commit.
    const rows = batch.rows();
    const ops = batch.ops();
    let text = '';
    for (let i = 0; i < rows.length; i++) {
      rows[i].op = ops[i];
      text += jsonObject(rows[i], batch.fields) + '\n';
    }
    const table = batch.table.name;
    if (!this.staged.has(table)) this.staged.set(table, []);
    // Named after the batch id: a batch replayed after a crash overwrites
    // its file instead of adding a duplicate.
    this.staged.get(table).push({ path: `${this.prefix}${table}/${batch.id}.jsonl`, text });
  }

  commit(request) {
    for (const file of this.staged.get(request.table) ?? []) {
      // A put that fails throws a BlobError: `io` is retried by the host,
      // anything else stops the pipeline.
      blob.put(file.path, file.text);
    }
    // Forgotten only once all are durable: if a put failed, the host
    // retries the commit and they are written again.
    this.staged.delete(request.table);
  }

  abort(table) {
    this.staged.delete(table);
  }
}

export const { sink } = exportSink(new JsonLinesSink());
