#!/usr/bin/env node
// Regenerates types/generated/ (the contract's types as jco sees them) from
// wit/since_v0.1.0/sink.wit, for the positioned world, which includes
// everything the plain world has.
//
// Why not `jco guest-types`: jco 1.35 runs its WIT reader on
// @bytecodealliance/preview2-shim 0.26, which gives a guest no directories
// unless told, so the reader cannot open the WIT file. We tell that very
// shim instance to expose the WIT folder, then call the same generator.
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { rm } from 'node:fs/promises';

const here = dirname(fileURLToPath(import.meta.url));
const witDir = resolve(here, '../../../wit/since_v0.1.0');
const outDir = resolve(here, '../types/generated');

const transpileRequire = createRequire(import.meta.resolve('@bytecodealliance/jco-transpile'));
const filesystem = await import(transpileRequire.resolve('@bytecodealliance/preview2-shim/filesystem'));
filesystem._setPreopens({ [witDir]: witDir });

const { generateGuestTypes, writeFiles } = await import('@bytecodealliance/jco-transpile');
const files = await generateGuestTypes(join(witDir, 'sink.wit'), {
  worldName: 'positioned-sink-plugin',
});
await rm(outDir, { recursive: true, force: true });
await writeFiles(files, { baseDir: outDir });
console.log(`wrote ${Object.keys(files).length} files to ${outDir}`);
