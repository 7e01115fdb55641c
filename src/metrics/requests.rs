//! The request series: every request the app answers, by route, MCP method
//! and outcome, with how long it took to its first byte and to its end;
//! `tools/call` requests by tool, for the tool names an operator listed; and
//! how long a client was away before it came back for a stream.
//!
//! Every series is made once the routes are known (at start-up, and again
//! for the routes of a reloaded configuration), and its handle kept in a
//! [`Table`] indexed by route, method and outcome: recording a request is a
//! few atomic adds, with no label lookup, no lock and no allocation. A
//! table made again for the same route names hands out the same series.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::labels::DialectLabel;
use super::Replayed;

/// At most this many tool names get a series of their own; the rest count
/// as `other`.
pub const MAX_TOOL_LABELS: usize = crate::config::MAX_METRICS_TOOLS;

/// How many [`Outcome`]s there are.
const OUTCOMES: usize = 6;

/// From a millisecond (a ping answered from memory) to five minutes (a
/// long tool call answered on one stream).
const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// From a reconnect at once to an hour away (a laptop closed over lunch).
const AWAY_BUCKETS: [f64; 12] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
];

/// What a request asked for, as the series label it: the methods MCP and
/// the proxy's dialects define, what is not one request, and `other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    Initialize,
    Ping,
    ToolsList,
    ToolsCall,
    ResourcesList,
    ResourcesTemplatesList,
    ResourcesRead,
    ResourcesSubscribe,
    ResourcesUnsubscribe,
    PromptsList,
    PromptsGet,
    CompletionComplete,
    LoggingSetLevel,
    TasksGet,
    TasksResult,
    TasksList,
    TasksCancel,
    ServerDiscover,
    RequestsGetStatus,
    RequestsResume,
    StreamResume,
    StreamPoll,
    StreamPollAll,
    /// A POST of notifications or responses only.
    Notification,
    /// A JSON-RPC batch with requests in it.
    Batch,
    /// A GET of a session's stream (standalone or resumed).
    GetStream,
    /// A DELETE ending a session.
    DeleteSession,
    /// A request method none of the above.
    Other,
    /// No MCP message: `/healthz`, `/metrics`, a discovery passage, a body
    /// that did not parse.
    None,
}

impl Method {
    pub const ALL: &'static [Self] = &[
        Method::Initialize,
        Method::Ping,
        Method::ToolsList,
        Method::ToolsCall,
        Method::ResourcesList,
        Method::ResourcesTemplatesList,
        Method::ResourcesRead,
        Method::ResourcesSubscribe,
        Method::ResourcesUnsubscribe,
        Method::PromptsList,
        Method::PromptsGet,
        Method::CompletionComplete,
        Method::LoggingSetLevel,
        Method::TasksGet,
        Method::TasksResult,
        Method::TasksList,
        Method::TasksCancel,
        Method::ServerDiscover,
        Method::RequestsGetStatus,
        Method::RequestsResume,
        Method::StreamResume,
        Method::StreamPoll,
        Method::StreamPollAll,
        Method::Notification,
        Method::Batch,
        Method::GetStream,
        Method::DeleteSession,
        Method::Other,
        Method::None,
    ];

    /// The label of a request's `method`.
    pub fn of(name: &str) -> Self {
        Self::ALL
            .iter()
            .copied()
            .take_while(|m| *m != Method::Notification)
            .find(|m| m.as_str() == name)
            .unwrap_or(Method::Other)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Method::Initialize => "initialize",
            Method::Ping => "ping",
            Method::ToolsList => "tools/list",
            Method::ToolsCall => "tools/call",
            Method::ResourcesList => "resources/list",
            Method::ResourcesTemplatesList => "resources/templates/list",
            Method::ResourcesRead => "resources/read",
            Method::ResourcesSubscribe => "resources/subscribe",
            Method::ResourcesUnsubscribe => "resources/unsubscribe",
            Method::PromptsList => "prompts/list",
            Method::PromptsGet => "prompts/get",
            Method::CompletionComplete => "completion/complete",
            Method::LoggingSetLevel => "logging/setLevel",
            Method::TasksGet => "tasks/get",
            Method::TasksResult => "tasks/result",
            Method::TasksList => "tasks/list",
            Method::TasksCancel => "tasks/cancel",
            Method::ServerDiscover => "server/discover",
            Method::RequestsGetStatus => "requests/getStatus",
            Method::RequestsResume => "requests/resume",
            Method::StreamResume => "stream/resume",
            Method::StreamPoll => "stream/poll",
            Method::StreamPollAll => "stream/poll/all",
            Method::Notification => "notification",
            Method::Batch => "batch",
            Method::GetStream => "get_stream",
            Method::DeleteSession => "delete_session",
            Method::Other => "other",
            Method::None => "none",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// How a request ended, as the series label it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A 2xx whose JSON-RPC response was a result.
    Result,
    /// A 2xx whose JSON-RPC response was an error (the upstream's or the
    /// proxy's).
    Error,
    /// A 2xx without a JSON-RPC response the proxy saw: a notification
    /// accepted, a page served, a session deleted, a modern answer passed
    /// through unread.
    Ok,
    /// A 4xx (its body may be a JSON-RPC error: the status says more).
    ClientError,
    /// A 5xx (likewise).
    ServerError,
    /// The answer ended before the request did: the client went away, the
    /// proxy drained, or a resume-token interim: the call goes on, and its
    /// client may come back for the rest.
    Unfinished,
}

impl Outcome {
    pub const ALL: &'static [Self] = &[
        Outcome::Result,
        Outcome::Error,
        Outcome::Ok,
        Outcome::ClientError,
        Outcome::ServerError,
        Outcome::Unfinished,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Result => "result",
            Outcome::Error => "error",
            Outcome::Ok => "ok",
            Outcome::ClientError => "client_error",
            Outcome::ServerError => "server_error",
            Outcome::Unfinished => "unfinished",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

super::labels::label_value!(Method, Outcome);

/// A route's name or a tool's, as a label value: shared, not copied, by
/// every series that carries it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Name(pub(super) Arc<str>);

impl EncodeLabelValue for Name {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), fmt::Error> {
        fmt::Write::write_str(encoder, &self.0)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    route: Name,
    method: Method,
    outcome: Outcome,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TimingLabels {
    route: Name,
    method: Method,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ToolLabels {
    route: Name,
    tool: Name,
    outcome: Outcome,
}

/// Where a request went, as the route label names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    /// The upstream mounted `n`th in the configuration.
    Mount(usize),
    /// `/healthz`.
    Health,
    /// `/metrics`.
    Metrics,
    /// Anything else: a discovery or authorization passage, a path no
    /// route serves, a request refused for its `Host` or `Origin`.
    Other,
}

/// One request as the series count it.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub route: Destination,
    pub method: Method,
    pub outcome: Outcome,
    /// The tool of a `tools/call`.
    pub tool: Option<&'a str>,
    pub first_byte: Option<Duration>,
    pub total: Duration,
}

/// The request families.
pub struct Requests {
    total: Family<RequestLabels, Counter>,
    first_byte: Family<TimingLabels, Histogram>,
    duration: Family<TimingLabels, Histogram>,
    tools: Family<ToolLabels, Counter>,
    away: Family<DialectLabel, Histogram>,
}

/// Every series of every route of one configuration, indexed:
/// `routes[route][method]`.
pub struct Table {
    routes: Vec<RouteSeries>,
    tool_names: Vec<Arc<str>>,
    away: Vec<Histogram>,
}

struct RouteSeries {
    /// `[method][outcome]`.
    total: Vec<[Counter; OUTCOMES]>,
    first_byte: Vec<Histogram>,
    duration: Vec<Histogram>,
    /// `[tool][outcome]`, the last tool being `other`.
    tools: Vec<[Counter; OUTCOMES]>,
}

fn latency() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

impl Requests {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let requests = Self {
            total: Family::default(),
            first_byte: Family::new_with_constructor(latency),
            duration: Family::new_with_constructor(latency),
            tools: Family::default(),
            away: Family::new_with_constructor(|| Histogram::new(AWAY_BUCKETS)),
        };
        registry.register(
            "requests",
            "Requests answered, by route (the upstream's mount path, /healthz, /metrics or other), MCP method and outcome",
            requests.total.clone(),
        );
        registry.register_with_unit(
            "request_first_byte",
            "Time from a request's arrival to the first byte of its answer's body",
            Unit::Seconds,
            requests.first_byte.clone(),
        );
        registry.register_with_unit(
            "request_duration",
            "Time from a request's arrival to the end of its answer (an SSE answer ends with its stream, or when its client goes away)",
            Unit::Seconds,
            requests.duration.clone(),
        );
        registry.register(
            "tool_calls",
            "tools/call requests by route, tool (the names listed in metrics_tools, the rest as other) and outcome",
            requests.tools.clone(),
        );
        registry.register_with_unit(
            "resume_away",
            "How long a client was away from a stream it came back for (its previous answer on this instance ended unfinished), by the dialect it came back with",
            Unit::Seconds,
            requests.away.clone(),
        );
        requests
    }

    /// Makes every series, at zero, for these mount paths and tool names
    /// (at most [`MAX_TOOL_LABELS`] of them); those that exist already are
    /// taken as they are.
    pub fn declare(&self, mounts: &[&str], tools: &[String]) -> Arc<Table> {
        let mut names: Vec<Arc<str>> = mounts.iter().map(|m| Arc::from(*m)).collect();
        names.extend(["/healthz", "/metrics", "other"].map(Arc::from));
        let mut tool_names: Vec<Arc<str>> = tools
            .iter()
            .take(MAX_TOOL_LABELS)
            .map(|t| Arc::from(t.as_str()))
            .collect();
        tool_names.push(Arc::from("other"));
        let routes = names
            .iter()
            .map(|name| self.route_series(name, &tool_names))
            .collect();
        let away = Replayed::ALL
            .iter()
            .map(|&dialect| self.away.get_or_create(&DialectLabel { dialect }).clone())
            .collect();
        Arc::new(Table {
            routes,
            tool_names,
            away,
        })
    }

    fn route_series(&self, route: &Arc<str>, tools: &[Arc<str>]) -> RouteSeries {
        let route = Name(route.clone());
        let outcomes =
            |count: &dyn Fn(Outcome) -> Counter| std::array::from_fn(|i| count(Outcome::ALL[i]));
        let timing = |method| TimingLabels {
            route: route.clone(),
            method,
        };
        RouteSeries {
            total: Method::ALL
                .iter()
                .map(|&method| {
                    outcomes(&|outcome| {
                        let labels = RequestLabels {
                            route: route.clone(),
                            method,
                            outcome,
                        };
                        self.total.get_or_create(&labels).clone()
                    })
                })
                .collect(),
            first_byte: Method::ALL
                .iter()
                .map(|&m| self.first_byte.get_or_create(&timing(m)).clone())
                .collect(),
            duration: Method::ALL
                .iter()
                .map(|&m| self.duration.get_or_create(&timing(m)).clone())
                .collect(),
            tools: tools
                .iter()
                .map(|tool| {
                    outcomes(&|outcome| {
                        let labels = ToolLabels {
                            route: route.clone(),
                            tool: Name(tool.clone()),
                            outcome,
                        };
                        self.tools.get_or_create(&labels).clone()
                    })
                })
                .collect(),
        }
    }
}

impl Table {
    /// Counts one request that ended.
    pub fn record(&self, request: &Request<'_>) {
        let table = self;
        let route = match request.route {
            Destination::Mount(i) => i,
            Destination::Health => table.routes.len() - 3,
            Destination::Metrics => table.routes.len() - 2,
            Destination::Other => table.routes.len() - 1,
        };
        let Some(series) = table.routes.get(route) else {
            return;
        };
        let (method, outcome) = (request.method.index(), request.outcome.index());
        series.total[method][outcome].inc();
        series.duration[method].observe(request.total.as_secs_f64());
        if let Some(first) = request.first_byte {
            series.first_byte[method].observe(first.as_secs_f64());
        }
        if let Some(tool) = request.tool {
            let other = table.tool_names.len() - 1;
            let i = table.tool_names[..other]
                .iter()
                .position(|name| name.as_ref() == tool)
                .unwrap_or(other);
            series.tools[i][outcome].inc();
        }
    }

    /// A client came back for a stream after `away`.
    pub fn came_back(&self, dialect: Replayed, away: Duration) {
        let i = Replayed::ALL.iter().position(|d| *d == dialect);
        if let Some(histogram) = i.and_then(|i| self.away.get(i)) {
            histogram.observe(away.as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_labels_name_mcp_methods_and_everything_else_other() {
        assert_eq!(Method::of("tools/call"), Method::ToolsCall);
        assert_eq!(Method::of("stream/poll/all"), Method::StreamPollAll);
        assert_eq!(Method::of("notification"), Method::Other);
        assert_eq!(Method::of("none"), Method::Other);
        assert_eq!(Method::of("x/y"), Method::Other);
    }

    #[test]
    fn the_tables_follow_the_label_enums() {
        for (i, m) in Method::ALL.iter().enumerate() {
            assert_eq!(m.index(), i, "{m:?}");
        }
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(o.index(), i, "{o:?}");
        }
    }
}
