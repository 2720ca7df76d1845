#!/usr/bin/env node
// Builds a weir sink written in JavaScript into a WebAssembly component.
//
//   node sdk/js/scripts/build.mjs path/to/sink.js -o path/to/sink.wasm
//
// 1. esbuild bundles the sink and everything it imports (this SDK as
//    `@weir/sink-sdk`, npm packages) into one ES module: ComponentizeJS
//    takes one file. The `weir:sink/...` imports stay for it to bind.
// 2. ComponentizeJS splices the bindings of wit/since_v0.1.0/sink.wit into
//    StarlingMonkey (SpiderMonkey for WASI), runs the module's top level once
//    and snapshots the result (Wizer), so a start costs no parsing.
//
// The world follows the module: one that exports `positions` is built for
// `positioned-sink-plugin` (exactly-once), else for `sink-plugin`.
// WASI's HTTP features are left out: a sink that imported them would need
// an HTTP grant from every pipeline that loads it.
import { mkdtemp, mkdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const here = dirname(fileURLToPath(import.meta.url));
const sdkEntry = resolve(here, '../src/index.js');
const witPath = resolve(here, '../../../wit/since_v0.1.0/sink.wit');

function fail(message) {
  console.error(`weir-js-build: ${message}`);
  process.exit(1);
}

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    out: { type: 'string', short: 'o' },
    help: { type: 'boolean', short: 'h' },
  },
});
if (values.help || positionals.length !== 1 || !values.out) {
  console.error('usage: build.mjs <sink.js> -o <sink.wasm>');
  process.exit(values.help ? 0 : 2);
}
const source = resolve(positionals[0]);
const out = resolve(values.out);

let esbuild;
let componentize;
try {
  esbuild = await import('esbuild');
  ({ componentize } = await import('@bytecodealliance/componentize-js'));
} catch (error) {
  fail(`cannot load esbuild or ComponentizeJS (${error.message}); run \`npm ci\` in sdk/js (scripts/setup does)`);
}

const work = await mkdtemp(join(tmpdir(), 'weir-js-build-'));
try {
  const bundled = join(work, 'sink.bundle.js');
  const started = Date.now();
  const result = await esbuild.build({
    entryPoints: [source],
    outfile: bundled,
    bundle: true,
    format: 'esm',
    platform: 'neutral',
    target: 'es2022',
    external: ['weir:*'],
    alias: { '@weir/sink-sdk': sdkEntry },
    metafile: true,
    logLevel: 'error',
  }).catch((error) => fail(`bundling ${source} failed: ${error.message}`));
  const exported = Object.values(result.metafile.outputs)[0].exports;
  if (!exported.includes('sink')) {
    fail(`${source} does not export \`sink\`; end it with \`export const { sink } = exportSink(new MySink());\``);
  }
  const worldName = exported.includes('positions') ? 'positioned-sink-plugin' : 'sink-plugin';

  const { component } = await componentize({
    sourcePath: bundled,
    witPath,
    worldName,
    disableFeatures: ['http', 'fetch-event'],
  }).catch((error) => fail(`ComponentizeJS failed on ${source}: ${error.message}`));
  await mkdir(dirname(out), { recursive: true });
  await writeFile(out, component);
  const seconds = ((Date.now() - started) / 1000).toFixed(1);
  console.error(`weir-js-build: ${out} (${worldName}, ${component.length} bytes, ${seconds}s)`);
} finally {
  await rm(work, { recursive: true, force: true });
}
