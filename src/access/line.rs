//! The access-log line: one `info` event per request, target `access`,
//! written when its answer ends; JSON with `log_format = "json"`.
//!
//! Fields, and nothing else (no message content, no credential, no query
//! string, which may carry one): `http_method`, `path`, `status`,
//! `mcp_method`, `tool`, `request_id` (at most [`SHORT_ID`] characters),
//! `session` (its first 8 hex digits), `principal` (the first 16 hex digits
//! of the SHA-256 of the principal the proxy keeps, itself a digest of the
//! credential or identity: `printf %s "$PRINCIPAL" | sha256sum | cut -c1-16`),
//! `stream`, `resumed` (the dialect a client came back with), `outcome`,
//! `rpc_code` (of an error the proxy wrote), `duration_ms`,
//! `first_byte_ms`, `bytes_in`, `bytes_out`.
//!
//! Where the process's log goes through [`crate::logging`]'s buffer, the
//! line is spelled here ([`super::spelling`]) and appended to it directly:
//! the same bytes the subscriber would write, for a fifth of the work. Else
//! (a terminal, which gets colours; a process that set its own subscriber)
//! it is an event like any other.

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::spelling::{self, Fields, Spelled};
use super::{Answered, Facts, Rpc};
use crate::id::hex_into;
use crate::logging;
use crate::metrics::requests::Outcome;

/// The longest request id written whole.
pub const SHORT_ID: usize = 64;

/// A request id as the line writes it: cut at [`SHORT_ID`] characters.
pub fn short(id: &str) -> Box<str> {
    match id.char_indices().nth(SHORT_ID) {
        Some((end, _)) => Box::from(&id[..end]),
        None => Box::from(id),
    }
}

/// A principal as the line writes it, in `out`.
pub fn pseudonym_into<'a>(principal: &str, out: &'a mut [u8; 16]) -> &'a str {
    let digest = Sha256::digest(principal.as_bytes());
    hex_into(&digest[..8], out)
}

fn ms(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

/// One access line's fields, in the order they are written.
#[derive(Clone, Debug)]
pub(super) struct Line<'a> {
    pub http_method: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub mcp_method: &'a str,
    pub tool: Option<&'a str>,
    pub request_id: Option<&'a str>,
    pub session: Option<&'a str>,
    pub principal: Option<&'a str>,
    pub stream: Option<&'a str>,
    pub resumed: Option<&'a str>,
    pub outcome: &'a str,
    pub rpc_code: Option<i64>,
    pub duration_ms: f64,
    pub first_byte_ms: Option<f64>,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

pub(super) fn write(
    http_method: &http::Method,
    path: &str,
    facts: &Facts,
    answer: &Answered,
    outcome: Outcome,
    total: Duration,
) {
    if !tracing::enabled!(target: "access", tracing::Level::INFO) {
        // Filtered out (`RUST_LOG=…,access=off`): nothing to compute.
        return;
    }
    // Every id is written from a buffer on the stack: a line allocates
    // nothing of its own.
    let (mut session_hex, mut principal_hex, mut stream_hex) = ([0; 8], [0; 16], [0; 32]);
    let session = facts.session.as_ref();
    let line = Line {
        http_method: http_method.as_str(),
        path,
        status: answer.status.as_u16(),
        mcp_method: facts.method.as_str(),
        tool: facts.tool.as_deref(),
        request_id: facts.request_id.as_deref(),
        session: session.map(|s| hex_into(&s.id.as_bytes()[..4], &mut session_hex)),
        principal: session.map(|s| pseudonym_into(s.principal(), &mut principal_hex)),
        stream: facts
            .stream
            .map(|s| hex_into(s.as_bytes(), &mut stream_hex)),
        resumed: facts.resumed.map(|d| d.as_str()),
        outcome: outcome.as_str(),
        rpc_code: match facts.rpc {
            Some(Rpc::Error(code)) => code,
            _ => None,
        },
        duration_ms: ms(total),
        first_byte_ms: answer.first_byte.map(ms),
        bytes_in: facts.bytes_in as u64,
        bytes_out: answer.bytes_out,
    };
    match logging::direct() {
        Some(log) => log.append_with(|buf, format| spelling::spell(&line, format, buf)),
        None => line.emit(),
    }
}

impl Spelled for Line<'_> {
    /// Each field present, in the event's order.
    fn spell_fields(&self, f: &mut impl Fields) {
        f.str("http_method", self.http_method);
        f.str("path", self.path);
        f.u64("status", self.status.into());
        f.str("mcp_method", self.mcp_method);
        let named = [
            ("tool", self.tool),
            ("request_id", self.request_id),
            ("session", self.session),
            ("principal", self.principal),
            ("stream", self.stream),
            ("resumed", self.resumed),
        ];
        for (name, value) in named {
            if let Some(value) = value {
                f.str(name, value);
            }
        }
        f.str("outcome", self.outcome);
        if let Some(code) = self.rpc_code {
            f.i64("rpc_code", code);
        }
        f.f64("duration_ms", self.duration_ms);
        if let Some(ms) = self.first_byte_ms {
            f.f64("first_byte_ms", ms);
        }
        f.u64("bytes_in", self.bytes_in);
        f.u64("bytes_out", self.bytes_out);
    }
}

impl Line<'_> {
    /// The line as an event, for whatever subscriber the process has.
    pub(super) fn emit(&self) {
        tracing::info!(
            target: "access",
            http_method = self.http_method,
            path = self.path,
            status = self.status,
            mcp_method = self.mcp_method,
            tool = self.tool,
            request_id = self.request_id,
            session = self.session,
            principal = self.principal,
            stream = self.stream,
            resumed = self.resumed,
            outcome = self.outcome,
            rpc_code = self.rpc_code,
            duration_ms = self.duration_ms,
            first_byte_ms = self.first_byte_ms,
            bytes_in = self.bytes_in,
            bytes_out = self.bytes_out,
            "request"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;
    use crate::config::LogFormat;

    /// What a subscriber wrote, shared with the test.
    #[derive(Clone, Default)]
    struct Written(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Written {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Written {
        type Writer = Written;

        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    /// `line` as the process's subscriber (`logging::init`'s, without
    /// colours) writes its event.
    fn subscriber_spelling(line: &Line<'_>, format: LogFormat) -> String {
        let written = Written::default();
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(written.clone());
        match format {
            LogFormat::Text => tracing::subscriber::with_default(builder.finish(), || line.emit()),
            LogFormat::Json => {
                tracing::subscriber::with_default(builder.json().finish(), || line.emit())
            }
        }
        let bytes = written.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    fn our_spelling(line: &Line<'_>, format: LogFormat) -> String {
        let mut out = Vec::new();
        spelling::spell(line, format, &mut out);
        String::from_utf8(out).unwrap()
    }

    /// The line with its timestamp (`2026-11-27T10:53:49.123456Z`, the
    /// only part that may differ) replaced by `T`.
    fn untimed(line: &str) -> String {
        let at = line
            .find("Z ")
            .or_else(|| line.find("Z\""))
            .expect("a timestamp");
        let start = at + 1 - "2026-11-27T10:53:49.123456Z".len();
        let stamp = &line[start..=at];
        assert!(
            stamp.as_bytes()[10] == b'T' && stamp.as_bytes()[19] == b'.',
            "{line}"
        );
        format!("{}T{}", &line[..start], &line[at + 1..])
    }

    fn full() -> Line<'static> {
        Line {
            http_method: "POST",
            path: "/mcp/\"quoted\"\\ é 🦀 \u{1b}[31m\n",
            status: 200,
            mcp_method: "tools/call",
            tool: Some("echo\tall"),
            request_id: Some("\"7\""),
            session: Some("0123abcd"),
            principal: Some("2bd806c97f0e00af"),
            stream: Some("00112233445566778899aabbccddeeff"),
            resumed: Some("last_event_id"),
            outcome: "error",
            rpc_code: Some(-32603),
            duration_ms: 12345.678,
            first_byte_ms: Some(0.5),
            bytes_in: 123,
            bytes_out: u64::MAX,
        }
    }

    fn bare() -> Line<'static> {
        Line {
            http_method: "GET",
            path: "/",
            status: 404,
            mcp_method: "none",
            tool: None,
            request_id: None,
            session: None,
            principal: None,
            stream: None,
            resumed: None,
            outcome: "client_error",
            rpc_code: None,
            duration_ms: 3.0,
            first_byte_ms: None,
            bytes_in: 0,
            bytes_out: 0,
        }
    }

    #[test]
    fn a_text_line_is_spelled_as_the_subscriber_spells_it() {
        for line in [full(), bare()] {
            let ours = our_spelling(&line, LogFormat::Text);
            let theirs = subscriber_spelling(&line, LogFormat::Text);
            assert_eq!(untimed(&ours), untimed(&theirs));
        }
    }

    #[test]
    fn a_json_line_is_spelled_as_the_subscriber_spells_it() {
        for line in [full(), bare()] {
            let ours = our_spelling(&line, LogFormat::Json);
            let theirs = subscriber_spelling(&line, LogFormat::Json);
            assert_eq!(untimed(&ours), untimed(&theirs));
            let parsed: serde_json::Value = serde_json::from_str(&ours).unwrap();
            assert_eq!(parsed["fields"]["path"], line.path);
        }
    }

    #[test]
    fn a_non_finite_duration_is_null_in_json_as_in_the_subscriber() {
        let line = Line {
            duration_ms: f64::NAN,
            ..bare()
        };
        let ours = our_spelling(&line, LogFormat::Json);
        assert_eq!(
            untimed(&ours),
            untimed(&subscriber_spelling(&line, LogFormat::Json))
        );
        assert!(ours.contains("\"duration_ms\":null"), "{ours}");
    }

    #[test]
    fn long_request_ids_are_cut_on_a_character_boundary() {
        let id = "é".repeat(100);
        assert_eq!(short(&id).chars().count(), SHORT_ID);
        assert_eq!(&*short("\"a\""), "\"a\"");
    }

    #[test]
    fn a_principal_is_written_as_the_start_of_its_sha256() {
        // printf %s alice | sha256sum
        assert_eq!(pseudonym_into("alice", &mut [0; 16]), "2bd806c97f0e00af");
    }
}
