//! The files of `deploy/` work against the real programs: the Prometheus
//! alerting rules pass `promtool check rules` and their unit tests, which
//! fire every alert; every series the rules and the Grafana dashboard read
//! is one the proxy's `/metrics` page shows; and every query of the
//! dashboard returns data from a real Prometheus scraping a proxy under load.
//!
//! `prometheus` and `promtool` come with Debian's `prometheus` package,
//! which `.ci/run` installs. Where they are missing a test says it skipped;
//! in CI (`CI` set) it fails instead.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::scrape::{sample, scrape};
use common::*;
use http::StatusCode;
use serde_json::{json, Value};

const DASHBOARD: &str = include_str!("../deploy/grafana/mcp-resume-proxy.json");
const RULES: &str = include_str!("../deploy/prometheus/alerts.yml");
const RULE_TESTS: &str = include_str!("../deploy/prometheus/alerts.test.yml");
/// Prometheus' start and its first scrapes, all within this.
const PROMETHEUS_LIMIT: Duration = Duration::from_secs(30);
/// Samples of each series Prometheus must hold before the dashboard's
/// queries run: a `rate()` needs two, a moving one more.
const SCRAPES: f64 = 5.0;

fn deploy_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path)
}

/// The program `name` of Debian's prometheus package, if it is installed;
/// in CI it must be.
fn program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain(["/usr/bin".into(), "/usr/local/bin".into()])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    assert!(
        found.is_some() || std::env::var_os("CI").is_none(),
        "{name} is not installed (.ci/run installs Debian's prometheus package)"
    );
    if found.is_none() {
        println!("skipped: {name} is not installed (Debian's prometheus package has it)");
    }
    found
}

/// Runs `promtool ARGS`; its output when it fails.
fn promtool(args: &[&Path]) -> Option<Result<(), String>> {
    let promtool = program("promtool")?;
    let out = Command::new(promtool)
        .args(args)
        .output()
        .expect("promtool runs");
    Some(if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    })
}

// ---------------------------------------------------------------------------
// The alerting rules

#[test]
fn the_alert_rules_pass_promtool_check_rules() {
    let rules = deploy_file("prometheus/alerts.yml");
    let check = promtool(&["check".as_ref(), "rules".as_ref(), &rules]);
    if let Some(Err(e)) = check {
        panic!("promtool check rules {}:\n{e}", rules.display());
    }
}

#[test]
fn the_alert_rules_pass_their_promtool_unit_tests() {
    let tests = deploy_file("prometheus/alerts.test.yml");
    let run = promtool(&["test".as_ref(), "rules".as_ref(), &tests]);
    if let Some(Err(e)) = run {
        panic!("promtool test rules {}:\n{e}", tests.display());
    }
}

/// The names of the alerts of `alerts.yml`.
fn alert_names() -> Vec<&'static str> {
    RULES
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(str::trim)
        .collect()
}

#[test]
fn every_alert_rule_has_a_unit_test_that_fires_it_and_one_that_does_not() {
    let names = alert_names();
    assert!(names.len() >= 7, "alerts.yml has {names:?}");
    // (alert, fires) of each `alertname:` of the tests, read from the
    // `exp_alerts:` line after it.
    let lines: Vec<&str> = RULE_TESTS.lines().map(str::trim).collect();
    let cases: Vec<(&str, bool)> = lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let name = l.strip_prefix("alertname:")?.trim();
            let expected = lines[i + 1..]
                .iter()
                .find(|l| l.starts_with("exp_alerts:"))?;
            Some((name, expected.trim_end() != "exp_alerts: []"))
        })
        .collect();
    for name in names {
        for fires in [true, false] {
            assert!(
                cases.contains(&(name, fires)),
                "alerts.test.yml has no case where {name} {}",
                if fires { "fires" } else { "stays quiet" }
            );
        }
    }
}

// ---------------------------------------------------------------------------
// The dashboard

fn dashboard() -> Value {
    serde_json::from_str(DASHBOARD).expect("the dashboard is JSON")
}

/// Every panel of the dashboard, those inside rows included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(panels: &'a Value, into: &mut Vec<&'a Value>) {
        for panel in panels.as_array().into_iter().flatten() {
            into.push(panel);
            walk(&panel["panels"], into);
        }
    }
    let mut all = Vec::new();
    walk(&dashboard["panels"], &mut all);
    all
}

/// (panel title, expr) of every query target of the dashboard.
fn exprs(dashboard: &Value) -> Vec<(String, String)> {
    panels(dashboard)
        .into_iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap_or_default().to_owned();
            panel["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |t| (title.clone(), t["expr"].as_str().unwrap_or_default().into()))
        })
        .collect()
}

/// The dashboard's template variable `name`.
fn variable<'a>(dashboard: &'a Value, name: &str) -> &'a Value {
    dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("the dashboard has no variable {name}"))
}

#[test]
fn the_dashboard_is_grafana_json_whose_panels_ask_the_chosen_prometheus() {
    let dashboard = dashboard();
    assert!(dashboard["schemaVersion"].as_u64() >= Some(36));
    assert_eq!(dashboard["uid"], "mcp-resume-proxy");
    let source = variable(&dashboard, "datasource");
    assert_eq!(source["type"], "datasource");
    assert_eq!(source["query"], "prometheus");
    let chosen = json!({"type": "prometheus", "uid": "${datasource}"});
    let mut ids = Vec::new();
    let mut queries = 0;
    for panel in panels(&dashboard) {
        let title = &panel["title"];
        ids.push(panel["id"].as_u64().expect("every panel has an id"));
        let grid = &panel["gridPos"];
        let (x, w) = (grid["x"].as_u64(), grid["w"].as_u64());
        assert!(
            x.zip(w).is_some_and(|(x, w)| x + w <= 24),
            "{title}: {grid}"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"], chosen, "{title}");
        let targets = panel["targets"].as_array().expect("a panel has targets");
        assert!(!targets.is_empty(), "{title} queries nothing");
        for target in targets {
            assert_eq!(target["datasource"], chosen, "{title}");
            assert!(target["expr"].as_str().is_some_and(|e| !e.is_empty()));
            queries += 1;
        }
    }
    let count = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), count, "panel ids repeat");
    assert!(queries >= 30, "{queries} queries");
}

// ---------------------------------------------------------------------------
// Series names against the metrics page

/// Every `mcp_proxy_…` name in `text`.
fn series_names(text: &str) -> Vec<&str> {
    text.match_indices("mcp_proxy_")
        .map(|(at, _)| {
            let tail = &text[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            &tail[..end]
        })
        .collect()
}

/// The sample names of a metrics page (`_total`, `_bucket`, … included).
fn page_names(page: &str) -> Vec<String> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// The names among `text` that the proxy's page lacks.
async fn unknown_series(text: &str) -> Vec<String> {
    let rig = Rig::start().await;
    let page = page_names(&scrape(&rig.client).await);
    let mut unknown: Vec<String> = series_names(text)
        .into_iter()
        .filter(|name| !page.iter().any(|p| p == name))
        .map(str::to_owned)
        .collect();
    unknown.sort();
    unknown.dedup();
    unknown
}

#[tokio::test]
async fn every_series_a_dashboard_query_reads_is_on_the_metrics_page() {
    let exprs = exprs(&dashboard());
    for (title, expr) in &exprs {
        assert!(!series_names(expr).is_empty(), "{title}: {expr}");
    }
    let all: Vec<&str> = exprs.iter().map(|(_, e)| e.as_str()).collect();
    let unknown = unknown_series(&all.join("\n")).await;
    assert!(unknown.is_empty(), "not on /metrics: {unknown:?}");
}

#[tokio::test]
async fn every_series_an_alert_rule_reads_is_on_the_metrics_page() {
    assert!(series_names(RULES).len() >= 7);
    let unknown = unknown_series(RULES).await;
    assert!(unknown.is_empty(), "not on /metrics: {unknown:?}");
}

// ---------------------------------------------------------------------------
// A real Prometheus

/// A `prometheus` server of this test, on a loopback port, scraping one
/// proxy every second; killed when dropped.
struct Prometheus {
    child: Child,
    client: McpClient,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(binary: &Path, job: &str, target: std::net::SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: {job}\n    static_configs:\n\
                 \x20     - targets: [\"{target}\"]\n"
            ),
        )
        .expect("config file");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let addr = common::process::free_addr();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("prometheus starts");
        Prometheus {
            child,
            client: McpClient::new(format!("http://{addr}")),
            dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    async fn get(&self, path: &str) -> StatusCode {
        let client = McpClient::new(format!("{}{path}", self.client.url));
        match client.try_send(Call::get()).await {
            Ok(res) => res.status(),
            Err(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// Waits until it answers `/-/ready`.
    async fn ready(&mut self) {
        let deadline = tokio::time::Instant::now() + PROMETHEUS_LIMIT;
        while self.get("/-/ready").await != StatusCode::OK {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("prometheus exited ({status}):\n{}", self.log());
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "prometheus not ready:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `POST /api/v1/query`: the answer's `data`.
    async fn query(&self, promql: &str) -> Value {
        let url = format!("{}/api/v1/query", self.client.url);
        let form = format!("query={}", form_encode(promql));
        let call = Call::raw_post(form).header("content-type", "application/x-www-form-urlencoded");
        let res = McpClient::new(url).send(call).await;
        let answer = body_json(res).await;
        assert_eq!(answer["status"], "success", "{promql}: {answer}");
        answer["data"].clone()
    }

    /// The value of a query whose answer is one sample (0 when none).
    async fn value(&self, promql: &str) -> f64 {
        let data = self.query(promql).await;
        data["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `application/x-www-form-urlencoded` encoding of `text`.
fn form_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `expr` with the dashboard's variables as a Grafana showing the last
/// hour of `job`, every instance, would put them.
fn substitute(expr: &str, job: &str) -> String {
    let values = [
        ("__rate_interval", "1m"),
        ("__interval", "15s"),
        ("__range", "1h"),
        ("datasource", "prometheus"),
        ("instance", ".*"),
        ("job", job),
    ];
    let mut text = expr.to_owned();
    for (name, value) in values {
        text = text
            .replace(&format!("${{{name}}}"), value)
            .replace(&format!("${name}"), value);
    }
    assert!(!text.contains('$'), "a variable left in {text}");
    text
}

/// A template variable's `label_values(SELECTOR, LABEL)` as a query with
/// one series for each value.
fn variable_query(query: &str) -> String {
    let inner = query
        .strip_prefix("label_values(")
        .and_then(|d| d.strip_suffix(')'))
        .and_then(|d| d.rsplit_once(','))
        .unwrap_or_else(|| panic!("not label_values(selector, label): {query}"));
    format!("count by ({}) ({})", inner.1.trim(), inner.0.trim())
}

/// Traffic of every kind the dashboard shows, over and over until `stop`:
/// a long call, a call cut mid-answer and resumed with `Last-Event-ID`
/// once its cut counted, and a JSON-RPC error.
async fn load(url: String, stop: Arc<AtomicBool>) -> u64 {
    let client = McpClient::new(url);
    let sid = client.initialize(V_LATEST).await;
    let unfinished =
        "mcp_proxy_requests_total{route=\"/mcp\",method=\"tools/call\",outcome=\"unfinished\"}";
    let mut rounds = 0;
    while !stop.load(Ordering::Relaxed) {
        let id = rounds * 3 + 10;
        let long = Call::post(&slow_call(id, 3, 100)).session(&sid);
        read_all(client.send(long).await).await;

        let cuts = sample(&scrape(&client).await, unfinished);
        let cut = Call::post(&slow_call(id + 1, 6, 100)).session(&sid);
        let mut reader = SseReader::new(client.send(cut).await);
        let (first, _) = reader.next_message().await.expect("a first message");
        drop(reader);
        let deadline = tokio::time::Instant::now() + LIMIT;
        while sample(&scrape(&client).await, unfinished) <= cuts {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the cut never counted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let first = first.expect("events carry ids");
        let resume = Call::get().session(&sid).header("last-event-id", &first);
        let res = client.send(resume).await;
        assert_eq!(res.status(), StatusCode::OK);
        read_all(res).await;

        let unknown = json!({"jsonrpc": "2.0", "id": id + 2, "method": "nope/never"});
        read_all(client.send(Call::post(&unknown).session(&sid)).await).await;
        rounds += 1;
    }
    rounds
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_data_from_a_real_prometheus_scraping_the_proxy() {
    let Some(binary) = program("prometheus") else {
        return;
    };
    let dashboard = dashboard();
    let job = variable(&dashboard, "job")["current"]["value"]
        .as_str()
        .expect("the job variable has a default")
        .to_owned();
    // A quota, so that the panels of the log's share of it have one.
    let rig = Rig::with(Default::default(), |c| {
        c.limits.max_log_bytes = Some(1 << 30)
    })
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = tokio::spawn(load(rig.client.url.clone(), stop.clone()));
    let addr = rig.proxy.as_ref().expect("the proxy runs").addr;
    let mut prometheus = Prometheus::start(&binary, &job, addr);
    prometheus.ready().await;

    let scraped = format!("count_over_time(mcp_proxy_ready{{job=\"{job}\"}}[1m])");
    let deadline = tokio::time::Instant::now() + PROMETHEUS_LIMIT;
    while prometheus.value(&scraped).await < SCRAPES {
        assert!(
            tokio::time::Instant::now() < deadline,
            "prometheus did not scrape the proxy {SCRAPES} times:\n{}",
            prometheus.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let mut queries: Vec<(String, String)> = dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let query = v["query"].as_str().expect("a variable's query");
            (format!("variable {}", v["name"]), variable_query(query))
        })
        .collect();
    queries.extend(exprs(&dashboard));
    let mut empty = Vec::new();
    for (title, expr) in &queries {
        let promql = substitute(expr, &job);
        let data = prometheus.query(&promql).await;
        let values: Vec<&str> = data["result"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["value"][1].as_str())
            .collect();
        // NaN alone is a histogram that saw nothing: a panel with no line.
        if values.iter().all(|v| *v == "NaN") {
            empty.push(format!("{title}: {promql}\n  {data}"));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = traffic.await.expect("the load ran without failing");
    println!("{} queries, after {rounds} rounds of load", queries.len());
    assert!(
        empty.is_empty(),
        "dashboard queries without data:\n{}",
        empty.join("\n")
    );
}
