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

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{Answered, Facts, Rpc};
use crate::id::hex_into;
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
    // only what the log writer does.
    let (mut session_hex, mut principal_hex, mut stream_hex) = ([0; 8], [0; 16], [0; 32]);
    let session = facts.session.as_ref();
    let short_session = session.map(|s| hex_into(&s.id.as_bytes()[..4], &mut session_hex));
    let principal = session.map(|s| pseudonym_into(s.principal(), &mut principal_hex));
    let stream = facts
        .stream
        .map(|s| hex_into(s.as_bytes(), &mut stream_hex));
    let rpc_code = match facts.rpc {
        Some(Rpc::Error(code)) => code,
        _ => None,
    };
    tracing::info!(
        target: "access",
        http_method = http_method.as_str(),
        path,
        status = answer.status.as_u16(),
        mcp_method = facts.method.as_str(),
        tool = facts.tool.as_deref(),
        request_id = facts.request_id.as_deref(),
        session = short_session,
        principal,
        stream,
        resumed = facts.resumed.map(|d| d.as_str()),
        outcome = outcome.as_str(),
        rpc_code,
        duration_ms = ms(total),
        first_byte_ms = answer.first_byte.map(ms),
        bytes_in = facts.bytes_in,
        bytes_out = answer.bytes_out,
        "request"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

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
