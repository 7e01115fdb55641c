//! The binary's command line: help, version, and configuration errors that
//! name their key and exit with status 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

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
        "reload",
    ] {
        assert!(text.contains(flag), "{flag} missing from --help");
    }
    let version = proxy().arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).contains(env!("CARGO_PKG_VERSION")));
}

/// A configuration file of `toml` in a directory of its own.
fn config_file(toml: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("proxy.toml");
    std::fs::write(&file, toml).unwrap();
    (dir, file)
}

/// The binary run with `args` then `--config file`, given at most 10 s (a
/// command that started serving instead would otherwise never return).
fn run_with(args: &[&str], file: &Path) -> Output {
    let mut child = proxy()
        .args(args)
        .arg("--config")
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("still running after 10 s: {args:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// A refusal: status 2, and stderr naming `key`.
fn refused_naming(out: &Output, key: &str) {
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(key), "{err}");
}

#[test]
fn an_invalid_config_names_the_key_and_exits_2() {
    let (_dir, file) = config_file(
        "[store]\nretention_secs = \"soon\"\n[[upstream]]\nurl = \"http://127.0.0.1:1/mcp\"\n",
    );
    refused_naming(&run_with(&[], &file), "retention_secs");
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
    let missing = dir.path().join("missing.pem");
    let (_config, file) = config_file(&format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = {:?}\n[tls]\ncert = {missing:?}\nkey = {missing:?}\n\
         [[upstream]]\nurl = \"http://127.0.0.1:1/mcp\"\n",
        dir.path().join("data"),
    ));
    refused_naming(&run_with(&[], &file), "tls.cert");
}

#[test]
fn a_missing_upstream_ca_file_is_a_config_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing-ca.pem");
    let (_config, file) = config_file(&format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = {:?}\n\
         [[upstream]]\nurl = \"https://127.0.0.1:1/mcp\"\nca_file = {missing:?}\n",
        dir.path().join("data"),
    ));
    refused_naming(&run_with(&[], &file), "ca_file");
}

#[test]
fn check_accepts_a_valid_file_without_starting_anything() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (_config, file) = config_file(&format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = {:?}\n[[upstream]]\nurl = \"http://127.0.0.1:1/mcp\"\n",
        data.display().to_string()
    ));
    let out = run_with(&["check"], &file);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("valid"));
    assert!(!data.exists(), "no log opened");
}

#[test]
fn check_refuses_an_invalid_file_naming_the_key_and_exits_2() {
    let (_dir, file) = config_file(
        "[limits]\nmax_retained_streams = -1\n[[upstream]]\nurl = \"http://127.0.0.1:1/mcp\"\n",
    );
    refused_naming(&run_with(&["check"], &file), "max_retained_streams");
}
