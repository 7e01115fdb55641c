// Preload (`node -r ./bind-localhost.cjs <script>`): a listen() call that names
// no host binds 127.0.0.1 (or $BIND_HOST) instead of every interface.
// server-everything and the conformance tool's test servers call
// `app.listen(PORT)` without a host and have no option to change that.
'use strict';
const net = require('node:net');
const orig = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const host = process.env.BIND_HOST || '127.0.0.1';
  const a0 = args[0];
  if ((typeof a0 === 'number' || (typeof a0 === 'string' && /^\d+$/.test(a0))) && typeof args[1] !== 'string') {
    args.splice(1, 0, host);
  } else if (a0 && typeof a0 === 'object' && !Array.isArray(a0) && a0.port !== undefined && !a0.host) {
    args[0] = { ...a0, host };
  } else if (a0 === undefined || typeof a0 === 'function') {
    // listen() / listen(cb): a random port on every interface -> on host.
    args.unshift(0, host);
  }
  return orig.apply(this, args);
};
