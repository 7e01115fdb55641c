//! How an access line is spelled: byte for byte what `tracing-subscriber`'s
//! `fmt` layer writes for the same event (its default text format without
//! colours, or its JSON), but written straight from the line's fields into
//! a buffer — no field visitor, no `Debug` through trait objects, no
//! intermediate `String` — which made the line cost a busy proxy a fifth of
//! what the subscriber did.
//!
//! The field order is [`Line::spell_fields`]'s, the same as the event's in
//! [`Line::emit`]; a test holds the two spellings equal. It must not decide
//! what a line holds: that is [`super::line`]'s.

use std::io::Write as _;

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;

use super::line::Line;
use crate::config::LogFormat;

/// Appends `line`, ended by a newline, to `out` in `format`.
pub(super) fn spell(line: &Line<'_>, format: LogFormat, out: &mut Vec<u8>) {
    match format {
        LogFormat::Text => {
            timestamp(out);
            out.extend_from_slice(b"  INFO access: request");
            line.spell_fields(&mut Text(out));
            out.push(b'\n');
        }
        LogFormat::Json => {
            out.extend_from_slice(b"{\"timestamp\":\"");
            timestamp(out);
            out.extend_from_slice(b"\",\"level\":\"INFO\",\"fields\":{\"message\":\"request\"");
            line.spell_fields(&mut Json(out));
            out.extend_from_slice(b"},\"target\":\"access\"}\n");
        }
    }
}

/// The time now, as the subscriber's default timer writes it
/// (`2026-11-27T10:53:49.123456Z`): its own code, so the two cannot differ.
fn timestamp(out: &mut Vec<u8>) {
    let mut text = Utf8(out);
    let _ = tracing_subscriber::fmt::time::SystemTime.format_time(&mut Writer::new(&mut text));
}

/// One field after another, each skipped by the caller when absent.
pub(super) trait Fields {
    fn str(&mut self, name: &str, value: &str);
    fn u64(&mut self, name: &str, value: u64);
    fn i64(&mut self, name: &str, value: i64);
    fn f64(&mut self, name: &str, value: f64);
}

/// ` name=value`, a string in Rust's `Debug` quoting, as the default
/// field formatter writes it.
struct Text<'a>(&'a mut Vec<u8>);

impl Fields for Text<'_> {
    fn str(&mut self, name: &str, value: &str) {
        let _ = write!(self.0, " {name}={value:?}");
    }

    fn u64(&mut self, name: &str, value: u64) {
        let _ = write!(self.0, " {name}={value}");
    }

    fn i64(&mut self, name: &str, value: i64) {
        let _ = write!(self.0, " {name}={value}");
    }

    fn f64(&mut self, name: &str, value: f64) {
        let _ = write!(self.0, " {name}={value:?}");
    }
}

/// `,"name":value`, each value as `serde_json` writes it, as the JSON
/// formatter (through `tracing-serde`) does.
struct Json<'a>(&'a mut Vec<u8>);

impl Json<'_> {
    fn key(&mut self, name: &str) {
        self.0.extend_from_slice(b",\"");
        // Field names are this crate's identifiers: nothing to escape.
        self.0.extend_from_slice(name.as_bytes());
        self.0.extend_from_slice(b"\":");
    }

    fn value(&mut self, value: &impl serde::Serialize) {
        // Writing to a `Vec` fails only for a value serde_json cannot
        // write, which no field is.
        let _ = serde_json::to_writer(&mut *self.0, value);
    }
}

impl Fields for Json<'_> {
    fn str(&mut self, name: &str, value: &str) {
        self.key(name);
        self.value(&value);
    }

    fn u64(&mut self, name: &str, value: u64) {
        self.key(name);
        self.value(&value);
    }

    fn i64(&mut self, name: &str, value: i64) {
        self.key(name);
        self.value(&value);
    }

    fn f64(&mut self, name: &str, value: f64) {
        self.key(name);
        self.value(&value);
    }
}

/// A `fmt::Write` onto bytes (what is written through it is UTF-8).
struct Utf8<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Utf8<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

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
        spell(line, format, &mut out);
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
}
