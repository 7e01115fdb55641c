//! The `auth` scenario (issue 35): what `[auth] principal = "jwt"` costs a
//! plain call, against the default principal (`token`: a digest of the
//! `Authorization` value) in the same run — the same fast upstream, the
//! same floor proxy, rounds interleaved. Every client sends
//! `Authorization: Bearer <token>` to every target, one ES256 token per
//! client connection signed once at the start, so the rows differ only in
//! what the proxy does with it: the default hashes it; `jwt` verifies it
//! once per new token (when the session is opened, before any round
//! measures) and then finds it in its cache — a SHA-256 of the token and a
//! map look-up per request.
//!
//! The keys are published by the tests' authorization server
//! (`tests/auth/server.rs`, on loopback in this process, a free port): the
//! proxy fetches its JWKS once, at the first token it sees.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Result};
use http::HeaderValue;
use serde_json::json;

use crate::auth_server::AuthServer;
use crate::client::Target;
use crate::keys::TestKey;
use crate::procs::{start_floor, start_proxy, start_proxy_with, start_upstream};
use crate::small::{measure, write_table, Row};
use crate::Opts;

pub async fn run(o: &Opts, bin: &Path) -> Result<String> {
    let sync = o.sync_modes(&["batch"]);
    let server = AuthServer::start().await;
    let key = TestKey::es256("load");
    server.publish(&[&key]);
    let (_upstream, up_addr) = start_upstream(o.upstream).await?;
    let (_floor, floor) = start_floor(up_addr).await?;
    let (_default, mut default) = start_proxy(bin, up_addr, &sync[0]).await?;
    default.name = "proxy default".into();
    let jwt_tables = format!(
        "\n[auth]\nprincipal = \"jwt\"\n\n[auth.jwt]\nissuer = \"{}\"\njwks_url = \"{}\"\n\
         algorithms = [\"ES256\"]\n",
        server.issuer(),
        server.url("/jwks"),
    );
    let (_jwt, mut jwt) = start_proxy_with(bin, up_addr, &sync[0], &jwt_tables).await?;
    jwt.name = "proxy jwt".into();
    let clients = o.concurrency.iter().copied().max().unwrap_or(1);
    let credentials = bearers(&key, &server.issuer(), clients)?;
    let targets = [Target::direct(up_addr), floor, default, jwt]
        .map(|t| t.with_credentials(credentials.clone()));
    let mut out = String::new();
    for &c in &o.concurrency {
        let rows = measure(&targets, c, o).await?;
        write_table(&mut out, "auth", c, o, &rows)?;
        verdict(&mut out, &rows)?;
    }
    // Calls through the jwt proxy succeeded, so its tokens verified; that
    // it fetched the keys shows it verified them rather than ignored them.
    if server.hits("/jwks") == 0 {
        bail!("the jwt proxy never fetched the key set");
    }
    Ok(out)
}

/// `Bearer <token>` for `n` clients, each token naming a person of its own
/// and valid for an hour (longer than any run).
fn bearers(key: &TestKey, issuer: &str, n: usize) -> Result<Arc<[HeaderValue]>> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    (0..n)
        .map(|i| {
            let claims =
                json!({"iss": issuer, "sub": format!("load-{i}"), "iat": now, "exp": now + 3600});
            Ok(HeaderValue::from_str(&format!(
                "Bearer {}",
                key.sign(&claims)
            ))?)
        })
        .collect()
}

/// Both proxies against the floor (throughput ratio, p50 added to the
/// floor's), then `jwt` against the default.
fn verdict(out: &mut String, rows: &[Row]) -> std::fmt::Result {
    let (floor, default, jwt) = (&rows[1], &rows[2], &rows[3]);
    for row in [default, jwt] {
        writeln!(
            out,
            "{}: {:.3}x floor req/s, {:+.1} us p50 over the floor",
            row.name,
            row.rps / floor.rps,
            row.p50 - floor.p50
        )?;
    }
    writeln!(
        out,
        "proxy jwt: {:.3}x default req/s, {:+.1} us p50 over the default",
        jwt.rps / default.rps,
        jwt.p50 - default.p50
    )?;
    writeln!(out)
}
