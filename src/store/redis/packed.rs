//! A stream's one Redis value, `{P:<stream>}:stream`: its metadata and, while
//! the stream is short, its entries, as one MessagePack map (`msgpack.rs`)
//! with one-letter keys. A script unpacks it with `cmsgpack`, changes what
//! it must and packs it back, all in one atomic step; a short call is then
//! one Redis key of a few hundred bytes besides its messages, where a hash
//! of a dozen fields and a Redis Stream of its own took some 6 KB.
//!
//! Keys written when the stream is created and kept as they are:
//! `S` session (16 bytes), `K` kind (1: standalone; absent: a request),
//! `O` origin request ids (array of their JSON texts), `M` method, `P`
//! progress tokens (array), `C` created_ms, `D` params digest ([`digest`]),
//! `T` task (16 bytes), `A` abandon_after_ms; `J` the record JSON of a
//! stream the previous layout wrote (taken as its base instead of these).
//! Keys the scripts keep: `s` status (1 completed, 2 failed, 3 cancelled;
//! absent: live), `f` finished_ms, `o` outcome (0 result, 1 error), `a`
//! acked, `h` touched_ms (absent: `C`), `z` abandon_at_ms, `q` last_request, `c`
//! coalesced (1), `u`/`v` the upstream mark's event id and seq, `w` owner,
//! `n` entries, `b` bytes, `e` the entries while inline (array), `l` 1 once
//! they moved to the stream's `:log`, `r` the sequence of its entry in the
//! retention index (`retention.rs`), `k` on a cluster the name of the
//! last append applied (`scripts.rs`). An absent number is 0 unless said,
//! an absent option `None`.

use std::sync::Arc;

use bytes::Bytes;

use super::msgpack::{read_map, Value, Writer};
use crate::id::{SessionId, StreamId, TaskId};
use crate::jsonrpc::RequestId;
use crate::store::{
    Outcome, Result, StoreError, StreamKind, StreamMeta, StreamStatus, UpstreamMark,
};

/// A stream keeps its entries in its value while it has at most this many
/// (and [`INLINE_BYTES`] of messages): past that, each append would rewrite
/// a value that keeps growing, so they move to a Redis Stream of its own.
pub(super) const INLINE_ENTRIES: u64 = 8;
pub(super) const INLINE_BYTES: u64 = 4096;

/// Where a decoded stream's entries are.
#[derive(Debug, PartialEq)]
pub(super) enum Entries<'a> {
    /// In the value: entry `i` (from 0) has seq `i + 1`.
    Inline(Vec<&'a [u8]>),
    /// In the stream's `:log` (a Redis Stream, entry ids `0-<seq>`).
    Log,
}

/// Whether `opening` entries stay in the value of the stream they open.
pub(super) fn fits_inline(opening: &[Bytes]) -> bool {
    let bytes: u64 = opening.iter().map(|m| m.len() as u64).sum();
    opening.len() as u64 <= INLINE_ENTRIES && bytes <= INLINE_BYTES
}

/// The params digest as the value keeps it and the create script compares
/// it: a SHA-256 in lowercase hex as its 32 bytes after `x`, anything else
/// as it is after `t`.
pub(super) fn digest(text: &str) -> Vec<u8> {
    let mut raw = [0u8; 32];
    let hex = text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if hex {
        for (i, pair) in text.as_bytes().chunks_exact(2).enumerate() {
            raw[i] = (nibble(pair[0]) << 4) | nibble(pair[1]);
        }
        [&b"x"[..], &raw].concat()
    } else {
        [b"t", text.as_bytes()].concat()
    }
}

fn nibble(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        _ => b - b'a' + 10,
    }
}

fn digest_text(stored: &[u8]) -> Option<String> {
    match stored.split_first() {
        Some((b'x', raw)) if raw.len() == 32 => Some(crate::id::hex(raw)),
        Some((b't', text)) => String::from_utf8(text.to_vec()).ok(),
        _ => None,
    }
}

/// The value of a new stream: `meta`, owned by `owner` (a live stream's
/// creator), with `opening` as its first entries — in the value when
/// [`fits_inline`], else counted here and written to its log by the script.
pub(super) fn encode(meta: &StreamMeta, owner: Option<&str>, opening: &[Bytes]) -> Vec<u8> {
    let mut fields: Vec<(&str, Field<'_>)> = numbers(meta)
        .into_iter()
        .map(|(key, n)| (key, Field::Uint(n)))
        .collect();
    let digest = meta.params_digest.as_deref().map(digest);
    let texts = [
        ("S", Some(&meta.session.as_bytes()[..])),
        ("M", meta.method.as_deref().map(str::as_bytes)),
        ("D", digest.as_deref()),
        ("T", meta.task.as_ref().map(|t| &t.as_bytes()[..])),
        ("u", meta.upstream.as_ref().map(|m| m.event_id.as_bytes())),
        ("w", owner.map(str::as_bytes)),
    ];
    fields.extend(
        texts
            .into_iter()
            .filter_map(|(k, v)| Some((k, Field::Str(v?)))),
    );
    let ids: Vec<&[u8]> = meta
        .origin_ids
        .iter()
        .map(|i| i.as_json().as_bytes())
        .collect();
    let progress: Vec<&[u8]> = meta.progress.iter().map(|p| p.as_bytes()).collect();
    let inline: Vec<&[u8]> = opening.iter().map(|m| m.as_ref()).collect();
    for (key, list) in [("O", &ids), ("P", &progress)] {
        if !list.is_empty() {
            fields.push((key, Field::List(list)));
        }
    }
    if !opening.is_empty() {
        let bytes = opening.iter().map(|m| m.len() as u64).sum();
        fields.push(("n", Field::Uint(opening.len() as u64)));
        fields.push(("b", Field::Uint(bytes)));
        fields.push(if fits_inline(opening) {
            ("e", Field::List(&inline))
        } else {
            ("l", Field::Uint(1))
        });
    }
    write(&fields)
}

/// The numbers of `meta` its value keeps, each left out at its default.
fn numbers(meta: &StreamMeta) -> Vec<(&'static str, u64)> {
    // Touched at its creation, as most are: absent, `C` says when.
    let touched = meta.touched_ms != meta.created_ms;
    let all = [
        ("C", Some(meta.created_ms)),
        ("h", touched.then_some(meta.touched_ms)),
        ("K", (meta.kind == StreamKind::Standalone).then_some(1)),
        ("s", status_code(meta.status)),
        ("f", meta.finished_ms),
        ("o", meta.outcome.map(outcome_code)),
        ("a", (meta.acked > 0).then_some(meta.acked)),
        ("A", meta.abandon_after_ms),
        ("z", meta.abandon_at_ms),
        ("q", (meta.last_request > 0).then_some(meta.last_request)),
        ("c", meta.coalesced.then_some(1)),
        ("v", meta.upstream.as_ref().map(|m| m.seq)),
    ];
    all.into_iter().filter_map(|(k, v)| Some((k, v?))).collect()
}

/// A value of the map being written.
enum Field<'a> {
    Uint(u64),
    Str(&'a [u8]),
    List(&'a [&'a [u8]]),
}

fn write(fields: &[(&str, Field<'_>)]) -> Vec<u8> {
    let mut w = Writer::default();
    w.map(fields.len());
    for (key, field) in fields {
        w.str(key.as_bytes());
        match field {
            Field::Uint(n) => w.uint(*n),
            Field::Str(s) => w.str(s),
            Field::List(items) => {
                w.array(items.len());
                for item in *items {
                    w.str(item);
                }
            }
        }
    }
    w.buf
}

fn status_code(status: StreamStatus) -> Option<u64> {
    match status {
        StreamStatus::Live => None,
        StreamStatus::Completed => Some(1),
        StreamStatus::Failed => Some(2),
        StreamStatus::Cancelled => Some(3),
    }
}

/// The code the scripts are given for a status (`0`: live).
pub(super) fn status_arg(status: StreamStatus) -> u64 {
    status_code(status).unwrap_or(0)
}

pub(super) fn outcome_code(outcome: Outcome) -> u64 {
    match outcome {
        Outcome::Result => 0,
        Outcome::Error => 1,
    }
}

/// Stream `id`'s metadata and where its entries are, from its value.
pub(super) fn decode(id: StreamId, bytes: &[u8]) -> Result<(StreamMeta, Entries<'_>)> {
    read(id, bytes).map_err(|why| StoreError::Corrupt(format!("stream {id}: {why}")))
}

type Pairs<'a> = [(&'a [u8], Value<'a>)];

fn get<'p, 'a>(pairs: &'p Pairs<'a>, key: &str) -> Option<&'p Value<'a>> {
    pairs
        .iter()
        .find(|(k, _)| *k == key.as_bytes())
        .map(|(_, v)| v)
}

fn num(pairs: &Pairs<'_>, key: &str) -> std::result::Result<Option<u64>, String> {
    get(pairs, key)
        .map(|v| v.as_u64().ok_or_else(|| format!("{key} = {v:?}")))
        .transpose()
}

fn utf8(v: &Value<'_>) -> Option<String> {
    v.as_bytes()
        .and_then(|b| String::from_utf8(b.to_vec()).ok())
}

fn text(pairs: &Pairs<'_>, key: &str) -> std::result::Result<Option<String>, String> {
    get(pairs, key)
        .map(|v| utf8(v).ok_or_else(|| format!("{key} = {v:?}")))
        .transpose()
}

fn list(pairs: &Pairs<'_>, key: &str) -> std::result::Result<Vec<String>, String> {
    match get(pairs, key) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| utf8(v).ok_or_else(|| format!("{key} holds {v:?}")))
            .collect(),
        Some(v) => Err(format!("{key} = {v:?}")),
    }
}

fn raw16(pairs: &Pairs<'_>, key: &str) -> std::result::Result<Option<[u8; 16]>, String> {
    get(pairs, key)
        .map(|v| {
            v.as_bytes()
                .and_then(|b| <[u8; 16]>::try_from(b).ok())
                .ok_or_else(|| format!("{key} = {v:?}"))
        })
        .transpose()
}

fn read(id: StreamId, bytes: &[u8]) -> std::result::Result<(StreamMeta, Entries<'_>), String> {
    let pairs = read_map(bytes)?;
    let mut meta = match get(&pairs, "J").and_then(Value::as_bytes) {
        Some(record) => super::record::decode("stream", record).map_err(|e| e.to_string())?,
        None => base(id, &pairs)?,
    };
    overlay(&mut meta, &pairs)?;
    let entries = match (num(&pairs, "l")?, get(&pairs, "e")) {
        (Some(1), _) => Entries::Log,
        (_, None) => Entries::Inline(Vec::new()),
        (_, Some(Value::Array(items))) => Entries::Inline(
            items
                .iter()
                .map(|v| v.as_bytes().ok_or_else(|| format!("an entry {v:?}")))
                .collect::<std::result::Result<_, _>>()?,
        ),
        (_, Some(v)) => return Err(format!("entries {v:?}")),
    };
    Ok((meta, entries))
}

/// What the value says of a stream it was made for (no `J`).
fn base(id: StreamId, pairs: &Pairs<'_>) -> std::result::Result<StreamMeta, String> {
    let session = raw16(pairs, "S")?.ok_or("no session")?;
    let kind = match num(pairs, "K")? {
        Some(1) => StreamKind::Standalone,
        _ => StreamKind::Request,
    };
    let origin_ids = list(pairs, "O")?
        .into_iter()
        .map(|id| RequestId(id.into()))
        .collect();
    let created = num(pairs, "C")?.unwrap_or(0);
    let method = text(pairs, "M")?;
    let method = method.map(Arc::from);
    let mut meta = StreamMeta::new(id, SessionId(session), kind, origin_ids, method, created);
    meta.progress = list(pairs, "P")?.into_iter().map(Arc::from).collect();
    meta.params_digest = match get(pairs, "D") {
        None => None,
        Some(v) => Some(
            v.as_bytes()
                .and_then(digest_text)
                .map(Arc::from)
                .ok_or(format!("D = {v:?}"))?,
        ),
    };
    meta.task = match get(pairs, "T").and_then(Value::as_bytes) {
        // A migrated hash names its task in hex.
        Some(hex) if hex.len() == 32 => {
            let hex = std::str::from_utf8(hex).map_err(|e| e.to_string())?;
            Some(hex.parse().map_err(|()| format!("T = {hex:?}"))?)
        }
        _ => raw16(pairs, "T")?.map(TaskId),
    };
    Ok(meta)
}

/// The fields the scripts keep, over the record.
fn overlay(meta: &mut StreamMeta, pairs: &Pairs<'_>) -> std::result::Result<(), String> {
    meta.abandon_after_ms = num(pairs, "A")?;
    meta.status = match num(pairs, "s")? {
        None | Some(0) => StreamStatus::Live,
        Some(1) => StreamStatus::Completed,
        Some(2) => StreamStatus::Failed,
        Some(3) => StreamStatus::Cancelled,
        Some(n) => return Err(format!("status {n}")),
    };
    meta.finished_ms = num(pairs, "f")?;
    meta.outcome = match num(pairs, "o")? {
        None => None,
        Some(0) => Some(Outcome::Result),
        Some(1) => Some(Outcome::Error),
        Some(n) => return Err(format!("outcome {n}")),
    };
    meta.acked = num(pairs, "a")?.unwrap_or(0);
    // Not written while it is the creation time (see `encode`).
    meta.touched_ms = num(pairs, "h")?.unwrap_or(meta.created_ms);
    meta.abandon_at_ms = num(pairs, "z")?;
    meta.last_request = num(pairs, "q")?.unwrap_or(0);
    meta.coalesced = num(pairs, "c")?.unwrap_or(0) != 0;
    meta.upstream = match (text(pairs, "u")?, num(pairs, "v")?) {
        (Some(event_id), Some(seq)) => Some(UpstreamMark { event_id, seq }),
        _ => None,
    };
    meta.entries = num(pairs, "n")?.unwrap_or(0);
    meta.bytes = num(pairs, "b")?.unwrap_or(0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> StreamMeta {
        let mut meta = StreamMeta::new(
            StreamId::random(),
            SessionId::random(),
            StreamKind::Request,
            vec![RequestId("7".into()), RequestId("\"x\"".into())],
            Some("tools/call".into()),
            1_700_000_000_000,
        );
        meta.progress = vec!["\"p\"".into()];
        meta.params_digest = Some("ab".repeat(32).into());
        meta.acked = 2;
        meta.touched_ms = 1_700_000_000_005;
        meta.abandon_after_ms = Some(60_000);
        meta.abandon_at_ms = Some(1_700_000_060_005);
        meta.last_request = 1;
        meta.coalesced = true;
        meta.upstream = Some(UpstreamMark {
            event_id: "ev 1".into(),
            seq: 2,
        });
        meta.task = Some(TaskId::random());
        meta.status = StreamStatus::Cancelled;
        meta.finished_ms = Some(1_700_000_000_009);
        meta.outcome = Some(Outcome::Error);
        meta
    }

    #[test]
    fn every_field_reads_back_with_the_entries_inline_or_in_the_log() {
        let opening = [Bytes::from_static(b"one"), Bytes::from_static(b"two")];
        let mut meta = full();
        let value = encode(&meta, Some("me"), &opening);
        let (read, entries) = decode(meta.id, &value).unwrap();
        (meta.entries, meta.bytes) = (2, 6);
        assert_eq!(read, meta);
        assert_eq!(entries, Entries::Inline(vec![&b"one"[..], b"two"]));
        let many = vec![Bytes::from_static(b"m"); INLINE_ENTRIES as usize + 1];
        let value = encode(&meta, None, &many);
        assert_eq!(decode(meta.id, &value).unwrap().1, Entries::Log);
    }

    #[test]
    fn a_new_call_is_a_few_dozen_bytes_besides_its_messages() {
        let mut meta = StreamMeta::new(
            StreamId::random(),
            SessionId::random(),
            StreamKind::Request,
            vec![RequestId("12345".into())],
            Some("tools/call".into()),
            1_700_000_000_000,
        );
        meta.params_digest = Some("0f".repeat(32).into());
        let value = encode(&meta, Some("4242-0123456789abcdef"), &[]);
        assert!(value.len() <= 120, "{}", value.len());
        assert_eq!(decode(meta.id, &value).unwrap().0, meta);
    }

    #[test]
    fn a_digest_that_is_not_sha256_hex_is_kept_as_it_is() {
        for text in ["d1", &"AB".repeat(32), &"ab".repeat(31), ""] {
            let stored = digest(text);
            assert_eq!(stored[0], b't');
            assert_eq!(digest_text(&stored).as_deref(), Some(text));
        }
        let hex = "0123456789abcdef".repeat(4);
        assert_eq!(digest(&hex).len(), 33);
        assert_eq!(digest_text(&digest(&hex)), Some(hex));
    }

    #[test]
    fn a_damaged_value_is_corrupt_not_a_wrong_stream() {
        let meta = full();
        let value = encode(&meta, None, &[]);
        for cut in [1, value.len() / 2, value.len() - 1] {
            assert!(matches!(
                decode(meta.id, &value[..cut]),
                Err(StoreError::Corrupt(_))
            ));
        }
    }
}
