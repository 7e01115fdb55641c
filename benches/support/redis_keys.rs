//! Deleting every key of a test or benchmark deployment in Redis (its
//! `key_prefix`): shared by the benches and the integration tests, which
//! each give their proxies a prefix of their own.

/// Deletes the keys under `prefix` (best effort: a Redis that does not
/// answer is left as it is).
pub fn delete_prefix(url: &str, prefix: &str) {
    let Ok(mut conn) = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(std::time::Duration::from_secs(2)))
    else {
        return;
    };
    // A stream's and a session's keys start with `{prefix:`, the global
    // ones with `prefix:`.
    for pattern in [format!("{{{prefix}:*"), format!("{prefix}:*")] {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query(&mut conn)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _ = redis::cmd("DEL").arg(&keys).query::<()>(&mut conn);
        }
    }
}
