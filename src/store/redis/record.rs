//! A stream's metadata as the previous layout kept it, still read until a
//! script moves the stream into one value (`packed.rs`): a hash of the
//! record as created (`record`, JSON) plus one field per value that changes
//! afterwards. Also the encodings every key of the backend shares.

use std::collections::HashMap;

use crate::store::{Outcome, Result, StoreError, StreamMeta, StreamStatus, UpstreamMark};

pub(super) fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("redis: {e}"))
}

pub(super) fn decode<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

pub(super) fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(backend)
}

/// A stream's metadata from its hash of the previous layout (`None`: no
/// such stream).
pub(super) fn meta_from_hash(hash: HashMap<String, Vec<u8>>) -> Result<Option<StreamMeta>> {
    let Some(record) = hash.get("record") else {
        return Ok(None);
    };
    let mut meta: StreamMeta = decode("stream", record)?;
    let text = |k: &str| -> Result<Option<&str>> {
        hash.get(k)
            .map(|v| std::str::from_utf8(v).map_err(|e| StoreError::Corrupt(format!("{k}: {e}"))))
            .transpose()
    };
    let num = |k: &str| -> Result<Option<u64>> {
        text(k)?
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|e| StoreError::Corrupt(format!("{k} = {v:?}: {e}")))
            })
            .transpose()
    };
    let json = |v: &str| format!("\"{v}\"");
    if let Some(status) = text("status")? {
        meta.status = decode::<StreamStatus>("status", json(status).as_bytes())?;
    }
    meta.finished_ms = num("finished_ms")?;
    meta.outcome = match text("outcome")? {
        Some(o) => Some(decode::<Outcome>("outcome", json(o).as_bytes())?),
        None => None,
    };
    meta.acked = num("acked")?.unwrap_or(0);
    meta.touched_ms = num("touched_ms")?.unwrap_or(0);
    meta.abandon_after_ms = num("abandon_after_ms")?;
    meta.abandon_at_ms = num("abandon_at_ms")?;
    meta.last_request = num("last_request")?.unwrap_or(0);
    meta.coalesced = num("coalesced")?.unwrap_or(0) != 0;
    meta.upstream = match (text("up_event")?, num("up_seq")?) {
        (Some(event_id), Some(seq)) => Some(UpstreamMark {
            event_id: event_id.to_owned(),
            seq,
        }),
        _ => None,
    };
    meta.entries = num("entries")?.unwrap_or(0);
    meta.bytes = num("bytes")?.unwrap_or(0);
    Ok(Some(meta))
}
