//! The answer's body as the client receives it: its bytes counted, the
//! time of its first byte taken, and its end (or its drop, when the client
//! went away first) the end of its [`Visit`].

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body::{Body as HttpBody, Frame, SizeHint};

use super::{Answered, Visit};
use crate::reply::{Body, BoxError};

/// What every connection serves: the app's body, watched when it answers a
/// visit (the probes' answers are not).
pub struct Metered {
    inner: Body,
    watch: Option<Watch>,
}

struct Watch {
    visit: Visit,
    status: StatusCode,
    first_byte: Option<Duration>,
    bytes: u64,
}

impl Metered {
    /// A body no visit waits for.
    pub fn unwatched(inner: Body) -> Self {
        Self { inner, watch: None }
    }

    /// The body of `visit`'s answer, sent with `status`.
    pub fn watched(inner: Body, visit: Visit, status: StatusCode) -> Self {
        let watch = Watch {
            visit,
            status,
            first_byte: None,
            bytes: 0,
        };
        Self {
            inner,
            watch: Some(watch),
        }
    }

    fn end(&mut self, complete: bool) {
        if let Some(watch) = self.watch.take() {
            watch.visit.ended(&Answered {
                status: watch.status,
                first_byte: watch.first_byte,
                bytes_out: watch.bytes,
                complete,
            });
        }
    }
}

impl HttpBody for Metered {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(watch), Some(data)) = (this.watch.as_mut(), frame.data_ref()) {
                    if watch.first_byte.is_none() && !data.is_empty() {
                        watch.first_byte = Some(watch.visit.since_arrival());
                    }
                    watch.bytes += data.len() as u64;
                }
            }
            Poll::Ready(None) => this.end(true),
            Poll::Ready(Some(Err(_))) => this.end(false),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        // A whole body is often written without the poll that would say
        // it ended: its drop after the last frame is that end.
        let complete = self.inner.is_end_stream();
        self.end(complete);
    }
}
