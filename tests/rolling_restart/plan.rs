//! How long and how hard a run is (`MCP_ROLLING`, `MCP_ROLLING_ROUNDS`),
//! and what a missing program means: outside CI a test whose program is not
//! installed says so and passes; in CI (`CI` set) every program must be
//! there. It reads the environment and starts the private `redis-server`;
//! it must not start anything else, nor run calls or restarts itself.

use std::time::Duration;

use crate::common::redis_server::{Persistence, RedisServer, MISSING};

/// How long and how hard a run is.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Each round restarts every instance once.
    pub rounds: usize,
    pub drain_delay_secs: u64,
    /// Time between two restarts (after the previous instance is back).
    pub settle: Duration,
    /// Steps of a call (inclusive range) and the pause between them: calls
    /// of 1.5 to 5 s (2 to 9 s in the long run), most longer than the drain,
    /// so that shutdowns cut them (a drain lets shorter ones end where they
    /// began).
    steps: (u64, u64),
    interval_ms: (u64, u64),
}

pub fn plan() -> Plan {
    let long = std::env::var("MCP_ROLLING").is_ok_and(|v| !v.is_empty() && v != "0");
    let rounds = std::env::var("MCP_ROLLING_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if long { 5 } else { 1 });
    if long {
        Plan {
            rounds,
            drain_delay_secs: 3,
            settle: Duration::from_millis(2_500),
            steps: (20, 60),
            interval_ms: (100, 150),
        }
    } else {
        Plan {
            rounds,
            drain_delay_secs: 2,
            settle: Duration::from_millis(1_500),
            steps: (15, 35),
            interval_ms: (100, 140),
        }
    }
}

impl Plan {
    /// Call `id` of client `client`: its steps and interval, varied but
    /// reproducible.
    pub fn call(&self, client: usize, id: u64) -> (u64, u64) {
        let spread = |(lo, hi): (u64, u64), n: u64| lo + n % (hi - lo + 1);
        let c = client as u64;
        (
            spread(self.steps, c * 7 + id * 5),
            spread(self.interval_ms, c * 13 + id * 11),
        )
    }
}

/// Whether `CI` is set: then every program the tests use must be installed.
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// A private `redis-server`; `None` (the test passes, saying why) when it
/// is not installed, outside CI.
pub fn private_redis() -> Option<RedisServer> {
    match RedisServer::start(Persistence::None) {
        Ok(server) => Some(server),
        Err(why) if why == MISSING && !in_ci() => {
            println!("skipped: {why}");
            None
        }
        Err(why) => panic!("{why}"),
    }
}
