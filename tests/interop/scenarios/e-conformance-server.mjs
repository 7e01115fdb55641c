// Scenario e: the conformance tool's server scenarios (suite "active")
// against server-everything directly and through mcp-resume-proxy.
//
// server-everything is not the conformance fixture server, so many checks fail
// directly (missing test_* tools, prompts, resources). What matters: every
// check that passes directly also passes through the proxy (the proxy takes
// nothing away), and `dns-rebinding-protection` passes through the proxy (it
// validates Origin/Host itself; server-everything does not).
//
// Extra probes (not conformance checks): a bad Host without Origin, and a bad
// Origin alone, sent straight to the proxy.
import http from 'node:http';
import path from 'node:path';
import {
  everythingStdioCommand, log, proxyHasUpstreamCommand, runScenario, startEverythingHttp, startProxy, workdir,
} from '../lib/harness.mjs';
import { passing, readChecks, runConformance } from '../lib/conformance.mjs';


function rawPost(port, headers) {
  return new Promise((resolve) => {
    const body = JSON.stringify({
      jsonrpc: '2.0', id: 1, method: 'initialize',
      params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'interop-host-probe', version: '0' } },
    });
    const req = http.request({
      host: '127.0.0.1', port, path: '/mcp', method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'content-length': Buffer.byteLength(body), ...headers },
    }, (res) => {
      let data = '';
      res.on('data', (d) => { data += d; });
      res.on('end', () => resolve({ status: res.statusCode, body: data.slice(0, 200) }));
    });
    req.on('error', (e) => resolve({ status: 0, body: String(e) }));
    req.setTimeout(5000, () => req.destroy(new Error('timeout')));
    req.end(body);
  });
}

await runScenario('e-conformance-server: conformance server suite, server-everything directly vs through the proxy', async (checks) => {
  const everything = await startEverythingHttp();
  const proxy = await startProxy({ upstream: everything.url });
  const out = path.join(workdir(), 'conformance');

  const targets = [['direct', everything.url], ['proxy', proxy.url]];
  if (proxyHasUpstreamCommand()) {
    const stdioProxy = await startProxy({ upstreamCommand: everythingStdioCommand(), name: 'proxy-stdio' });
    targets.push(['proxy-stdio', stdioProxy.url]);
  }
  const runs = {};
  for (const [label, url] of targets) {
    const t = Date.now();
    const r = await runConformance(['server', '--url', url, '--suite', 'active', '-o', path.join(out, label)], {
      timeoutMs: 90000, logFile: path.join(workdir(), `conformance-${label}.log`),
    });
    const summary = r.output.split('\n').find((l) => /^Total:/.test(l)) ?? '(no summary)';
    log(`conformance server ${label}: exit ${r.code}, ${summary}, ${Date.now() - t} ms`);
    runs[label] = readChecks(path.join(out, label));
    checks.ok(runs[label].length > 0, `${label}: checks.json results were written (${runs[label].length} checks)`);
  }
  const direct = passing(runs.direct);
  console.log(`  passing directly (${direct.size}): ${[...direct].sort().join(', ')}`);
  for (const [label] of targets.slice(1)) {
    const via = passing(runs[label]);
    console.log(`  passing ${label} (${via.size}): ${[...via].sort().join(', ')}`);
    const lost = [...direct].filter((c) => !via.has(c));
    const gained = [...via].filter((c) => !direct.has(c));
    console.log(`  gained ${label}: ${gained.join(', ') || '(none)'}`);
    for (const c of runs[label].filter((c) => lost.includes(`${c.scenario}/${c.id}`))) {
      console.log(`  lost ${label}: ${c.scenario}/${c.id}: ${c.status} ${c.errorMessage ?? ''} ${JSON.stringify(c.details ?? {}).slice(0, 300)}`);
    }
    checks.ok(lost.length === 0, `${label}: every check passing directly also passes through the proxy`, lost);
    const dns = runs[label].filter((c) => c.scenario === 'dns-rebinding-protection');
    for (const c of dns) console.log(`  ${label} dns-rebinding-protection/${c.id}: ${c.status} ${JSON.stringify(c.details ?? {}).slice(0, 200)}`);
    checks.ok(dns.length > 0 && dns.every((c) => c.status === 'SUCCESS'),
      `${label}: dns-rebinding-protection passes (every check)`, dns.map((c) => `${c.id}=${c.status}`));
  }
  const directDns = runs.direct.filter((c) => c.scenario === 'dns-rebinding-protection');
  log(`(directly, server-everything: ${directDns.map((c) => `${c.id}=${c.status}`).join(', ')})`);

  // Extra probes straight to the proxy.
  const badOrigin = await rawPost(proxy.port, { origin: 'http://evil.example.com' });
  log('probe: good Host, Origin http://evil.example.com ->', badOrigin.status, badOrigin.body);
  checks.ok(badOrigin.status === 403, `a non-localhost Origin alone is rejected by the proxy with 403 (got ${badOrigin.status})`);
  const badHost = await rawPost(proxy.port, { host: 'evil.example.com' });
  log('probe: Host evil.example.com, no Origin ->', badHost.status, badHost.body);
  checks.ok(badHost.status >= 400 && badHost.status < 500, `a non-localhost Host alone (no Origin) is rejected with 4xx (got ${badHost.status})`);
  const goodHost = await rawPost(proxy.port, { host: `localhost:${proxy.port}` });
  checks.ok(goodHost.status === 200, `Host localhost:PORT without Origin is accepted (got ${goodHost.status})`);
}, { timeoutMs: 200000 });
