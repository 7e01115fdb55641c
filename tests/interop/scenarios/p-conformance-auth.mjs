// Scenario p: the conformance tool's client `auth/*` scenarios with a stock
// OAuth client, direct and through mcp-resume-proxy.
//
// For each auth scenario the installed tool lists (`conformance list`), the
// tool starts its own servers (a protected MCP server, and as a rule a mock
// authorization server on another port; 2025-03-26 servers are their own
// authorization server) and runs a client command with the server's URL:
//
//   direct:  auth-client.mjs --> the tool's MCP server        (--> its authorization server)
//   proxy:   auth-wrapper.sh: auth-client.mjs --> mcp-resume-proxy --> the tool's MCP server
//
// The client (conformance/auth-client.mjs) is the TS SDK's Client with its
// OAuth code (auth() with an OAuthClientProvider, ClientCredentialsProvider,
// PrivateKeyJwtProvider), a port of the tool's own reference client. The
// proxy runs with no configuration but its upstream (no passthrough, no
// [auth]): what a user gets by putting it in front of such a server. Where
// the tool's server keeps OAuth paths on its own origin outside the
// well-known ones (PASSTHROUGH below), the scenario runs through the proxy a
// second time with those paths in the upstream's `passthrough`, as the
// README says to configure such a server.
//
// One line per scenario: the tool's verdict (its own OVERALL, exit status)
// direct and through the proxy, with its passed/failed/warning counts. For a
// scenario whose verdict differs, the checks whose status differs (id, both
// statuses, the tool's description) and the client's error. Passes when
// every scenario that passes direct passes through the proxy (with the
// README's passthrough where listed), but for a difference listed in
// EXPECTED, matched by the tool's own failing check, whose cause is a limit
// the README documents; it is printed as expected, with its cause.
import fs from 'node:fs';
import path from 'node:path';
import { INTEROP_DIR, PROXY_BIN, log, runScenario, workdir } from '../lib/harness.mjs';
import { BIND_LOCALHOST_SYNC, runConformance } from '../lib/conformance.mjs';

const CLIENT = path.join(INTEROP_DIR, 'conformance', 'auth-client.mjs');
const WRAPPER = path.join(INTEROP_DIR, 'conformance', 'auth-wrapper.sh');
// The tool splits --command on spaces: no spaces in these paths.
for (const p of [process.execPath, CLIENT, WRAPPER]) if (/\s/.test(p)) throw new Error(`a space in ${p}`);
const only = process.argv.slice(2); // optional: some scenario names

// Scenarios whose server keeps OAuth paths on its own origin outside the
// well-known ones: run a second time with them in `passthrough`.
const PASSTHROUGH = {
  // A 2025-03-26 server with no metadata: the client falls back to
  // /authorize, /token and /register on the MCP server's origin (README: "A
  // server that is its own authorization server ... lists its endpoints").
  'auth/2025-03-26-oauth-endpoint-fallback': ['/authorize', '/token', '/register'],
  // Protected resource metadata at a path of the server's own choosing,
  // named by resource_metadata in its 401.
  'auth/metadata-var3': ['/custom/metadata/location.json'],
};

// Differences whose cause is not the proxy: the tool's check that must be
// the only failing one through the proxy, and why.
const EXPECTED = {
  // SEP-990: the tool's authorization server compares the ID-JAG's
  // `resource` (what the client read in the protected resource metadata:
  // through the proxy, the proxy's URL, as the client requires) with the MCP
  // server's own idea of its URL, the internal one. README: "An upstream
  // that checks a token's audience against its internal URL refuses tokens
  // issued for the public one: tell it its public URL" — the tool's server
  // cannot be told.
  'auth/cross-app-access-complete-flow': {
    why: "the tool's authorization server checks the ID-JAG's resource (the proxy's URL, from the metadata) against the MCP server's internal URL; README: tell the server its public URL, which the tool's server cannot be",
    matches: (failed, urls) => failed.length === 1 && failed[0].id === 'complete-flow-jwt-bearer'
      && failed[0].details?.jagResource === urls.proxy && failed[0].details?.expectedResource === urls.upstream,
  },
};

/** The client's stdout + stderr as the tool saved them next to checks.json. */
function clientOutputUnder(dir) {
  const f = findUnder(dir, 'checks.json');
  if (!f) return '';
  const read = (n) => { try { return fs.readFileSync(path.join(path.dirname(f), n), 'utf8'); } catch { return ''; } };
  return `${read('stdout.txt')}\n${read('stderr.txt')}`;
}

function findUnder(dir, name) {
  const found = [];
  const walk = (d) => {
    if (!fs.existsSync(d)) return;
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name === name) found.push(p);
    }
  };
  walk(dir);
  return found[0];
}

/** checks.json of the one run written under dir. */
function checksUnder(dir) {
  const f = findUnder(dir, 'checks.json');
  return f ? JSON.parse(fs.readFileSync(f, 'utf8')) : [];
}

const count = (cs, st) => cs.filter((c) => c.status === st).length;
const summary = (r) => `${r.pass ? 'PASS' : 'FAIL'} (${count(r.checks, 'SUCCESS')} ok, ${count(r.checks, 'FAILURE')} failed, ${count(r.checks, 'WARNING')} warnings${r.timedOut ? ', client timed out' : ''}${r.clientError ? ', client error' : ''})`;

async function runOne(scenario, label, passthrough) {
  const safe = scenario.replace(/\W+/g, '_');
  const out = path.join(workdir(), label, safe);
  const wrapperLog = path.join(workdir(), label, `${safe}.client.log`);
  fs.mkdirSync(path.dirname(wrapperLog), { recursive: true });
  fs.writeFileSync(wrapperLog, '');
  const command = label === 'direct' ? `${process.execPath} ${CLIENT}` : WRAPPER;
  const t = Date.now();
  const r = await runConformance(['client', '--command', command, '--scenario', scenario, '--timeout', '30000', '-o', out], {
    timeoutMs: 45000,
    preload: BIND_LOCALHOST_SYNC,
    env: {
      MCP_PROXY_BIN: PROXY_BIN, INTEROP_WRAPPER_LOG: wrapperLog, INTEROP_NODE: process.execPath,
      PROXY_PASSTHROUGH: passthrough ? JSON.stringify(passthrough).replace(/,/g, ', ') : '',
    },
    logFile: path.join(workdir(), label, `${safe}.conformance.log`),
  });
  const checks = checksUnder(out);
  const clientLog = label === 'direct' ? clientOutputUnder(out) : fs.readFileSync(wrapperLog, 'utf8');
  // The wrapper's first line: "wrapper: <scenario>: upstream <url>, proxy on <addr>".
  const w = clientLog.match(/^wrapper: \S+: upstream (\S+), proxy on ([\d.:]+)/m);
  return {
    urls: w ? { upstream: w[1], proxy: `http://${w[2]}/mcp` } : {},
    pass: r.code === 0,
    checks,
    ms: Date.now() - t,
    timedOut: /CLIENT TIMED OUT/.test(r.output),
    clientError: /CLIENT EXITED WITH ERROR/.test(r.output),
    output: r.output,
    clientLog,
  };
}

/** The client's own error lines (its stderr, as the tool printed it or the wrapper logged it). */
function clientErrors(text) {
  return text.split('\n').map((l) => l.replace(/\x1b\[[0-9;]*m/g, ''))
    .filter((l) => /^(Error|Unhandled error|.*Error: )/.test(l.trim()) && !/\bDEBUG\b|\bINFO\b/.test(l))
    .slice(0, 3);
}

/** The client's `trace:` lines (auth-client.mjs) before its MCP calls succeed. */
function traces(text) {
  return text.split('\n').filter((l) => l.startsWith('trace: ')).map((l) => l.slice(7));
}

await runScenario('p-conformance-auth: conformance client auth/* scenarios, stock TS SDK OAuth client, direct vs through the proxy', async (checks) => {
  const list = await runConformance(['list'], { timeoutMs: 30000 });
  let scenarios = [...list.output.matchAll(/^\s*-\s+(auth\/\S+)/gm)].map((m) => m[1]);
  log(`the tool lists ${scenarios.length} client auth scenarios`);
  checks.ok(scenarios.length > 0, 'the installed conformance tool lists client auth/* scenarios', list.output.slice(0, 500));
  if (only.length) scenarios = scenarios.filter((s) => only.includes(s));

  const lost = [];
  const rows = [];
  for (const scenario of scenarios) {
    const direct = await runOne(scenario, 'direct');
    const proxy = await runOne(scenario, 'proxy');
    const pt = PASSTHROUGH[scenario];
    const configured = pt ? await runOne(scenario, 'proxy-passthrough', pt) : undefined;
    const best = configured?.pass ? configured : proxy;
    let verdict = 'same';
    if (direct.pass && !best.pass) {
      const failed = best.checks.filter((c) => c.status === 'FAILURE' || c.status === 'WARNING');
      const expected = EXPECTED[scenario];
      if (expected?.matches(failed, best.urls)) verdict = `differs, expected: ${expected.why}`;
      else {
        verdict = 'LOST through the proxy';
        lost.push(scenario);
      }
    } else if (!direct.pass && best.pass) verdict = 'gained through the proxy';
    console.log(`  ${scenario}: direct ${summary(direct)}, proxy ${summary(proxy)}${configured ? `, proxy with passthrough = ${JSON.stringify(pt)} ${summary(configured)}` : ''} => ${verdict}`);
    rows.push({ scenario, direct, proxy, configured, best });
    for (const [label, r] of [['proxy', proxy], ['proxy with passthrough', configured]]) {
      if (!r || r.pass === direct.pass) continue;
      // Why, from the tool's own checks: every check id whose statuses differ.
      const statuses = (cs) => {
        const m = new Map();
        for (const c of cs) if (c.status !== 'INFO') m.set(c.id, [...(m.get(c.id) ?? []), c]);
        return m;
      };
      const absent = [];
      const d = statuses(direct.checks);
      const p = statuses(r.checks);
      for (const id of new Set([...d.keys(), ...p.keys()])) {
        const ds = (d.get(id) ?? []).map((c) => c.status).join('+') || 'absent';
        const ps = (p.get(id) ?? []).map((c) => c.status).join('+') || 'absent';
        if (ds === ps || (p.get(id) ?? []).every((c) => c.status === 'SUCCESS') && ps !== 'absent') continue;
        if (ps === 'absent') { absent.push(id); continue; }
        const c = p.get(id)[0];
        console.log(`      [${label}] check ${id}: direct ${ds}, ${label} ${ps} — ${c.errorMessage ?? c.description}${c.details ? ` ${JSON.stringify(c.details).slice(0, 240)}` : ''}`);
      }
      if (absent.length) console.log(`      [${label}] never reached through the proxy (direct SUCCESS): ${absent.join(', ')}`);
      for (const e of clientErrors(r.clientLog)) console.log(`      [${label}] client: ${e.slice(0, 300)}`);
      // The exchanges that show it: the client's requests up to the first
      // that differs from direct's (the 401's challenge, the metadata's resource).
      for (const [who, t] of [['direct', direct], [label, r]]) {
        for (const l of traces(t.clientLog).slice(0, 6)) console.log(`      [${who}] ${l.slice(0, 320)}`);
      }
    }
  }
  const n = (f) => rows.filter(f).length;
  log(`direct: ${n((r) => r.direct.pass)}/${rows.length} pass; through the proxy: ${n((r) => r.proxy.pass)}/${rows.length} pass with no configuration, ${n((r) => r.best.pass)}/${rows.length} with the README's passthrough where listed`);
  checks.ok(lost.length === 0, 'every auth scenario that passes direct passes through the proxy', lost);
}, { timeoutMs: 280000 });
