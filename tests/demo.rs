//! The `demo` command as a newcomer runs it: the real binary, killed with
//! `kill -9` in the middle of a call and started again, as its walkthrough
//! says to (step 3).

mod common;

use common::process::{free_addr, ProxyProcess};
use common::*;

/// The pid of the demo's upstream process, from the file the demo keeps in
/// its data directory (`<pid> <address> <owner pid>`).
fn upstream_pid(data_dir: &std::path::Path) -> i32 {
    let record = std::fs::read_to_string(data_dir.join("demo-upstream")).expect("upstream record");
    let pid = record.split_whitespace().next().expect("a pid");
    pid.parse().expect("a pid")
}

fn alive(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    let exists = unsafe { libc::kill(pid, 0) } == 0;
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| stat.contains(") Z "))
        .unwrap_or(false);
    exists && !zombie
}

#[tokio::test]
async fn a_call_cut_by_kill_9_of_the_demo_goes_on_to_its_result_after_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let addr = free_addr();
    let mut demo = ProxyProcess::start(&["demo"], dir.path(), addr, &[]).await;
    let client = demo.client();
    let session = client.initialize(V_LATEST).await;
    let call = client
        .send(Call::post(&slow_call(2, 6, 400)).session(&session))
        .await;
    let mut reader = SseReader::new(call);
    let (last_id, first) = loop {
        let (id, message) = reader.next_message().await.expect("an event");
        if message["method"] == "notifications/progress" {
            break (id.expect("an event id"), message);
        }
    };
    assert_eq!(first["params"]["progress"], 1, "{first}");

    demo.kill9();
    let mut demo = ProxyProcess::start(&["demo"], dir.path(), addr, &[]).await;

    let resumed = client
        .send(
            Call::get()
                .session(&session)
                .header("last-event-id", &last_id),
        )
        .await;
    let messages = messages(resumed).await;
    assert_eq!(progress_values(&messages), [2, 3, 4, 5, 6], "{messages:?}");
    let result = messages.last().expect("a result");
    assert_eq!(result["id"], 2, "{result}");
    assert_eq!(
        result["result"]["content"][0]["text"], "slow done after 6 steps",
        "{result}"
    );
    demo.terminate().await;
}

#[tokio::test]
async fn stopping_the_demo_stops_its_upstream() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut demo = ProxyProcess::start(&["demo"], dir.path(), free_addr(), &[]).await;
    let upstream = upstream_pid(dir.path());
    assert!(alive(upstream), "the demo's upstream runs");
    let status = demo.terminate().await;
    assert!(status.success(), "{status:?}");
    eventually("the demo's upstream is gone", || !alive(upstream)).await;
    assert!(
        !dir.path().join("demo-upstream").exists(),
        "the record of a stopped upstream is removed"
    );
}
