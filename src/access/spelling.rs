//! How an access line is spelled: byte for byte what `tracing-subscriber`'s
//! `fmt` layer writes for the same event (its default text format without
//! colours, or its JSON), but written straight from the line's fields into
//! a buffer — no field visitor, no `Debug` through trait objects, no
//! intermediate `String` — which made the line cost a busy proxy a fifth of
//! what the subscriber did.
//!
//! The fields and their order are the line's ([`Spelled`]), the same as
//! its event's; a test in `line.rs` holds the two spellings equal. It must
//! not decide what a line holds: that is [`super::line`]'s.

use std::io::Write as _;

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;

use crate::config::LogFormat;

/// A line that can say its fields, in order.
pub(super) trait Spelled {
    fn spell_fields(&self, f: &mut impl Fields);
}

/// Appends `line`, ended by a newline, to `out` in `format`.
pub(super) fn spell(line: &impl Spelled, format: LogFormat, out: &mut Vec<u8>) {
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
