//! The binary's command line: help, version, and configuration errors that
//! name their key and exit with status 2.

use std::process::Command;

fn proxy() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mcp-resume-proxy"))
}

#[test]
fn help_and_version_work() {
    let help = proxy().arg("--help").output().unwrap();
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--config",
        "--listen",
        "--upstream",
        "--data-dir",
        "--log-format",
        "--upstream-command",
        "demo",
        "streams",
        "check",
    ] {
        assert!(text.contains(flag), "{flag} missing from --help");
    }
    let version = proxy().arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn an_invalid_config_names_the_key_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("proxy.toml");
    std::fs::write(
        &file,
        "[store]\nretention_secs = \"soon\"\n[[upstream]]\nurl = \"http://127.0.0.1:1/mcp\"\n",
    )
    .unwrap();
    let out = proxy().arg("--config").arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("retention_secs"), "{err}");
}

#[test]
fn running_without_an_upstream_is_a_config_error() {
    let out = proxy().output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--upstream"));
}

#[test]
fn a_missing_tls_certificate_is_a_config_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("proxy.toml");
    let missing = dir.path().join("missing.pem");
    std::fs::write(
        &file,
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = {:?}\n[tls]\ncert = {missing:?}\nkey = {missing:?}\n\
             [[upstream]]\nurl = \"http://127.0.0.1:1/mcp\"\n",
            dir.path().join("data"),
        ),
    )
    .unwrap();
    let out = proxy().arg("--config").arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tls.cert"), "{err}");
}

#[test]
fn a_missing_upstream_ca_file_is_a_config_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("proxy.toml");
    let missing = dir.path().join("missing-ca.pem");
    std::fs::write(
        &file,
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = {:?}\n\
             [[upstream]]\nurl = \"https://127.0.0.1:1/mcp\"\nca_file = {missing:?}\n",
            dir.path().join("data"),
        ),
    )
    .unwrap();
    let out = proxy().arg("--config").arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ca_file"), "{err}");
}

#[test]
fn check_accepts_a_valid_file_without_starting_anything() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("proxy.toml");
    let data = dir.path().join("data");
    std::fs::write(
        &file,
        format!(
            "listen = \"127.0.0.1:1\"\ndata_dir = {:?}\n[[upstream]]\nurl = \"http://127.0.0.1:1/mcp\"\n",
            data.display().to_string()
        ),
    )
    .unwrap();
    let out = proxy()
        .arg("check")
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("valid"));
    assert!(!data.exists(), "no log opened");
}

#[test]
fn check_refuses_an_invalid_file_naming_the_key_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("proxy.toml");
    std::fs::write(
        &file,
        "[limits]\nmax_retained_streams = -1\n[[upstream]]\nurl = \"http://127.0.0.1:1/mcp\"\n",
    )
    .unwrap();
    let out = proxy()
        .arg("check")
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("max_retained_streams"), "{err}");
}
