//! Negotiation: which dialects a client asks for in its `initialize` (at the
//! top level of `capabilities` or under `experimental`), the request the
//! upstream sees instead (without what the proxy consumed), and the
//! `initialize` result the client sees (each negotiated dialect advertised
//! under `capabilities.experimental` with its settings). Dialects the
//! operator disabled are not consumed: they reach the upstream untouched.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::{legacy_tasks, Dialect, Negotiated, Offer};
use crate::config::DialectsConfig;

/// Reads the dialects a client asks for in its `initialize`, top level or
/// under `experimental`, and returns them with the request the upstream
/// should see (without what the proxy consumed). `None` when the client
/// asked for nothing the proxy offers: the request then goes up unchanged.
pub fn negotiate(initialize: &[u8], config: &DialectsConfig) -> Option<(Negotiated, Bytes)> {
    let mut request: Value = serde_json::from_slice(initialize).ok()?;
    let capabilities = request
        .get_mut("params")?
        .get_mut("capabilities")?
        .as_object_mut()?;
    let mut wanted = Vec::new();
    let mut changed = false;
    for dialect in Dialect::ALL {
        let offer = dialect.offer(config);
        if offer == Offer::Leave {
            continue;
        }
        let top = capabilities.remove(dialect.name()).is_some();
        let experimental = capabilities
            .get_mut("experimental")
            .and_then(Value::as_object_mut)
            .is_some_and(|e| e.remove(dialect.name()).is_some());
        changed |= top || experimental;
        if (top || experimental) && offer == Offer::Speak {
            wanted.push(dialect);
        }
    }
    let empty = capabilities
        .get("experimental")
        .and_then(Value::as_object)
        .is_some_and(Map::is_empty);
    if empty {
        capabilities.remove("experimental");
    }
    if !changed {
        return None;
    }
    let stripped = serde_json::to_vec(&request).ok()?;
    Some((Negotiated::from_dialects(wanted), Bytes::from(stripped)))
}

/// The `initialize` result with every negotiated dialect advertised under
/// `capabilities.experimental`, and the 2025-11-25 tasks as
/// `capabilities.tasks` when the proxy serves them; `None` for anything
/// else (errors, junk), which is then relayed unchanged.
pub(super) fn advertise(
    result: &[u8],
    negotiated: &Negotiated,
    config: &DialectsConfig,
) -> Option<Bytes> {
    let tasks = negotiated.has(Dialect::Tasks) && legacy_tasks::served(result);
    let mut message: Value = serde_json::from_slice(result).ok()?;
    let capabilities = message
        .get_mut("result")?
        .as_object_mut()?
        .entry("capabilities")
        .or_insert_with(|| json!({}))
        .as_object_mut()?;
    if tasks {
        legacy_tasks::advertise(capabilities);
    }
    let settings: Vec<(&str, Value)> = negotiated
        .dialects()
        .iter()
        .filter_map(|d| Some((d.name(), d.settings(config)?)))
        .collect();
    if !settings.is_empty() {
        let experimental = capabilities
            .entry("experimental")
            .or_insert_with(|| json!({}))
            .as_object_mut()?;
        for (name, settings) in settings {
            experimental.insert(name.to_owned(), settings);
        }
    }
    serde_json::to_vec(&message).ok().map(Bytes::from)
}

/// The dialects a session keeps once its upstream answered `initialize`
/// with `result`: the 2025-11-25 tasks only when the proxy serves them (the
/// revision was agreed and the upstream has none of its own).
pub fn kept_after_initialize(result: &[u8], dialects: &mut Vec<String>) {
    if !legacy_tasks::served(result) {
        dialects.retain(|d| d != Dialect::Tasks.name());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> DialectsConfig {
        DialectsConfig::default()
    }

    fn init(capabilities: Value) -> Vec<u8> {
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":"2025-11-25","capabilities":capabilities,
            "clientInfo":{"name":"t","version":"1"}}})
        .to_string()
        .into_bytes()
    }

    #[test]
    fn a_dialect_is_negotiated_at_the_top_level_or_under_experimental() {
        let (top, _) = negotiate(&init(json!({"resumableRequests":{}})), &config()).unwrap();
        assert_eq!(
            top,
            Negotiated::from_dialects(vec![Dialect::ResumableRequests])
        );
        let (exp, _) = negotiate(
            &init(json!({"experimental":{"streams":{}},"sampling":{}})),
            &config(),
        )
        .unwrap();
        assert_eq!(exp, Negotiated::from_dialects(vec![Dialect::Streams]));
    }

    #[test]
    fn negotiation_strips_what_it_consumed_and_keeps_the_rest() {
        let (_, upstream) = negotiate(
            &init(json!({"streams":{},"experimental":{"resumableRequests":{},"x":1},"roots":{}})),
            &config(),
        )
        .unwrap();
        let sent: Value = serde_json::from_slice(&upstream).unwrap();
        assert_eq!(
            sent["params"]["capabilities"],
            json!({"experimental":{"x":1},"roots":{}})
        );
    }

    #[test]
    fn a_client_that_asks_for_nothing_is_left_alone() {
        assert!(negotiate(&init(json!({"sampling":{}})), &config()).is_none());
        assert!(negotiate(b"not json", &config()).is_none());
    }

    #[test]
    fn a_disabled_dialect_passes_through_to_the_upstream() {
        let mut c = config();
        c.streams.enabled = false;
        assert!(negotiate(&init(json!({"streams":{}})), &c).is_none());
    }

    #[test]
    fn the_initialize_result_advertises_each_negotiated_dialect_with_its_settings() {
        let result = br#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}}}}"#;
        let both = Negotiated::from_dialects(Dialect::ALL.to_vec());
        let shown: Value =
            serde_json::from_slice(&advertise(result, &both, &config()).unwrap()).unwrap();
        let exp = &shown["result"]["capabilities"]["experimental"];
        assert_eq!(exp["resumableRequests"], json!({"minWait":1,"maxWait":600}));
        assert_eq!(
            exp["streams"],
            json!({"resumeInterval":{"min":1,"max":3600}})
        );
        assert_eq!(shown["result"]["capabilities"]["tools"], json!({}));
    }
}
