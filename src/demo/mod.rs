//! The `demo` command: a small MCP server with a slow tool, in a process of
//! its own, behind the proxy, and the curl commands that show a call dropped
//! and resumed. The same server ([`upstream::DemoUpstream`]) is the upstream
//! of the integration tests, so what newcomers see is what the tests check.

mod mrtr;
pub mod process;
mod responses;
mod session;
mod session_wide_replay;
mod stats;
pub mod stdio;
mod stream_log;
pub mod upstream;

use crate::config::{Config, UpstreamConfig};
use crate::server::Server;
use process::UpstreamProcess;

/// Starts the demo upstream (or adopts the one a demo killed on the same
/// data directory left running) and the proxy in front of it, prints a
/// walkthrough, and serves until Ctrl-C, which stops both.
pub async fn run(mut config: Config) -> anyhow::Result<()> {
    let demo = UpstreamProcess::adopt_or_start(&config.data_dir).await?;
    let mut upstream = UpstreamConfig::new(demo.url());
    // Step 6: the 2025-11-25 tasks are opt-in; the demo shows them.
    upstream.tasks.legacy = true;
    config.upstream = vec![upstream];
    let started = match config.validate() {
        Ok(()) => Server::start(config).await,
        Err(e) => Err(e.into()),
    };
    let server = match started {
        Ok(server) => server,
        Err(e) => {
            demo.stop().await;
            return Err(e);
        }
    };
    println!(
        "{}",
        walkthrough(&format!("http://{}/mcp", server.addr), &demo.url())
    );
    server.run_until(crate::shutdown_signal()).await;
    demo.stop().await;
    Ok(())
}

fn walkthrough(proxy: &str, upstream: &str) -> String {
    format!(
        r#"
mcp-resume-proxy demo
  demo upstream (an MCP server with a slow tool): {upstream}
  proxy in front of it:                           {proxy}

1. Open a session; note the Mcp-Session-Id header in the answer:

   curl -si {proxy} -H 'Content-Type: application/json' \
     -H 'Accept: application/json, text/event-stream' \
     -d '{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-11-25","capabilities":{{}},"clientInfo":{{"name":"curl","version":"1"}}}}}}'

   export SID=<the Mcp-Session-Id value>

2. Start a slow call (20 steps, one per second) and drop it after 3 seconds:

   curl -sN --max-time 3 {proxy} -H "Mcp-Session-Id: $SID" \
     -H 'MCP-Protocol-Version: 2025-11-25' -H 'Content-Type: application/json' \
     -H 'Accept: application/json, text/event-stream' \
     -d '{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"slow","arguments":{{"steps":20,"interval_ms":1000}},"_meta":{{"progressToken":"p1"}}}}}}'

   Every event has an id. Copy the last one you saw.

3. Wait a few seconds (the call keeps running and the proxy keeps logging),
   then resume after that id: the missed progress arrives at once, the rest
   live, and the result last.

   curl -sN {proxy} -H "Mcp-Session-Id: $SID" -H 'Accept: text/event-stream' \
     -H 'MCP-Protocol-Version: 2025-11-25' -H 'Last-Event-ID: <the id>'

   Kill the demo with kill -9 in the middle and start it again in the same
   directory: the resume still works, and the call goes on to its result.
   The demo's upstream is a process of its own that outlives the kill, as a
   real upstream outlives its proxy, and the restarted demo takes it over.

4. The resumability dialects: open a session that declares them (its result
   advertises them under capabilities.experimental), then run step 2 again
   in it (with "notifications/initialized" first, as any client would):

   curl -si {proxy} -H 'Content-Type: application/json' \
     -H 'Accept: application/json, text/event-stream' \
     -d '{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-11-25","capabilities":{{"resumableRequests":{{}},"streams":{{}}}},"clientInfo":{{"name":"curl","version":"1"}}}}}}'

   The call's first events are notifications/requests/resumePolicy (with a
   resumeToken) and notifications/stream/create (with a streamId). Then, with
   the same headers as step 2:

   -d '{{"jsonrpc":"2.0","id":3,"method":"requests/getStatus","params":{{"requestId":2,"resumeToken":"<token>"}}}}'
   -d '{{"jsonrpc":"2.0","id":2,"method":"requests/resume","params":{{"resumeToken":"<token>"}}}}'
   -d '{{"jsonrpc":"2.0","id":4,"method":"stream/poll","params":{{"streamId":"<streamId>"}}}}'
   -d '{{"jsonrpc":"2.0","id":5,"method":"stream/resume","params":{{"streamId":"<streamId>"}}}}'

5. Tasks, for modern (2026-07-28) clients: no session, and the request
   declares the tasks extension in its own _meta. A call still running after
   a second becomes a task the proxy keeps, even across a kill -9:

   curl -s {proxy} -H 'MCP-Protocol-Version: 2026-07-28' -H 'Mcp-Method: tools/call' \
     -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
     -d '{{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{{"name":"slow","arguments":{{"steps":20,"interval_ms":1000}},"_meta":{{"io.modelcontextprotocol/clientCapabilities":{{"extensions":{{"io.modelcontextprotocol/tasks":{{}}}}}}}}}}}}'

   The answer has resultType "task" and a taskId. Poll it (working, then
   completed with the tool's result), or cancel it, with the same headers
   but Mcp-Method: tasks/get (or tasks/cancel):

   -d '{{"jsonrpc":"2.0","id":7,"method":"tasks/get","params":{{"taskId":"<taskId>","_meta":{{"io.modelcontextprotocol/clientCapabilities":{{"extensions":{{"io.modelcontextprotocol/tasks":{{}}}}}}}}}}}}'

6. Tasks, for 2025-11-25 clients (the experimental tasks; this demo turns
   them on with [upstream.tasks] legacy = true). In the session of step 1, a
   call with params.task is answered at once with a task:

   curl -s {proxy} -H 'Content-Type: application/json' \
     -H 'Accept: application/json, text/event-stream' -H "Mcp-Session-Id: $SID" \
     -d '{{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{{"name":"slow","arguments":{{"steps":20,"interval_ms":1000}},"task":{{"ttl":600000}},"_meta":{{"progressToken":"t8"}}}}}}'

   Then tasks/get (working, then completed), tasks/list, tasks/cancel, or
   tasks/result, which waits for the end and brings the call's progress
   first, then its result:

   -d '{{"jsonrpc":"2.0","id":9,"method":"tasks/result","params":{{"taskId":"<taskId>"}}}}'

Ctrl-C stops the demo.
"#
    )
}
