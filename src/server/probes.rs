//! The probes an orchestrator or a load balancer asks, answered before any
//! `Host`, `Origin` or credential check, and from the moment the port is
//! bound:
//!
//! - `GET /livez`: 200 while the process serves HTTP at all, start-up and
//!   drain included: failing it means "restart me".
//! - `GET /readyz`: 200 `ready`, or 503 with why not, in a word or a few:
//!   `starting` (the log is being opened and recovered), `draining` (a
//!   SIGTERM came: see `Server::drain_then_shutdown`), or what the store
//!   says ([`crate::store::Store::health`]: `log not writable: …`,
//!   `redis unreachable for 12s`). Failing it means "send new requests
//!   elsewhere", nothing more.
//!
//! `/healthz` keeps its meaning (200 unless a flush failed) and is the
//! app's: like every other path it waits for the app to be open.
//!
//! It owns the [`Gate`], the handler of every connection: it answers the
//! probes and hands everything else to the app once it is open.

use std::sync::{Arc, OnceLock};

use http::{header, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio_util::sync::CancellationToken;

use super::front_door::Handler;
use super::App;
use crate::access::Metered;
use crate::edge::origin::Peer;
use crate::reply::{self, Body};

/// The handler of every connection: the probes at once, the rest once the
/// app is open (until then it waits, as a connection in the listen queue
/// did before).
#[derive(Default)]
pub(super) struct Gate {
    app: OnceLock<Arc<App>>,
    /// Cancelled once the app is open, or could not be opened.
    settled: CancellationToken,
}

impl Gate {
    /// The app is open: requests go to it from now on.
    pub fn open(&self, app: Arc<App>) {
        let _ = self.app.set(app);
        self.settled.cancel();
    }

    /// The app could not be opened: requests that wait for it are refused.
    pub fn failed(&self) {
        self.settled.cancel();
    }

    /// What `/readyz` answers.
    fn readiness(&self) -> Result<(), String> {
        match self.app.get() {
            Some(app) => app.readiness(),
            None => Err("starting".into()),
        }
    }
}

#[async_trait::async_trait]
impl Handler for Gate {
    async fn handle(&self, req: Request<Incoming>, peer: Peer) -> Response<Metered> {
        // A probe is asked every few seconds: it is neither counted nor
        // written to the access log.
        let probe = match req.uri().path() {
            "/livez" => Some(plain(StatusCode::OK, "live")),
            "/readyz" => Some(match self.readiness() {
                Ok(()) => plain(StatusCode::OK, "ready"),
                Err(why) => plain(StatusCode::SERVICE_UNAVAILABLE, &why),
            }),
            _ => None,
        };
        if let Some(answer) = probe {
            return answer.map(Metered::unwatched);
        }
        let app = match self.app.get() {
            Some(app) => app,
            None => {
                self.settled.cancelled().await;
                match self.app.get() {
                    Some(app) => app,
                    None => {
                        let refused = plain(StatusCode::SERVICE_UNAVAILABLE, "not started");
                        return refused.map(Metered::unwatched);
                    }
                }
            }
        };
        app.handle(req, peer).await
    }
}

/// A probe's answer: one line of plain text, never cached.
fn plain(status: StatusCode, text: &str) -> Response<Body> {
    let mut res = Response::new(reply::full(format!("{text}\n")));
    *res.status_mut() = status;
    let headers = res.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}
