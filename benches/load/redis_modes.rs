//! The Redis behind the `redis`, `redis-tls` and `redis-cluster` pseudo
//! sync modes, as the proxies of a run see it: the private servers of the
//! first two (each started on first use, once per run; the cluster is
//! `cluster.rs`'s), the `[store]` section that points a proxy at any of
//! them on a key prefix of its own (then `--store-extra`), and the cleaning
//! of the keys those proxies wrote. It must not start a proxy: `procs.rs`
//! does, asking here for its `[store]`.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};

/// The Redis the `redis` pseudo sync mode logs to: `REDIS_URL`, else a
/// private `redis-server` without persistence, as in the tests (started on
/// first use, gone with the harness).
fn bench_redis() -> Result<String> {
    crate::redis_server::shared().map_err(|why| anyhow!(why))
}

/// The ACL user the `redis-tls` proxies log in as, and its password: the
/// names `tests/redis_tls.rs` uses, so the bench measures the set-up the
/// tests hold correct.
const TLS_USER: &str = "mcp-proxy";
const TLS_PASSWORD: &str = "a password only the file holds";

/// The private Redis of the `redis-tls` pseudo sync mode: a `redis-server`
/// serving TLS (`--tls-port`) with a certificate from a throwaway CA and
/// the ACL user [`TLS_USER`], configured as `tests/redis_tls.rs` configures
/// it. Always a private server, even with `REDIS_URL` set: that names a
/// plain Redis, whose TLS (if any) the harness cannot set up.
struct TlsRedis {
    // Fields drop in order: the server stops before the directory holding
    // the certificate and key it was started with goes.
    server: crate::redis_server::RedisServer,
    /// The CA, the server's certificate and key, and the password file.
    pki: crate::tls::Pki,
    password_file: PathBuf,
}

/// The `redis-tls` Redis once asked for: `None` until a proxy of that mode
/// starts (so `--smoke`, `--check` and every run without it never start
/// one), then the server or why it could not start (kept, so every later
/// proxy fails with the same one line instead of trying again). Taken out
/// and dropped by [`stop_redis_tls`]: a static is never dropped, and the
/// server's process alone would go with the harness (`PR_SET_PDEATHSIG`),
/// leaving its and the CA's temporary directories behind.
static TLS_REDIS: std::sync::Mutex<Option<std::result::Result<TlsRedis, String>>> =
    std::sync::Mutex::new(None);

/// Starts the `redis-tls` server: a fresh CA and server certificate, the
/// password in a file next to them, then `redis-server --tls-port`.
fn start_redis_tls() -> std::result::Result<TlsRedis, String> {
    // `Pki::new` is the tests' and panics where it cannot write its temp
    // dir: a failure of this mode's set-up, not a reason to abort the run.
    let pki = std::panic::catch_unwind(crate::tls::Pki::new)
        .map_err(|_| "the redis-tls CA could not be made (see the panic above)".to_owned())?;
    let password_file = pki.dir.path().join("redis.password");
    std::fs::write(&password_file, format!("{TLS_PASSWORD}\n"))
        .map_err(|e| format!("{}: {e}", password_file.display()))?;
    let tls = crate::redis_server::Tls {
        // Chosen by `start_tls`.
        port: 0,
        cert: pki.server_cert_file.clone(),
        key: pki.server_key_file.clone(),
        ca: pki.ca_file.clone(),
        users: vec![(TLS_USER.into(), TLS_PASSWORD.into())],
        client_certificates: false,
    };
    let server = crate::redis_server::RedisServer::start_tls(tls)?;
    Ok(TlsRedis {
        server,
        pki,
        password_file,
    })
}

/// The `[store]` keys (after `backend`) that reach the `redis-tls` Redis
/// over TLS as [`TLS_USER`], starting it on first use.
fn bench_redis_tls() -> Result<String> {
    let mut slot = TLS_REDIS.lock().unwrap_or_else(|p| p.into_inner());
    let redis = slot
        .get_or_insert_with(start_redis_tls)
        .as_ref()
        .map_err(|why| anyhow!("{why}"))?;
    Ok(format!(
        "redis_url = \"{}\"\nredis_username = \"{TLS_USER}\"\n\
         redis_password_file = \"{}\"\nredis_ca_file = \"{}\"\n",
        redis.server.tls_url(),
        redis.password_file.display(),
        redis.pki.ca_file.display(),
    ))
}

/// Stops the `redis-tls` Redis, if one was started, and removes its files.
/// After [`clean_redis`], which reaches it through its plain port.
pub fn stop_redis_tls() {
    drop(TLS_REDIS.lock().unwrap_or_else(|p| p.into_inner()).take());
}

/// Which of the benchmark's Redis servers a proxy wrote to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BenchRedis {
    /// The `redis` mode's ([`bench_redis`]).
    Plain,
    /// The `redis-tls` mode's ([`TLS_REDIS`]).
    Tls,
    /// The `redis-cluster` mode's (`cluster`): never cleaned, its keys go
    /// with it.
    Cluster,
}

/// Key prefixes the benchmark's Redis proxies wrote under, and where.
static REDIS_PREFIXES: std::sync::Mutex<Vec<(BenchRedis, String)>> =
    std::sync::Mutex::new(Vec::new());

/// Deletes every key the benchmark's Redis proxies wrote (best effort).
/// Neither server is started for it: a prefix exists only once its server
/// did.
pub fn clean_redis() {
    let prefixes = std::mem::take(&mut *REDIS_PREFIXES.lock().unwrap_or_else(|p| p.into_inner()));
    if prefixes.is_empty() {
        return;
    }
    // Asked only when a prefix is there: `bench_redis` starts a server when
    // none ran yet, and a run of `redis-tls` alone never started one.
    let plain = prefixes
        .iter()
        .any(|(redis, _)| *redis == BenchRedis::Plain)
        .then(bench_redis)
        .and_then(Result::ok);
    // The TLS server's plain port: its `default` user, on loopback only,
    // needs neither certificate nor password (as `tests/redis_tls.rs` reads
    // its keys).
    let tls = TLS_REDIS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|r| r.as_ref().ok())
        .map(|r| r.server.url());
    for (redis, prefix) in prefixes {
        let url = match redis {
            BenchRedis::Plain => &plain,
            BenchRedis::Tls => &tls,
            BenchRedis::Cluster => continue,
        };
        if let Some(url) = url {
            crate::redis_keys::delete_prefix(url, &prefix);
        }
    }
}

/// `--store-extra`: TOML lines (each ending in a newline) added to the
/// `[store]` of every proxy of the run. A static, set by `run` before the
/// first proxy starts, because the scenarios reach [`store_section`] from
/// a dozen places that do not carry the options.
pub static STORE_EXTRA: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// `--store-extra`'s lines, or none.
pub fn store_extra() -> &'static str {
    STORE_EXTRA.get().map_or("", String::as_str)
}

/// The `[store]` (and `[tokens]`) of a benchmark proxy: a `sync` mode of
/// the journal, `redis` — the shared backend — `redis-tls` — the same
/// over TLS as an ACL user — or `redis-cluster` — on a Redis Cluster of
/// three primaries — each Redis proxy on its own key prefix; then
/// `--store-extra`.
pub fn store_section(sync: &str, dir: &Path) -> Result<String> {
    let extra = store_extra();
    let (redis, keys) = match sync {
        "redis" => (
            BenchRedis::Plain,
            format!("redis_url = \"{}\"\n", bench_redis()?),
        ),
        "redis-tls" => (BenchRedis::Tls, bench_redis_tls()?),
        "redis-cluster" => (
            BenchRedis::Cluster,
            format!("redis_cluster = {:?}\n", crate::cluster::node_urls()?),
        ),
        _ => return Ok(format!("[store]\nsync = \"{sync}\"\n{extra}")),
    };
    let prefix = {
        let mut prefixes = REDIS_PREFIXES.lock().unwrap_or_else(|p| p.into_inner());
        let prefix = format!(
            "mcp-resume-proxy-load:{}:{}",
            std::process::id(),
            prefixes.len()
        );
        prefixes.push((redis, prefix.clone()));
        prefix
    };
    let key = dir.join("token.key");
    std::fs::write(&key, [1u8; 32])?;
    Ok(format!(
        "[store]\nbackend = \"redis\"\n{keys}key_prefix = \"{prefix}\"\n{extra}\n\
         [tokens]\nkey_file = \"{}\"\n",
        key.display()
    ))
}
