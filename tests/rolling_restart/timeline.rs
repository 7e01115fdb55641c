//! The run's timeline: what happened when (signals, exits, restarts,
//! nginx's reloads), in milliseconds since the start, and the instances'
//! names for their addresses, for the summary and for failure messages. It
//! only records and names; it must not assert or decide anything.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

/// What happened when, for the summary and for failure messages.
#[derive(Clone)]
pub struct Timeline {
    start: Instant,
    lines: Arc<Mutex<Vec<String>>>,
    names: Arc<BTreeMap<SocketAddr, &'static str>>,
}

impl Timeline {
    pub fn new(names: &[(SocketAddr, &'static str)]) -> Self {
        Timeline {
            start: Instant::now(),
            lines: Arc::default(),
            names: Arc::new(names.iter().copied().collect()),
        }
    }

    pub fn ms(&self) -> u128 {
        self.start.elapsed().as_millis()
    }

    pub fn note(&self, line: String) {
        let line = format!("+{:>6} ms  {line}", self.ms());
        self.lines.lock().unwrap().push(line);
    }

    pub fn name(&self, addr: &str) -> String {
        let addr = addr.rsplit(", ").next().unwrap_or(addr);
        self.names
            .iter()
            .find(|(a, _)| a.to_string() == addr)
            .map_or_else(|| addr.to_owned(), |(_, n)| (*n).to_owned())
    }

    pub fn names(&self, addrs: &[SocketAddr]) -> String {
        let names: Vec<String> = addrs.iter().map(|a| self.name(&a.to_string())).collect();
        names.join(" and ")
    }

    pub fn text(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}
