//! The demo MCP server's stdio mode, driven in-process over in-memory pipes:
//! newline-delimited JSON-RPC, one session per connection, calls running
//! concurrently, cancellation, server-to-client requests and end of input.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use mcp_resume_proxy::demo::stdio::serve;
use mcp_resume_proxy::demo::upstream::DemoStats;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines};
use tokio::task::JoinHandle;

async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("test timed out")
}

/// The client end of a stdio connection to a running `serve`.
struct Client {
    /// The server's stdin; None once closed.
    input: Option<DuplexStream>,
    /// The server's stdout, line by line.
    output: Lines<BufReader<DuplexStream>>,
    serve: JoinHandle<std::io::Result<()>>,
    stats: Arc<DemoStats>,
}

impl Client {
    fn start() -> Client {
        let (input, server_input) = tokio::io::duplex(1 << 16);
        let (server_output, output) = tokio::io::duplex(1 << 16);
        let stats = Arc::new(DemoStats::default());
        let serve = tokio::spawn(serve(server_input, server_output, stats.clone()));
        Client {
            input: Some(input),
            output: BufReader::new(output).lines(),
            serve,
            stats,
        }
    }

    async fn started() -> Client {
        let mut client = Client::start();
        client.initialize("2025-11-25").await;
        client
    }

    async fn write_raw(&mut self, bytes: &[u8]) {
        let input = self.input.as_mut().expect("input closed");
        input.write_all(bytes).await.unwrap();
    }

    async fn send(&mut self, message: Value) {
        let mut line = message.to_string();
        line.push('\n');
        self.write_raw(line.as_bytes()).await;
    }

    /// The next line of output, parsed; None at end of output.
    async fn next(&mut self) -> Option<Value> {
        let line = self.output.next_line().await.unwrap()?;
        Some(serde_json::from_str(&line).expect("every output line is one JSON message"))
    }

    async fn recv(&mut self) -> Value {
        self.next().await.expect("output ended")
    }

    /// Reads until the response with `id`, returning it and what came before.
    async fn response(&mut self, id: Value) -> (Value, Vec<Value>) {
        let mut before = Vec::new();
        loop {
            let message = self.recv().await;
            if message["id"] == id && message.get("method").is_none() {
                return (message, before);
            }
            before.push(message);
        }
    }

    async fn initialize(&mut self, version: &str) -> Value {
        self.send(json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": version,
                "capabilities": {"elicitation": {}, "sampling": {}},
                "clientInfo": {"name": "test", "version": "1"},
            },
        }))
        .await;
        let (response, before) = self.response(json!(0)).await;
        assert!(before.is_empty(), "{before:?}");
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        response
    }

    async fn call(&mut self, id: u64, name: &str, arguments: Value, token: Option<&str>) {
        let mut params = json!({"name": name, "arguments": arguments});
        if let Some(token) = token {
            params["_meta"] = json!({"progressToken": token});
        }
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}))
            .await;
    }

    async fn ping(&mut self, id: u64) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "ping"}))
            .await;
    }

    fn close_input(&mut self) {
        self.input = None;
    }

    fn counter(&self, pick: fn(&DemoStats) -> &std::sync::atomic::AtomicU64) -> u64 {
        pick(&self.stats).load(Ordering::Relaxed)
    }
}

fn text(response: &Value) -> &str {
    response["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("not a text result: {response}"))
}

#[tokio::test]
async fn initialize_echoes_a_supported_version_else_offers_the_latest() {
    bounded(async {
        let mut client = Client::start();
        let response = client.initialize("2025-06-18").await;
        assert_eq!(response["jsonrpc"], "2.0");
        assert_eq!(response["result"]["protocolVersion"], "2025-06-18");
        assert_eq!(response["result"]["serverInfo"]["name"], "demo-upstream");
        assert!(response["result"]["capabilities"]["tools"].is_object());
        assert!(response["result"].get("resultType").is_none());
        assert_eq!(client.counter(|s| &s.sessions_created), 1);

        let mut client = Client::start();
        let response = client.initialize("1999-01-01").await;
        assert_eq!(response["result"]["protocolVersion"], "2025-11-25");
    })
    .await;
}

#[tokio::test]
async fn a_second_initialize_is_refused_with_its_id() {
    bounded(async {
        let mut client = Client::started().await;
        client
            .send(json!({"jsonrpc": "2.0", "id": 9, "method": "initialize", "params": {}}))
            .await;
        let response = client.recv().await;
        assert_eq!(response["id"], 9);
        assert_eq!(response["error"]["code"], -32600);
    })
    .await;
}

#[tokio::test]
async fn requests_before_initialize_are_refused_except_ping() {
    bounded(async {
        let mut client = Client::start();
        client.ping(1).await;
        assert_eq!(
            client.recv().await,
            json!({"jsonrpc": "2.0", "id": 1, "result": {}})
        );
        client.call(2, "echo", json!({"text": "hi"}), None).await;
        let response = client.recv().await;
        assert_eq!(response["id"], 2);
        assert_eq!(response["error"]["code"], -32600);
        assert_eq!(client.counter(|s| &s.calls_started), 0);
    })
    .await;
}

#[tokio::test]
async fn tools_list_and_echo_answer_on_one_line_each() {
    bounded(async {
        let mut client = Client::started().await;
        client
            .send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
            .await;
        let (tools, _) = client.response(json!(1)).await;
        let names: Vec<&str> = tools["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["echo", "slow", "ask", "paged", "spoof", "notify"]);

        // A newline in the payload stays escaped: still one line.
        client
            .call(2, "echo", json!({"text": "two\nlines"}), None)
            .await;
        let (echo, before) = client.response(json!(2)).await;
        assert!(before.is_empty(), "{before:?}");
        assert_eq!(text(&echo), "two\nlines");
    })
    .await;
}

#[tokio::test]
async fn slow_call_sends_progress_in_order_then_its_result() {
    bounded(async {
        let mut client = Client::started().await;
        client
            .call(
                1,
                "slow",
                json!({"steps": 4, "interval_ms": 10}),
                Some("p1"),
            )
            .await;
        let (result, before) = client.response(json!(1)).await;
        let progress: Vec<u64> = before
            .iter()
            .map(|m| {
                assert_eq!(m["method"], "notifications/progress");
                assert_eq!(m["params"]["progressToken"], "p1");
                assert_eq!(m["params"]["total"], 4);
                m["params"]["progress"].as_u64().unwrap()
            })
            .collect();
        assert_eq!(progress, [1, 2, 3, 4]);
        assert_eq!(text(&result), "slow done after 4 steps");
        assert_eq!(client.counter(|s| &s.calls_completed), 1);
    })
    .await;
}

#[tokio::test]
async fn a_slow_call_does_not_hold_up_a_ping() {
    bounded(async {
        let mut client = Client::started().await;
        client
            .call(1, "slow", json!({"steps": 1, "interval_ms": 60_000}), None)
            .await;
        client.ping(2).await;
        let (pong, before) = client.response(json!(2)).await;
        assert!(before.is_empty(), "{before:?}");
        assert_eq!(pong["result"], json!({}));
    })
    .await;
}

#[tokio::test]
async fn ask_sends_elicitation_on_the_output_and_returns_the_clients_answer() {
    bounded(async {
        let mut client = Client::started().await;
        client.call(1, "ask", json!({"kind": "elicitation"}), None).await;
        let request = client.recv().await;
        assert_eq!(request["method"], "elicitation/create");
        let id = request["id"].clone();
        assert!(id.is_string(), "{request}");

        // The call is waiting; other requests still get answered meanwhile.
        client.ping(2).await;
        let (_, before) = client.response(json!(2)).await;
        assert!(before.is_empty(), "{before:?}");

        client
            .send(json!({"jsonrpc": "2.0", "id": id, "result": {"action": "accept", "content": {"colour": "teal"}}}))
            .await;
        let (result, before) = client.response(json!(1)).await;
        assert!(before.is_empty(), "{before:?}");
        assert!(text(&result).contains("teal"), "{result}");
        assert!(result["result"].get("isError").is_none());
    })
    .await;
}

#[tokio::test]
async fn ask_sampling_reports_a_client_error() {
    bounded(async {
        let mut client = Client::started().await;
        client.call(1, "ask", json!({"kind": "sampling"}), None).await;
        let request = client.recv().await;
        assert_eq!(request["method"], "sampling/createMessage");
        client
            .send(json!({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -1, "message": "no"}}))
            .await;
        let (result, _) = client.response(json!(1)).await;
        assert_eq!(result["result"]["isError"], true);
    })
    .await;
}

#[tokio::test]
async fn notify_writes_its_log_message_at_once() {
    bounded(async {
        let mut client = Client::started().await;
        client.call(1, "notify", json!({"text": "hello"}), None).await;
        let (result, before) = client.response(json!(1)).await;
        assert_eq!(
            before,
            [json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "hello"}})]
        );
        assert_eq!(text(&result), "sent");
    })
    .await;
}

#[tokio::test]
async fn cancelled_notification_stops_the_call_without_a_response() {
    bounded(async {
        let mut client = Client::started().await;
        client
            .call(7, "slow", json!({"steps": 1000, "interval_ms": 10}), Some("p"))
            .await;
        let first = client.recv().await;
        assert_eq!(first["method"], "notifications/progress");
        client
            .send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7, "reason": "test"}}))
            .await;
        while client.counter(|s| &s.calls_cancelled) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Progress already queued may still arrive; no response ever does.
        client.ping(8).await;
        let (_, before) = client.response(json!(8)).await;
        assert!(before.iter().all(|m| m["id"].is_null()), "{before:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        client.ping(9).await;
        let (_, before) = client.response(json!(9)).await;
        assert!(before.is_empty(), "{before:?}");
        assert_eq!(client.counter(|s| &s.calls_cancelled), 1);
        assert_eq!(client.counter(|s| &s.calls_completed), 0);
    })
    .await;
}

#[tokio::test]
async fn malformed_line_gets_a_parse_error_with_null_id_and_serving_goes_on() {
    bounded(async {
        let mut client = Client::started().await;
        client
            .write_raw(b"{\"jsonrpc\": \"2.0\", \"id\": 1,\n")
            .await;
        let error = client.recv().await;
        assert_eq!(error["id"], Value::Null);
        assert_eq!(error["error"]["code"], -32700);

        client.write_raw(b"\xff\xfe not utf-8\n").await;
        assert_eq!(client.recv().await["error"]["code"], -32700);

        client.send(json!({"jsonrpc": "2.0", "id": 3})).await;
        let error = client.recv().await;
        assert_eq!(error["id"], Value::Null);
        assert_eq!(error["error"]["code"], -32600);

        // Blank lines are ignored.
        client.write_raw(b"\n  \r\n").await;
        client.ping(4).await;
        assert_eq!(
            client.recv().await,
            json!({"jsonrpc": "2.0", "id": 4, "result": {}})
        );
    })
    .await;
}

#[tokio::test]
async fn a_batch_gets_one_array_answer() {
    bounded(async {
        let mut client = Client::started().await;
        client
            .send(json!([
                {"jsonrpc": "2.0", "id": 1, "method": "ping"},
                {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "b"}}},
            ]))
            .await;
        let answer = client.recv().await;
        let answers = answer.as_array().expect("an array");
        assert_eq!(answers.len(), 2);
        assert_eq!(answers[0]["id"], 1);
        assert_eq!(text(&answers[1]), "b");
    })
    .await;
}

#[tokio::test]
async fn eof_on_input_cancels_running_calls_and_ends_serve() {
    bounded(async {
        let mut client = Client::started().await;
        client
            .call(
                1,
                "slow",
                json!({"steps": 1000, "interval_ms": 10}),
                Some("p"),
            )
            .await;
        assert_eq!(client.recv().await["method"], "notifications/progress");
        client.close_input();
        let served = tokio::time::timeout(Duration::from_secs(1), &mut client.serve)
            .await
            .expect("serve ends promptly at end of input");
        served.unwrap().unwrap();
        // The output ends too, and the slow call never answered.
        while let Some(message) = client.next().await {
            assert_eq!(message["method"], "notifications/progress", "{message}");
        }
        assert_eq!(client.counter(|s| &s.calls_cancelled), 1);
        assert_eq!(client.counter(|s| &s.sessions_deleted), 1);
    })
    .await;
}

#[tokio::test]
async fn eof_right_after_a_request_still_answers_it() {
    bounded(async {
        let mut client = Client::started().await;
        client.call(1, "echo", json!({"text": "last"}), None).await;
        client.close_input();
        let (echo, _) = client.response(json!(1)).await;
        assert_eq!(text(&echo), "last");
        assert!(client.next().await.is_none());
        client.serve.await.unwrap().unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_write_error_ends_serve_with_that_error() {
    bounded(async {
        let mut client = Client::started().await;
        client
            .call(
                1,
                "slow",
                json!({"steps": 1000, "interval_ms": 10}),
                Some("p"),
            )
            .await;
        // The client stops reading: the next progress write breaks the pipe.
        let Client {
            output,
            serve,
            stats,
            input: _input,
        } = client;
        drop(output);
        let served = serve.await.unwrap();
        assert_eq!(served.unwrap_err().kind(), std::io::ErrorKind::BrokenPipe);
        assert_eq!(stats.calls_cancelled.load(Ordering::Relaxed), 1);
    })
    .await;
}
