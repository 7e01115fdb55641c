// Preload (`node -r ./bind-localhost-sync.cjs <script>`): bind-localhost.cjs,
// and a `listen(port)` that names no host binds 127.0.0.1 (or $BIND_HOST, an
// IP address) *synchronously*, so that `server.address()` right after
// `listen()` has the port, as it has when listening on every interface.
// The conformance tool's auth scenarios start their servers with
// `app.listen(0)` and read `address().port` on the next line; with a host
// argument Node binds after a lookup, and address() is still null.
'use strict';
require('./bind-localhost.cjs');
const net = require('node:net');
const { TCP, constants } = process.binding('tcp_wrap');
const viaLocalhost = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const a0 = args[0];
  const port = typeof a0 === 'number' ? a0 : (typeof a0 === 'string' && /^\d+$/.test(a0) ? Number(a0) : undefined);
  const host = process.env.BIND_HOST || '127.0.0.1';
  if (port !== undefined && typeof args[1] !== 'string' && net.isIP(host)) {
    const handle = new TCP(constants.SERVER);
    const err = net.isIPv6(host) ? handle.bind6(host, port, 0) : handle.bind(host, port);
    if (err === 0) return viaLocalhost.call(this, handle, ...args.slice(1));
    handle.close();
  }
  return viaLocalhost.apply(this, args);
};
