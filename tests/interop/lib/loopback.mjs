// A server the interop tests put between peers (the cutting relay, the
// round-robin balancer): listens on 127.0.0.1 only and names its MCP URL.
export class LoopbackServer {
  /** @param {import('node:net').Server} server */
  constructor(server) {
    this.server = server;
  }

  /** Listens on 127.0.0.1 (random port unless given); resolves to the port. */
  async listen(port = 0) {
    await new Promise((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(port, '127.0.0.1', resolve);
    });
    this.port = this.server.address().port;
    return this.port;
  }

  get url() {
    return `http://127.0.0.1:${this.port}/mcp`;
  }
}
