//! `mcp-resume-proxy streams list|show`: what the log under a data directory
//! holds, for an operator looking at a stuck call.
//!
//! Read-only and safe while the proxy runs: the journal is read through
//! [`crate::store::journal::inspect`], which takes no lock and writes
//! nothing. sled cannot be opened while another process holds it, so with
//! that backend this works only on a stopped proxy's directory (and opening
//! it lets sled do its own housekeeping, as any open does). The Redis
//! backend (named by the configuration file) is read while the instances
//! run, as an observer that takes no lease. This module owns
//! the choice of backend and the presentation: a table for people, JSON
//! lines for tools.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail};
use serde::Serialize;
use serde_json::Value;

use crate::config::{Backend, StoreConfig};
use crate::id::StreamId;
use crate::store::commit::SyncMode;
use crate::store::journal::inspect::JournalView;
use crate::store::rfc3339;
use crate::store::sled::SledStore;
use crate::store::{
    now_ms, Entry, Outcome, Store, StoreError, StreamKind, StreamMeta, StreamStatus, UpstreamMark,
};

/// Characters of a message shown per entry in table mode.
const MESSAGE_WIDTH: usize = 160;

pub struct ListOptions {
    /// Only streams still live.
    pub live: bool,
    /// Only streams of the session whose id starts with this.
    pub session: Option<String>,
    pub json: bool,
}

pub struct ShowOptions {
    /// A stream id, or a prefix of exactly one.
    pub id: String,
    /// How many of the newest entries to show.
    pub entries: usize,
    pub json: bool,
}

/// Where the log to inspect is.
pub struct Source<'a> {
    pub data_dir: &'a Path,
    /// The backend a configuration file names; `None` (no file): whichever
    /// one the data directory holds.
    pub backend: Option<Backend>,
    /// The Redis server and prefix, for `backend = "redis"`.
    pub store: &'a StoreConfig,
}

/// The log, opened for reading.
enum Log {
    Journal(JournalView),
    Sled(SledStore),
    /// Read while the instances run: Redis answers every reader whole.
    Redis(Box<dyn Store>),
}

impl Log {
    /// Opens the log of `backend` under `data_dir`; with no backend named (no
    /// configuration file), whichever one the directory holds.
    async fn open(source: &Source<'_>) -> anyhow::Result<Self> {
        let (data_dir, backend) = (source.data_dir, source.backend);
        let journal = data_dir.join("journal");
        let sled = data_dir.join("log");
        let backend = match backend {
            Some(b) => b,
            None if journal.is_dir() => Backend::Journal,
            None if sled.is_dir() => Backend::Sled,
            None => bail!(
                "no log in {}: neither journal/ nor log/ is there (is this the proxy's data_dir?)",
                data_dir.display()
            ),
        };
        match backend {
            Backend::Redis => {
                let store = &source.store;
                let at = store.redis_endpoint();
                let observer = crate::store::redis::observe_log(&at, &store.key_prefix);
                Ok(Log::Redis(observer.await?))
            }
            Backend::Journal => Ok(Log::Journal(JournalView::open(data_dir)?)),
            Backend::Sled => {
                // sled creates a database where there is none: refuse
                // instead of leaving an empty one behind.
                if !sled.is_dir() {
                    bail!("no sled log in {}", sled.display());
                }
                match SledStore::open(data_dir, SyncMode::Batch) {
                    Ok(store) => Ok(Log::Sled(store)),
                    Err(StoreError::InUse(_)) => bail!(
                        "the sled backend cannot be inspected while the proxy runs \
                         ({} is locked); stop it or use the journal backend",
                        data_dir.display()
                    ),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// What the operator should know about how the log was read.
    fn notes(&self) -> &[String] {
        match self {
            Log::Journal(view) => &view.notes,
            Log::Sled(_) | Log::Redis(_) => &[],
        }
    }

    /// Every stream, oldest first.
    async fn streams(&self) -> anyhow::Result<Vec<StreamMeta>> {
        let mut all = match self {
            Log::Journal(view) => view.streams().cloned().collect(),
            Log::Sled(store) => store.list_streams().await?,
            Log::Redis(store) => store.list_streams().await?,
        };
        all.sort_by_key(|m| (m.created_ms, m.id));
        Ok(all)
    }

    async fn last_entries(&self, meta: &StreamMeta, n: usize) -> anyhow::Result<Vec<Entry>> {
        Ok(match self {
            Log::Journal(view) => view.last_entries(meta.id, n)?,
            Log::Sled(store) => {
                let after = meta.entries.saturating_sub(n as u64);
                store.read_after(meta.id, after, n).await?
            }
            Log::Redis(store) => {
                let after = meta.entries.saturating_sub(n as u64);
                store.read_after(meta.id, after, n).await?
            }
        })
    }
}

/// `streams list`.
pub async fn list(
    source: &Source<'_>,
    options: &ListOptions,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<()> {
    let log = Log::open(source).await?;
    tell(err, log.notes());
    let streams: Vec<StreamMeta> = log
        .streams()
        .await?
        .into_iter()
        .filter(|m| !options.live || m.status.is_live())
        .filter(|m| {
            options
                .session
                .as_deref()
                .is_none_or(|s| m.session.to_string().starts_with(&s.to_ascii_lowercase()))
        })
        .collect();
    let now = now_ms();
    if options.json {
        for meta in &streams {
            serde_json::to_writer(&mut *out, &Line::of(meta))?;
            writeln!(out)?;
        }
    } else {
        write_table(out, &streams, now)?;
    }
    Ok(())
}

/// `streams show ID`.
pub async fn show(
    source: &Source<'_>,
    options: &ShowOptions,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<()> {
    let log = Log::open(source).await?;
    tell(err, log.notes());
    let streams = log.streams().await?;
    let meta = find(&streams, &options.id)?;
    let entries = log.last_entries(meta, options.entries).await?;
    if options.json {
        let shown = Shown {
            stream: Detail::of(meta),
            last_entries: entries
                .iter()
                .map(|e| ShownEntry {
                    seq: e.seq,
                    message: message_value(&e.message),
                })
                .collect(),
        };
        serde_json::to_writer(&mut *out, &shown)?;
        writeln!(out)?;
    } else {
        write_detail(out, meta, &entries, now_ms())?;
    }
    Ok(())
}

fn tell(err: &mut dyn Write, notes: &[String]) {
    for note in notes {
        // Best effort: a closed stderr must not hide the answer on stdout.
        let _ = writeln!(err, "note: {note}");
    }
}

/// The stream `id` names: a whole id, or a prefix of exactly one.
fn find<'a>(streams: &'a [StreamMeta], id: &str) -> anyhow::Result<&'a StreamMeta> {
    let wanted = id.trim().to_ascii_lowercase();
    if let Ok(exact) = wanted.parse::<StreamId>() {
        return streams
            .iter()
            .find(|m| m.id == exact)
            .ok_or_else(|| anyhow!("no stream {wanted} in this log"));
    }
    if wanted.is_empty() || !wanted.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("{id:?} is not a stream id (32 hex digits, or a prefix of one)");
    }
    let mut matching = streams
        .iter()
        .filter(|m| m.id.to_string().starts_with(&wanted));
    match (matching.next(), matching.next()) {
        (Some(one), None) => Ok(one),
        (None, _) => Err(anyhow!("no stream {wanted}… in this log")),
        (Some(_), Some(_)) => Err(anyhow!(
            "{wanted}… names more than one stream; give more digits"
        )),
    }
}

/// One stream as a JSON line of `streams list --json`.
#[derive(Serialize)]
struct Line<'a> {
    stream: String,
    session: String,
    kind: StreamKind,
    status: StreamStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<Outcome>,
    /// The task the stream is a leg of (its session is then no session).
    #[serde(skip_serializing_if = "Option::is_none")]
    task: Option<String>,
    method: Option<&'a str>,
    origin_ids: Vec<Value>,
    entries: u64,
    bytes: u64,
    created: String,
    created_ms: u64,
    finished: Option<String>,
    finished_ms: Option<u64>,
    acked: u64,
    abandon_at: Option<String>,
    abandon_at_ms: Option<u64>,
    upstream: Option<&'a UpstreamMark>,
}

impl<'a> Line<'a> {
    fn of(meta: &'a StreamMeta) -> Self {
        Self {
            stream: meta.id.to_string(),
            session: meta.session.to_string(),
            kind: meta.kind,
            status: meta.status,
            outcome: meta.outcome,
            task: meta.task.map(|t| t.to_string()),
            method: meta.method.as_deref(),
            // Ids are kept as their raw JSON text: shown as the JSON they are.
            origin_ids: meta
                .origin_ids
                .iter()
                .map(|id| message_value(id.as_json().as_bytes()))
                .collect(),
            entries: meta.entries,
            bytes: meta.bytes,
            created: rfc3339(meta.created_ms),
            created_ms: meta.created_ms,
            finished: meta.finished_ms.map(rfc3339),
            finished_ms: meta.finished_ms,
            acked: meta.acked,
            abandon_at: meta.abandon_at_ms.map(rfc3339),
            abandon_at_ms: meta.abandon_at_ms,
            upstream: meta.upstream.as_ref(),
        }
    }
}

/// A stream's whole metadata, for `streams show --json`.
#[derive(Serialize)]
struct Detail<'a> {
    #[serde(flatten)]
    line: Line<'a>,
    touched: String,
    touched_ms: u64,
    abandon_after_ms: Option<u64>,
    last_request: u64,
    coalesced: bool,
    progress: &'a [Arc<str>],
    params_digest: Option<&'a str>,
}

impl<'a> Detail<'a> {
    fn of(meta: &'a StreamMeta) -> Self {
        Self {
            line: Line::of(meta),
            touched: rfc3339(meta.touched_ms),
            touched_ms: meta.touched_ms,
            abandon_after_ms: meta.abandon_after_ms,
            last_request: meta.last_request,
            coalesced: meta.coalesced,
            progress: &meta.progress,
            params_digest: meta.params_digest.as_deref(),
        }
    }
}

#[derive(Serialize)]
struct Shown<'a> {
    stream: Detail<'a>,
    last_entries: Vec<ShownEntry>,
}

#[derive(Serialize)]
struct ShownEntry {
    seq: u64,
    message: Value,
}

/// A logged message as JSON, or as a string when it is not JSON (the log
/// keeps opaque bytes).
fn message_value(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

fn write_table(out: &mut dyn Write, streams: &[StreamMeta], now: u64) -> std::io::Result<()> {
    const HEADS: [&str; 13] = [
        "STREAM", "SESSION", "KIND", "STATUS", "METHOD", "IDS", "ENTRIES", "BYTES", "CREATED",
        "FINISHED", "ACKED", "ABANDON", "UPSTREAM",
    ];
    let rows: Vec<[String; 13]> = streams
        .iter()
        .map(|m| {
            [
                m.id.to_string(),
                session_cell(m),
                kind(m.kind).into(),
                status(m.status).into(),
                m.method.as_deref().unwrap_or("-").to_owned(),
                ids(m),
                m.entries.to_string(),
                m.bytes.to_string(),
                relative(m.created_ms, now),
                m.finished_ms.map_or("-".into(), |t| relative(t, now)),
                m.acked.to_string(),
                m.abandon_at_ms.map_or("-".into(), |t| relative(t, now)),
                upstream(m.upstream.as_ref()),
            ]
        })
        .collect();
    let mut widths = HEADS.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    write_row(out, &HEADS.map(String::from), &widths)?;
    for row in &rows {
        write_row(out, row, &widths)?;
    }
    Ok(())
}

/// The table stays readable with a short session; `--session` takes a
/// prefix, and `--json` has the whole id. A task leg has no session (its
/// session is the all-zero one every leg shares): its task is shown instead.
fn session_cell(m: &StreamMeta) -> String {
    match m.task {
        Some(task) => format!("task:{}", &task.to_string()[..8]),
        None => m.session.to_string().chars().take(8).collect(),
    }
}

fn write_row(
    out: &mut dyn Write,
    cells: &[String; 13],
    widths: &[usize; 13],
) -> std::io::Result<()> {
    let mut line = String::new();
    for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
        if i + 1 == cells.len() {
            line.push_str(cell);
        } else {
            line.push_str(&format!("{cell:<w$}  "));
        }
    }
    writeln!(out, "{}", line.trim_end())
}

fn write_detail(
    out: &mut dyn Write,
    m: &StreamMeta,
    entries: &[Entry],
    now: u64,
) -> std::io::Result<()> {
    let when = |t: u64| format!("{} ({})", rfc3339(t), relative(t, now));
    let status = match m.outcome {
        Some(Outcome::Result) => format!("{} (result)", status(m.status)),
        Some(Outcome::Error) => format!("{} (error)", status(m.status)),
        None => status(m.status).to_owned(),
    };
    let fields: [(&str, String); 17] = [
        ("stream", m.id.to_string()),
        ("session", m.session.to_string()),
        ("task", m.task.map_or("-".into(), |t| t.to_string())),
        ("kind", kind(m.kind).into()),
        ("status", status),
        ("method", m.method.as_deref().unwrap_or("-").to_owned()),
        ("origin ids", ids(m)),
        ("entries", m.entries.to_string()),
        ("bytes", m.bytes.to_string()),
        ("created", when(m.created_ms)),
        ("finished", m.finished_ms.map_or("-".into(), when)),
        ("touched", when(m.touched_ms)),
        ("acked", m.acked.to_string()),
        (
            "abandon at",
            match (m.abandon_at_ms, m.abandon_after_ms) {
                (Some(at), Some(after)) => {
                    format!("{} (after {}s untouched)", when(at), after / 1000)
                }
                (Some(at), None) => when(at),
                _ => "-".into(),
            },
        ),
        ("upstream", upstream(m.upstream.as_ref())),
        (
            "last request",
            match m.last_request {
                0 => "-".into(),
                seq => format!("seq {seq}"),
            },
        ),
        (
            "progress",
            match (m.progress.is_empty(), m.coalesced) {
                (true, false) => "-".into(),
                (_, coalesced) => format!(
                    "{}{}",
                    m.progress.join(","),
                    if coalesced { " (coalesced)" } else { "" }
                ),
            },
        ),
    ];
    for (name, value) in fields {
        writeln!(out, "{name:<13} {value}")?;
    }
    writeln!(out)?;
    writeln!(out, "last {} of {} entries:", entries.len(), m.entries)?;
    let seq_width = entries.last().map_or(1, |e| e.seq.to_string().len());
    for entry in entries {
        writeln!(
            out,
            "{:>seq_width$}  {}",
            entry.seq,
            one_line(&entry.message, MESSAGE_WIDTH)
        )?;
    }
    Ok(())
}

fn kind(k: StreamKind) -> &'static str {
    match k {
        StreamKind::Request => "request",
        StreamKind::Standalone => "standalone",
    }
}

fn status(s: StreamStatus) -> &'static str {
    match s {
        StreamStatus::Live => "live",
        StreamStatus::Completed => "completed",
        StreamStatus::Failed => "failed",
        StreamStatus::Cancelled => "cancelled",
    }
}

fn ids(m: &StreamMeta) -> String {
    if m.origin_ids.is_empty() {
        return "-".into();
    }
    let ids: Vec<&str> = m.origin_ids.iter().map(|id| id.as_json()).collect();
    ids.join(",")
}

fn upstream(mark: Option<&UpstreamMark>) -> String {
    mark.map_or("-".into(), |m| format!("{}@{}", m.event_id, m.seq))
}

/// A message on one line of at most `width` characters: control characters
/// (a pretty-printed upstream's newlines) become spaces, the rest is cut
/// with an ellipsis.
fn one_line(message: &[u8], width: usize) -> String {
    let text = String::from_utf8_lossy(message);
    let mut out: String = text
        .chars()
        .take(width)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().count() > width {
        out.pop();
        out.push('…');
    }
    out
}

/// `at` relative to `now`: "12s ago", "in 4m".
pub fn relative(at: u64, now: u64) -> String {
    let (span, future) = if at > now {
        (at - now, true)
    } else {
        (now - at, false)
    };
    let secs = span / 1000;
    let amount = match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m", secs / 60),
        3600..86_400 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    };
    if future {
        format!("in {amount}")
    } else {
        format!("{amount} ago")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_as_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_735_689_599_000), "2024-12-31T23:59:59.000Z");
    }

    #[test]
    fn relative_times_name_the_largest_unit() {
        assert_eq!(relative(1_000, 13_000), "12s ago");
        assert_eq!(relative(250_000, 10_000), "in 4m");
        assert_eq!(relative(0, 2 * 86_400_000), "2d ago");
    }

    #[tokio::test]
    async fn a_task_leg_shows_its_task_in_the_table_the_json_and_the_detail() {
        use crate::store::contract::leg;
        use crate::store::journal::Journal;
        let dir = tempfile::tempdir().unwrap();
        let task = crate::id::TaskId::random();
        let m = leg(task);
        {
            let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
            store.create_stream(&m).await.unwrap();
            store
                .append(m.id, &[bytes::Bytes::from_static(b"{}")])
                .await
                .unwrap();
            // Task records in the journal's metadata are read past.
            let mut record = crate::store::contract::task(task, now_ms(), 60_000);
            record.legs.push(m.id);
            store.put_task(&record).await.unwrap();
        }
        let config = StoreConfig::default();
        let source = Source {
            data_dir: dir.path(),
            backend: None,
            store: &config,
        };
        let run = |json| {
            let (source, options) = (
                &source,
                ListOptions {
                    live: false,
                    session: None,
                    json,
                },
            );
            async move {
                let mut out = Vec::new();
                list(source, &options, &mut out, &mut std::io::sink())
                    .await
                    .unwrap();
                String::from_utf8(out).unwrap()
            }
        };
        let table = run(false).await;
        assert!(
            table.contains(&format!("task:{}", &task.to_string()[..8])),
            "{table}"
        );
        let line: Value = serde_json::from_str(run(true).await.trim()).unwrap();
        assert_eq!(line["task"], Value::String(task.to_string()));
        let options = ShowOptions {
            id: m.id.to_string(),
            entries: 1,
            json: false,
        };
        let mut out = Vec::new();
        show(&source, &options, &mut out, &mut std::io::sink())
            .await
            .unwrap();
        let detail = String::from_utf8(out).unwrap();
        assert!(
            detail.contains(&format!("task          {task}")),
            "{detail}"
        );
    }

    #[test]
    fn long_messages_are_cut_to_one_line() {
        assert_eq!(one_line(b"{\"a\":\n1}", 80), "{\"a\": 1}");
        assert_eq!(one_line(b"abcdef", 4), "abc…");
    }
}
