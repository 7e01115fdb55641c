//! A stream's metadata as the Redis backend keeps it: the record as created
//! (`record`, JSON) plus one hash field per value that changes afterwards,
//! so that a script can move a cursor without reading and rewriting the
//! record. Also the encodings every key of the backend shares.

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

/// A value as a bare string: a unit enum as its serde name (`live`, `error`).
pub(super) fn wire<T: serde::Serialize>(value: &T) -> Result<String> {
    match serde_json::to_value(value).map_err(backend)? {
        serde_json::Value::String(s) => Ok(s),
        other => Ok(other.to_string()),
    }
}

/// The metadata fields that change after creation (overlaid on `record`).
pub(super) fn mutable_fields(meta: &StreamMeta) -> Result<Vec<(&'static str, String)>> {
    let mut fields = vec![
        ("entries", "0".to_owned()),
        ("bytes", "0".to_owned()),
        ("status", wire(&meta.status)?),
        ("acked", meta.acked.to_string()),
        ("touched_ms", meta.touched_ms.to_string()),
        ("last_request", meta.last_request.to_string()),
        ("coalesced", u8::from(meta.coalesced).to_string()),
    ];
    let optional = [
        ("finished_ms", meta.finished_ms.map(|v| v.to_string())),
        (
            "abandon_after_ms",
            meta.abandon_after_ms.map(|v| v.to_string()),
        ),
        ("abandon_at_ms", meta.abandon_at_ms.map(|v| v.to_string())),
        ("outcome", meta.outcome.as_ref().map(wire).transpose()?),
    ];
    fields.extend(optional.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));
    if let Some(mark) = &meta.upstream {
        fields.push(("up_event", mark.event_id.clone()));
        fields.push(("up_seq", mark.seq.to_string()));
    }
    Ok(fields)
}

/// A stream's metadata from its hash (`None`: no such stream).
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
