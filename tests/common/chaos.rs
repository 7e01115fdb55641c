//! Chaos support: a loopback TCP relay (client → relay → proxy) that cuts a
//! client's connection after an exact number of bytes of the proxy's
//! response, and a seeded xorshift so a failing run can be replayed.
//!
//! The relay forwards the client's bytes untouched; a cut is armed for the
//! next connection it accepts (tests send one request at a time through an
//! unpooled client, so "next connection" is "next request"). When the proxy
//! has sent the armed number of bytes and has more to send, the relay writes
//! exactly that many and closes both sides: the client sees its response end
//! mid-head, mid-chunk or mid-event, wherever the position fell.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// xorshift64*: small, seedable, good enough to pick cut positions.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // Zero is the one state xorshift never leaves.
        Self((seed ^ 0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// The seed of a run: `CHAOS_SEED` if set, else the clock.
pub fn seed() -> u64 {
    std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// Cuts each chaos test makes at least: `CHAOS_CUTS`, else `default`.
pub fn cuts_wanted(default: u64) -> u64 {
    std::env::var("CHAOS_CUTS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(default)
}

#[derive(Debug, Default)]
pub struct RelayStats {
    pub connections: AtomicU64,
    /// Connections cut at their armed position.
    pub cuts: AtomicU64,
    /// Response bytes of the last connection that ended uncut.
    pub last_uncut_len: AtomicU64,
}

pub struct Relay {
    pub addr: SocketAddr,
    pub stats: Arc<RelayStats>,
    armed: Arc<Mutex<Option<usize>>>,
    accept: JoinHandle<()>,
}

impl Relay {
    /// A relay on 127.0.0.1 in front of `target`.
    pub async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("relay binds");
        let addr = listener.local_addr().expect("relay address");
        let stats = Arc::new(RelayStats::default());
        let armed = Arc::new(Mutex::new(None));
        let accept = {
            let (stats, armed) = (stats.clone(), armed.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    stats.connections.fetch_add(1, Ordering::Relaxed);
                    let cut = armed.lock().expect("armed cut").take();
                    tokio::spawn(pipe(client, target, cut, stats.clone()));
                }
            })
        };
        Relay {
            addr,
            stats,
            armed,
            accept,
        }
    }

    /// The next connection is cut after `at` bytes of the proxy's response
    /// (if the response is longer).
    pub fn arm(&self, at: usize) {
        *self.armed.lock().expect("armed cut") = Some(at);
    }

    /// No cut for the next connection.
    pub fn disarm(&self) {
        *self.armed.lock().expect("armed cut") = None;
    }

    pub fn cuts(&self) -> u64 {
        self.stats.cuts.load(Ordering::Relaxed)
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn pipe(client: TcpStream, target: SocketAddr, cut: Option<usize>, stats: Arc<RelayStats>) {
    let Ok(upstream) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut proxy_read, mut proxy_write) = upstream.into_split();
    let requests = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut proxy_write).await;
        let _ = proxy_write.shutdown().await;
    });
    let mut sent = 0usize;
    let mut buf = vec![0u8; 16 * 1024];
    let mut was_cut = false;
    loop {
        let n = match proxy_read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let take = match cut {
            Some(at) if sent + n > at => {
                was_cut = true;
                at - sent
            }
            _ => n,
        };
        if client_write.write_all(&buf[..take]).await.is_err() {
            break;
        }
        sent += take;
        if was_cut {
            stats.cuts.fetch_add(1, Ordering::Relaxed);
            break;
        }
    }
    if !was_cut {
        stats.last_uncut_len.store(sent as u64, Ordering::Relaxed);
    }
    // Both sides close: the client sees its response end where it was cut,
    // the proxy sees its client gone.
    requests.abort();
    let _ = client_write.shutdown().await;
}
