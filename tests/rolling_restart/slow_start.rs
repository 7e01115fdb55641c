//! A relay in front of the demo upstream that can hold back what the
//! upstream sends, so that an upstream slow to begin its answer is certain
//! rather than hoped for (see
//! `a_call_that_arrived_just_before_a_graceful_stop_ends_with_its_result`).
//! It passes bytes on, late while held; it must not read, change or drop
//! any.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::sleep;

/// A TCP relay in front of the upstream that, while held, keeps what the
/// upstream sends for [`SlowStart::HOLD`] before it passes it on: an
/// upstream slow to begin its answer (a server that authorizes, or loads
/// something first), which widens to a second the few milliseconds between
/// a call reaching the upstream and the upstream's first event.
pub struct SlowStart {
    pub addr: SocketAddr,
    hold: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl SlowStart {
    const HOLD: Duration = Duration::from_millis(1_000);

    pub async fn start(target: SocketAddr) -> SlowStart {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("relay binds");
        let addr = listener.local_addr().expect("relay address");
        let hold = Arc::new(AtomicBool::new(false));
        let held = hold.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let held = held.clone();
                tokio::spawn(async move {
                    let Ok(upstream) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut from_client, mut to_client) = client.into_split();
                    let (mut from_upstream, mut to_upstream) = upstream.into_split();
                    let up = async {
                        let _ = tokio::io::copy(&mut from_client, &mut to_upstream).await;
                        let _ = to_upstream.shutdown().await;
                    };
                    let down = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        while let Ok(n @ 1..) = from_upstream.read(&mut buf).await {
                            if held.load(Ordering::Relaxed) {
                                sleep(Self::HOLD).await;
                            }
                            if to_client.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = to_client.shutdown().await;
                    };
                    tokio::join!(up, down);
                });
            }
        });
        SlowStart { addr, hold, task }
    }

    pub fn hold(&self, on: bool) {
        self.hold.store(on, Ordering::Relaxed);
    }
}

impl Drop for SlowStart {
    fn drop(&mut self) {
        self.task.abort();
    }
}
