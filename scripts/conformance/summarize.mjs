// Usage: node summarize.mjs results.json [--list] [--tsv]
// Classifies each result exactly as the suite's lib/display.mjs determineTestResult does
// (dependencies honoured), and also gives the raw (no-dependency) classification.
import fs from 'fs'
import tests from './node_modules/http-cache-tests/tests/index.mjs'
import surrogate from './node_modules/http-cache-tests/tests/surrogate-control.mjs'
import { determineTestResult } from './node_modules/http-cache-tests/lib/display.mjs'
tests.push(surrogate)
const file = process.argv[2]
const list = process.argv.includes('--list')
const tsv = process.argv.includes('--tsv')
const results = JSON.parse(fs.readFileSync(file, 'utf8'))
const sym2name = { '✅': 'pass', '⛔️': 'fail', '⚠️': 'optional_fail', Y: 'check_yes', N: 'check_no', '🔹': 'setup_fail', '⁉️': 'harness_fail', '⚪️': 'dependency_fail', '↻': 'retry', '-': 'untested' }
const counts = {}; const rawCounts = {}; const byKind = {}; const errNames = {}
const rows = []
for (const suite of tests) {
  for (const t of suite.tests) {
    if (t.browser_only) continue
    const kind = t.kind || 'required'
    const r = results[t.id]
    const cls = sym2name[determineTestResult(tests, t.id, results, true)[2]]
    const raw = sym2name[determineTestResult(tests, t.id, results, false)[2]]
    counts[cls] = (counts[cls] || 0) + 1
    rawCounts[raw] = (rawCounts[raw] || 0) + 1
    byKind[kind] = byKind[kind] || {}
    byKind[kind][cls] = (byKind[kind][cls] || 0) + 1
    if (Array.isArray(r)) errNames[r[0]] = (errNames[r[0]] || 0) + 1
    rows.push({ suite: suite.id, id: t.id, kind, cls, raw, name: t.name, err: Array.isArray(r) ? r[0] : '', msg: Array.isArray(r) ? r[1] : (r === undefined ? 'untested' : ''), deps: (t.depends_on || []).join(',') })
  }
}
const total = rows.length
const passed = rows.filter(r => r.cls === 'pass' || r.cls === 'check_yes').length
console.log(`${file}: ${total} tests run by the CLI (browser_only excluded)`)
console.log(`  raw result values: true=${rows.filter(r => r.err === '' && r.msg === '').length}, error names: ${JSON.stringify(errNames)}`)
console.log(`  classified as the suite does (dependencies honoured): ${JSON.stringify(counts)}`)
console.log(`  classified without dependencies:                     ${JSON.stringify(rawCounts)}`)
for (const k of ['required', 'optimal', 'check']) console.log(`  kind=${k}: ${JSON.stringify(byKind[k])}`)
console.log(`  passed (pass + check yes): ${passed}; not passed: ${total - passed}`)
if (list) {
  for (const r of rows) {
    if (r.cls === 'pass' || r.cls === 'check_yes') continue
    if (tsv) console.log([r.suite, r.kind, r.cls, r.raw, r.id, r.name, r.err, r.msg, r.deps].join('\t'))
    else console.log(`  [${r.suite}] ${r.kind} ${r.cls}${r.raw !== r.cls ? ' (raw ' + r.raw + ')' : ''} ${r.id} — ${r.name} :: ${r.err}: ${r.msg}${r.cls === 'dependency_fail' ? ' [depends on ' + r.deps + ']' : ''}`)
  }
}
