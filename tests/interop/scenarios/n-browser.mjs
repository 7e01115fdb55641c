// Scenario n: a real browser. Headless Chromium (Debian's `chromium`, driven
// by puppeteer-core over the DevTools port) loads a page from one origin
// (http://127.0.0.1:<p1>, a tiny static server run here) whose script is the
// official TS SDK client, bundled by esbuild at run time (lib/browser-client.mjs),
// and talks to an MCP server on another origin (http://localhost:<p2>/mcp):
// CORS preflights, exposed headers, then connect, tools/list, a long call
// (trigger-long-running-operation with progress), its SSE connections cut by
// the page (fetch aborted), the SDK's own resume (GET Last-Event-ID), the
// rest of the progress and the result exactly once.
//
//   direct:  page (127.0.0.1:p1) --> server-everything (localhost:p2/mcp)
//   proxy:   page (127.0.0.1:p1) --> mcp-resume-proxy (localhost:p3/mcp) --> server-everything
//
// Two cuts: `late` (the SDK reconnects after the call has ended: replayed
// from the store) and `early` (it reconnects while the call runs: the
// resumed stream must be re-attached live). server-everything does not
// re-attach a resumed GET to a running request (runbook G3), so `early`
// direct is reported, not checked; through the proxy both are checked.
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import esbuild from 'esbuild';
import puppeteer from 'puppeteer-core';
import {
  INTEROP_DIR, freePort, log, runScenario, sleep, start, startEverythingHttp, startProxy, waitForPort, workdir,
} from '../lib/harness.mjs';

const CHROMIUM = process.env.CHROMIUM_BIN || '/usr/bin/chromium';
const DURATION = 3;
const STEPS = 6;
const RUNS = {
  late: { cutAfter: 5, reconnectDelay: 2000 }, // progress 6 and the result come while the page is away
  early: { cutAfter: 2, reconnectDelay: 500 }, // the resume arrives while the call still runs
};
const only = process.argv[2]; // 'direct' | 'proxy' | undefined (both)

await runScenario(`n-browser${only ? ` (${only})` : ''}: headless Chromium, the TS SDK client bundled, cross-origin, cut and SDK resume, direct and through the proxy`, async (checks) => {
  if (!fs.existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing (run.sh installs Debian's chromium)`);
  const dir = workdir();
  // 1. The page: the SDK client bundled for the browser.
  await esbuild.build({
    entryPoints: [path.join(INTEROP_DIR, 'lib', 'browser-client.mjs')],
    bundle: true, format: 'esm', platform: 'browser', target: 'chrome120',
    outfile: path.join(dir, 'page', 'bundle.js'), logLevel: 'warning',
  });
  fs.writeFileSync(path.join(dir, 'page', 'index.html'),
    '<!doctype html><meta charset="utf-8"><title>interop n-browser</title><script type="module" src="/bundle.js"></script>\n');
  const pagePort = await freePort();
  const pageServer = http.createServer((req, res) => {
    const file = req.url === '/' ? 'index.html' : req.url === '/bundle.js' ? 'bundle.js' : undefined;
    if (!file) { res.writeHead(req.url === '/favicon.ico' ? 204 : 404).end(); return; }
    res.writeHead(200, { 'content-type': file.endsWith('.js') ? 'text/javascript' : 'text/html' });
    fs.createReadStream(path.join(dir, 'page', file)).pipe(res);
  });
  await new Promise((r) => pageServer.listen(pagePort, '127.0.0.1', r));
  const pageOrigin = `http://127.0.0.1:${pagePort}`;
  log(`page at ${pageOrigin}/ (bundle ${(fs.statSync(path.join(dir, 'page', 'bundle.js')).size / 1024).toFixed(0)} KiB)`);

  // 2. The browser.
  const dbgPort = await freePort();
  const chromium = start('chromium', CHROMIUM, [
    '--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run',
    '--no-default-browser-check', '--disable-extensions', '--remote-debugging-address=127.0.0.1',
    `--remote-debugging-port=${dbgPort}`, `--user-data-dir=${path.join(dir, 'chromium-profile')}`, 'about:blank',
  ]);
  await waitForPort(dbgPort, chromium, 30000);
  const browser = await puppeteer.connect({ browserURL: `http://127.0.0.1:${dbgPort}` });
  log(`chromium ${await browser.version()} (DevTools port ${dbgPort})`);

  try {
    const everything = await startEverythingHttp();
    const directTarget = `http://localhost:${everything.port}/mcp`;
    if (only !== 'proxy') {
      console.log(`-- DIRECT: page ${pageOrigin} -> server-everything ${directTarget}`);
      await preflight(checks, 'direct', directTarget, pageOrigin);
      await pageRun(checks, browser, pageOrigin, 'direct late', directTarget, RUNS.late, true);
      await pageRun(checks, browser, pageOrigin, 'direct early', directTarget, RUNS.early, false);
    }
    if (only !== 'direct') {
      const proxy = await startProxy({ upstream: everything.url });
      const proxyTarget = `http://localhost:${proxy.port}/mcp`;
      console.log(`-- THROUGH THE PROXY: page ${pageOrigin} -> proxy ${proxyTarget} -> server-everything ${everything.url}`);
      await preflight(checks, 'proxy', proxyTarget, pageOrigin);
      await pageRun(checks, browser, pageOrigin, 'proxy late', proxyTarget, RUNS.late, true);
      await pageRun(checks, browser, pageOrigin, 'proxy early', proxyTarget, RUNS.early, true);
    }
  } finally {
    await browser.close().catch(() => {});
    pageServer.close();
  }
}, { timeoutMs: 85000 });

/** The preflight the browser sends before its first POST, made by hand. */
async function preflight(checks, label, target, origin) {
  const u = new URL(target);
  const res = await new Promise((resolve, reject) => {
    const req = http.request({
      host: '127.0.0.1', port: u.port, path: u.pathname, method: 'OPTIONS',
      headers: {
        host: u.host, origin, 'access-control-request-method': 'POST',
        'access-control-request-headers': 'content-type,mcp-session-id,mcp-protocol-version,last-event-id',
      },
    }, (r) => { r.resume(); r.on('end', () => resolve(r)); });
    req.on('error', reject);
    req.end();
  });
  const h = res.headers;
  const allowOrigin = h['access-control-allow-origin'];
  log(`[${label}] preflight OPTIONS ${target} from ${origin} -> ${res.statusCode}; allow-origin=${allowOrigin} allow-headers=${h['access-control-allow-headers']} allow-methods=${h['access-control-allow-methods']}`);
  checks.ok(res.statusCode >= 200 && res.statusCode < 300 && (allowOrigin === '*' || allowOrigin === origin),
    `[${label}] CORS preflight OPTIONS ${u.pathname} from ${origin} -> ${res.statusCode} with Access-Control-Allow-Origin ${allowOrigin ?? '(none)'}`);
}

async function pageRun(checks, browser, pageOrigin, label, target, { cutAfter, reconnectDelay }, checked) {
  const ok = (cond, what, detail) => {
    if (checked) return checks.ok(cond, `[${label}] ${what}`, detail);
    log(`[${label}] note: ${cond ? 'as expected' : 'not'}: ${what}`);
    return cond;
  };
  const page = await browser.newPage();
  page.on('console', (m) => log(`[${label}] page ${m.type() === 'log' ? '' : `${m.type()}: `}${m.text()}`));
  page.on('pageerror', (e) => log(`[${label}] page error: ${e.message}`));
  await page.goto(`${pageOrigin}/`, { waitUntil: 'load' });
  await page.waitForFunction(() => typeof window.mcpRun === 'function', { timeout: 10000 });
  const waitMs = checked ? 30000 : DURATION * 1000 + 4000;
  const out = await page.evaluate((args) => window.mcpRun(args), { target, duration: DURATION, steps: STEPS, cutAfter, reconnectDelay, waitMs });
  await page.close();
  if (out.failure) log(`[${label}] the page stopped at ${out.failure}`);
  ok(Boolean(out.sessionId), `connected from ${out.origin} to ${target}; the page can read Mcp-Session-Id (${out.sessionId ?? 'not exposed / no session'})`);
  if (!out.sessionId) return;
  ok(out.tools?.includes('trigger-long-running-operation'), `tools/list (${out.tools?.length} tools)`);
  ok(out.cut?.n >= 1, `the page cut ${out.cut?.n ?? 0} live SSE connection(s) after progress ${cutAfter}`);
  if (checked) checks.progressExactlyOnce(out.progress, STEPS, `[${label}]`);
  else log(`[${label}] note: progress [${out.progress}] (server-everything does not re-attach a resumed GET to a running call, runbook G3)`);
  const text = out.result?.content?.[0]?.text ?? '';
  ok(/Long running operation completed/.test(text), `the result arrived after the resume${out.failure ? ` (${out.failure})` : ''}`, text || out.errors);
  const resumes = out.requests.filter((r) => r.method === 'GET' && r.lastEventId && r.at >= (out.cut?.at ?? Infinity));
  ok(resumes.some((r) => r.lastEventId === out.cut?.lastToken && r.status === 200),
    `the SDK resumed with GET Last-Event-ID = the last id it saw (${out.cut?.lastToken}) -> 200`, resumes);
  ok(out.requests.filter((r) => r.method === 'POST' && r.body === 'tools/call').length === 1, 'the tools/call was POSTed once (no re-send)');
  ok(new Set(out.tokens).size === out.tokens.length, `no event id delivered twice (${out.tokens.length} ids)`);
  await sleep(10);
}
