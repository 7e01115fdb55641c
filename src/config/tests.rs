use super::*;
use crate::store::commit::SyncMode;

#[test]
fn minimal_file_gets_every_default() {
    let c = Config::from_toml("[[upstream]]\nurl = \"http://127.0.0.1:3000/mcp\"\n").unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.upstream[0].path, "/mcp");
    assert_eq!(c.store.sync, SyncMode::Batch);
    assert_eq!(c.max_body, 4 * 1024 * 1024);
}

#[test]
fn workers_are_taken_as_given_and_zero_is_refused() {
    let c = Config::from_toml("workers = 3\n[[upstream]]\nurl = \"http://a/\"\n").unwrap();
    assert_eq!(c.workers(), 3);
    let unset = Config::from_toml("[[upstream]]\nurl = \"http://a/\"\n").unwrap();
    assert!(unset.workers() >= 1);
    let err = Config::from_toml("workers = 0\n[[upstream]]\nurl = \"http://a/\"\n");
    assert!(err.unwrap_err().0.contains("workers = 0"));
}

#[test]
fn the_example_file_is_valid() {
    let text = include_str!("../../proxy.toml.example");
    Config::from_toml(text).unwrap();
}

#[test]
fn the_redis_url_may_be_given_as_url() {
    let c = Config::from_toml(
        "[store]\nbackend = \"redis\"\nurl = \"redis://r:1/0\"\n\
         [tokens]\nkey_file = \"k\"\n[[upstream]]\nurl = \"http://a/\"\n",
    )
    .unwrap();
    assert_eq!(c.store.redis_url, "redis://r:1/0");
}

#[test]
fn the_redis_backend_refuses_a_stdio_upstream_and_a_key_of_its_own() {
    let stdio = "[store]\nbackend = \"redis\"\n[tokens]\nkey_file = \"k\"\n\
                 [[upstream]]\ncommand = [\"server\"]\n";
    let err = Config::from_toml(stdio).unwrap_err();
    assert!(err.0.contains("stdio") && err.0.contains("redis"), "{err}");
    let no_key = "[store]\nbackend = \"redis\"\n[[upstream]]\nurl = \"http://a/\"\n";
    let err = Config::from_toml(no_key).unwrap_err();
    assert!(err.0.contains("tokens.key_file"), "{err}");
}

#[test]
fn sleds_page_cache_is_bounded_by_default_and_set_by_its_key() {
    let up = "[[upstream]]\nurl = \"http://a/\"\n";
    let c = Config::from_toml(up).unwrap();
    assert_eq!(c.store.sled_cache_bytes, 128 * 1024 * 1024);
    let set = "[store]\nbackend = \"sled\"\nsled_cache_bytes = 33554432\n";
    let c = Config::from_toml(&format!("{set}{up}")).unwrap();
    assert_eq!(c.store.sled_cache_bytes, 32 * 1024 * 1024);
}

#[test]
fn the_journal_is_the_default_backend_and_sled_or_redis_can_be_chosen() {
    let up = "[[upstream]]\nurl = \"http://a/\"\n";
    let c = Config::from_toml(up).unwrap();
    assert_eq!(c.store.backend, Backend::Journal);
    let c = Config::from_toml(&format!("[store]\nbackend = \"sled\"\n{up}")).unwrap();
    assert_eq!(c.store.backend, Backend::Sled);
    let key = "[tokens]\nkey_file = \"/etc/proxy/token.key\"\n";
    let c = Config::from_toml(&format!(
        "[store]\nbackend = \"redis\"\nredis_url = \"redis://r:6380/2\"\nkey_prefix = \"p\"\n{key}{up}"
    ))
    .unwrap();
    assert_eq!(c.store.backend, Backend::Redis);
    assert_eq!(
        (c.store.redis_url.as_str(), c.store.key_prefix.as_str()),
        ("redis://r:6380/2", "p")
    );
    let c = Config::from_toml(&format!("[store]\nbackend = \"redis\"\n{key}{up}")).unwrap();
    assert_eq!(c.store.redis_url, "redis://127.0.0.1:6379/0");
    assert_eq!(c.store.key_prefix, "mcp-resume-proxy");
    let err = Config::from_toml(&format!("[store]\nkey_prefix = \"a{{b\"\n{up}")).unwrap_err();
    assert!(err.0.contains("key_prefix"), "{err}");
    let err = Config::from_toml(&format!("[store]\nbackend = \"postgres\"\n{up}")).unwrap_err();
    assert!(err.0.contains("backend"), "{err}");
}

#[test]
fn unknown_keys_are_named() {
    let err = Config::from_toml("[store]\nsinc = \"batch\"\n").unwrap_err();
    assert!(err.0.contains("sinc"), "{err}");
}

#[test]
fn wrong_values_name_their_key() {
    let err = Config::from_toml("[store]\nsync = \"sometimes\"\n").unwrap_err();
    assert!(err.0.contains("sync"), "{err}");
    let err = Config::from_toml("[[upstream]]\nurl = \"ftp://x\"\n").unwrap_err();
    assert!(err.0.contains("upstream[0].url"), "{err}");
    let err =
        Config::from_toml("[[upstream]]\nurl = \"http://a/\"\n[[upstream]]\nurl = \"http://b/\"\n")
            .unwrap_err();
    assert!(err.0.contains("upstream[1].path"), "{err}");
}

#[test]
fn a_stdio_upstream_takes_a_command_and_not_a_url() {
    let c = Config::from_toml("[[upstream]]\ncommand = [\"node\", \"server.js\"]\n").unwrap();
    assert_eq!(c.upstream[0].command.as_deref().unwrap().len(), 2);
    let err =
        Config::from_toml("[[upstream]]\nurl = \"http://a/\"\ncommand = [\"x\"]\n").unwrap_err();
    assert!(err.0.contains("not both"), "{err}");
    let err = Config::from_toml("[[upstream]]\ncommand = []\n").unwrap_err();
    assert!(err.0.contains("upstream[0].command"), "{err}");
}

#[test]
fn front_door_limits_have_defaults_and_bounds() {
    let up = "[[upstream]]\nurl = \"http://a/\"\n";
    let c = Config::from_toml(up).unwrap();
    assert_eq!(c.limits.max_header_bytes, 64 * 1024);
    assert_eq!(c.limits.header_read_timeout(), Duration::from_secs(10));
    assert_eq!(c.limits.body_read_timeout(), Duration::from_secs(30));
    assert_eq!(c.tls, None);
    let err = Config::from_toml(&format!("[limits]\nmax_header_bytes = 100\n{up}")).unwrap_err();
    assert!(err.0.contains("limits.max_header_bytes"), "{err}");
    let err = Config::from_toml(&format!("[limits]\nbody_read_timeout_ms = 0\n{up}")).unwrap_err();
    assert!(err.0.contains("limits.body_read_timeout_ms"), "{err}");
}

#[test]
fn session_bounds_have_defaults_and_zero_is_refused() {
    let up = "[[upstream]]\nurl = \"http://a/\"\n";
    let c = Config::from_toml(up).unwrap();
    assert_eq!(
        (
            c.limits.max_sessions,
            c.limits.max_sessions_per_principal,
            c.limits.unused_session_secs
        ),
        (4_096, 256, 300)
    );
    for key in [
        "max_sessions",
        "max_sessions_per_principal",
        "unused_session_secs",
    ] {
        let err = Config::from_toml(&format!("[limits]\n{key} = 0\n{up}")).unwrap_err();
        assert!(err.0.contains(&format!("limits.{key}")), "{err}");
    }
}

#[test]
fn tls_takes_cert_key_and_an_optional_client_ca() {
    let up = "[[upstream]]\nurl = \"https://a/\"\nca_file = \"up.pem\"\n";
    let c = Config::from_toml(&format!("[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n{up}")).unwrap();
    let tls = c.tls.unwrap();
    assert_eq!(tls.cert, PathBuf::from("c.pem"));
    assert_eq!(tls.client_ca, None);
    assert_eq!(c.upstream[0].ca_file, Some(PathBuf::from("up.pem")));
    let err = Config::from_toml(&format!("[tls]\ncert = \"c.pem\"\n{up}")).unwrap_err();
    assert!(err.0.contains("key"), "{err}");
    let err =
        Config::from_toml("[[upstream]]\ncommand = [\"x\"]\nca_file = \"a.pem\"\n").unwrap_err();
    assert!(err.0.contains("upstream[0].ca_file"), "{err}");
}

#[test]
fn the_drain_delay_is_off_by_default_and_bounded() {
    let up = "[[upstream]]\nurl = \"http://a/\"\n";
    let c = Config::from_toml(up).unwrap();
    assert_eq!(c.drain_delay_secs, 0);
    let c = Config::from_toml(&format!("drain_delay_secs = 15\n{up}")).unwrap();
    assert_eq!(c.drain_delay_secs, 15);
    let err = Config::from_toml(&format!("drain_delay_secs = 5000\n{up}")).unwrap_err();
    assert!(err.0.contains("drain_delay_secs = 5000"), "{err}");
}

#[test]
fn the_access_log_is_on_and_no_tool_is_a_label_by_default() {
    let c = Config::from_toml("[[upstream]]\nurl = \"http://a/\"\n").unwrap();
    assert!(c.access_log);
    assert!(c.metrics_tools.is_empty());
}

#[test]
fn a_password_in_the_redis_url_is_refused() {
    let up = "[[upstream]]\nurl = \"http://a/\"\n";
    for url in ["redis://:pw@r:6379/0", "rediss://user:pw@r:6380/0"] {
        let toml = format!("[store]\nredis_url = \"{url}\"\n{up}");
        let err = Config::from_toml(&toml).unwrap_err();
        assert!(err.0.contains("store.redis_url holds a password"), "{err}");
        assert!(!err.0.contains("pw"), "{err}");
    }
    let user_only = format!("[store]\nredis_url = \"rediss://user@r:6380/0\"\n{up}");
    assert!(Config::from_toml(&user_only).is_ok());
}

#[test]
fn redis_tls_files_need_a_rediss_url_and_a_certificate_its_key() {
    let up = "[[upstream]]\nurl = \"http://a/\"\n";
    let plain = format!("[store]\nredis_url = \"redis://r/0\"\nredis_ca_file = \"/ca.pem\"\n{up}");
    let err = Config::from_toml(&plain).unwrap_err();
    assert!(err.0.contains("store.redis_ca_file is for TLS"), "{err}");
    let half =
        format!("[store]\nredis_url = \"rediss://r/0\"\nredis_client_cert = \"/c.pem\"\n{up}");
    let err = Config::from_toml(&half).unwrap_err();
    assert!(err.0.contains("go together"), "{err}");
}

#[test]
fn a_write_waits_for_no_replica_by_default_and_for_a_second_when_asked() {
    let up = "[[upstream]]\nurl = \"http://a/\"\n";
    let c = Config::from_toml(up).unwrap();
    assert_eq!(c.store.replicas().min, 0);
    let redis = "[store]\nbackend = \"redis\"\nmin_replicas = 2\n";
    let key = "[tokens]\nkey_file = \"k\"\n";
    let c = Config::from_toml(&format!("{redis}{key}{up}")).unwrap();
    let replicas = c.store.replicas();
    assert_eq!(replicas.min, 2);
    assert_eq!(replicas.wait, std::time::Duration::from_millis(1_000));
    let c = Config::from_toml(&format!("{redis}replica_wait_ms = 250\n{key}{up}")).unwrap();
    assert_eq!(c.store.replicas().wait.as_millis(), 250);
}

#[test]
fn min_replicas_and_replica_wait_ms_are_refused_off_redis() {
    let up = "[[upstream]]\nurl = \"http://a/\"\n";
    for backend in ["journal", "sled"] {
        let toml = format!("[store]\nbackend = \"{backend}\"\nmin_replicas = 1\n{up}");
        let err = Config::from_toml(&toml).unwrap_err();
        assert!(
            err.0
                .contains("store.min_replicas = 1 needs backend = \"redis\""),
            "{err}"
        );
        let toml = format!("[store]\nbackend = \"{backend}\"\nreplica_wait_ms = 500\n{up}");
        let err = Config::from_toml(&toml).unwrap_err();
        assert!(
            err.0.contains("store.replica_wait_ms is for backend"),
            "{err}"
        );
    }
    let off = format!("[store]\nmin_replicas = 0\n{up}");
    assert!(Config::from_toml(&off).is_ok(), "0 is the default");
}

#[test]
fn a_replica_wait_of_zero_or_of_more_than_a_minute_is_refused() {
    let up = "[[upstream]]\nurl = \"http://a/\"\n[tokens]\nkey_file = \"k\"\n";
    let redis = "[store]\nbackend = \"redis\"\nmin_replicas = 1\n";
    let err = Config::from_toml(&format!("{redis}replica_wait_ms = 0\n{up}")).unwrap_err();
    assert!(err.0.contains("store.replica_wait_ms = 0"), "{err}");
    let err = Config::from_toml(&format!("{redis}replica_wait_ms = 60001\n{up}")).unwrap_err();
    assert!(err.0.contains("store.replica_wait_ms = 60001"), "{err}");
    assert!(Config::from_toml(&format!("{redis}replica_wait_ms = 60000\n{up}")).is_ok());
}

#[test]
fn metrics_tools_are_bounded_and_named() {
    let up = "[[upstream]]\nurl = \"http://a/\"\n";
    let many: Vec<String> = (0..=MAX_METRICS_TOOLS)
        .map(|i| format!("\"t{i}\""))
        .collect();
    let toml = format!("metrics_tools = [{}]\n{up}", many.join(","));
    let err = Config::from_toml(&toml).unwrap_err();
    assert!(err.0.contains("metrics_tools lists 33 tools"), "{err}");
    let err = Config::from_toml(&format!("metrics_tools = [\"\"]\n{up}")).unwrap_err();
    assert!(
        err.0.contains("metrics_tools: \"\" is not a tool name"),
        "{err}"
    );
}

#[test]
fn no_upstream_is_mounted_where_the_probes_answer() {
    for path in ["/healthz", "/livez", "/readyz/"] {
        let err = Config::from_toml(&format!(
            "[[upstream]]\nurl = \"http://a/\"\npath = \"{path}\"\n"
        ))
        .unwrap_err();
        assert!(err.0.contains("upstream[0].path"), "{path}: {err}");
    }
}

#[test]
fn a_config_without_upstream_is_rejected() {
    let err = Config::from_toml("").unwrap_err();
    assert!(err.0.contains("upstream"), "{err}");
}
