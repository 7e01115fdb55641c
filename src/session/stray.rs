//! Strays: upstream messages that arrived on another stream of their session
//! than their own (an upstream replaying the whole session on a resume), on
//! their way to their own stream's relay.
//!
//! Every relay opens an inlet, and almost none ever receives a stray, so an
//! inlet is a [`Queue`] (nothing allocated until a stray comes), shared with
//! the session that hands strays over. It owns only the hand-over; which
//! stream a message belongs to is the relay's sorting.

use std::sync::Arc;

use bytes::Bytes;

use super::queue::Queue;

/// Strays a relay may hold unread before more are refused (the upstream is
/// replaying what the stream's own connection also brings).
const DEPTH: usize = 256;

/// An upstream message that arrived on another stream of the session than
/// its own, with the upstream's SSE event id it came with.
#[derive(Debug, Clone)]
pub struct Stray {
    pub event: Option<String>,
    pub message: Bytes,
}

/// The relay's end of an inlet: dropping it closes the inlet.
pub struct Inlet(Arc<Queue<Stray>>);

/// The session's end of an inlet, through which strays are handed over.
pub struct Outlet(Arc<Queue<Stray>>);

/// Opens an inlet: the relay reads from the first, the session hands
/// strays over through the second.
pub fn inlet() -> (Inlet, Outlet) {
    let queue = Arc::new(Queue::default());
    (Inlet(queue.clone()), Outlet(queue))
}

impl Inlet {
    /// The next stray, once one comes (never, once the session let go of
    /// the outlet). Cancel-safe: a stray is taken off the queue only when
    /// this returns it.
    pub async fn recv(&mut self) -> Stray {
        match self.0.take().await {
            Some(stray) => stray,
            None => std::future::pending().await,
        }
    }
}

impl Drop for Inlet {
    fn drop(&mut self) {
        self.0.taker_left();
    }
}

impl Outlet {
    /// Hands `stray` to the relay; `false` when it is not taken (the relay
    /// stopped reading, or it is too far behind).
    pub fn hand_over(&self, stray: Stray) -> bool {
        self.0.give(stray, DEPTH).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn stray(n: u8) -> Stray {
        Stray {
            event: Some(n.to_string()),
            message: Bytes::from(vec![n]),
        }
    }

    #[tokio::test]
    async fn strays_reach_the_relay_in_the_order_they_were_handed_over() {
        let (mut inlet, outlet) = inlet();
        for n in 0..3 {
            assert!(outlet.hand_over(stray(n)));
        }
        for n in 0..3 {
            assert_eq!(inlet.recv().await.message, Bytes::from(vec![n]));
        }
    }

    #[tokio::test]
    async fn a_relay_waiting_for_a_stray_wakes_when_one_is_handed_over() {
        let (mut inlet, outlet) = inlet();
        let waiting = tokio::spawn(async move { inlet.recv().await });
        tokio::task::yield_now().await;
        assert!(outlet.hand_over(stray(7)));
        let got = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .expect("no panic");
        assert_eq!(got.event.as_deref(), Some("7"));
    }

    #[test]
    fn a_wait_dropped_after_its_wake_up_loses_no_stray() {
        use futures_util::FutureExt;
        let (mut inlet, outlet) = inlet();
        {
            // A `select!` that picked another branch: this wait was woken
            // by the hand-over, and dropped before it took the stray.
            let mut wait = Box::pin(inlet.recv());
            assert!((&mut wait).now_or_never().is_none());
            assert!(outlet.hand_over(stray(1)));
        }
        let next = inlet.recv().now_or_never().expect("taken without a wait");
        assert_eq!(next.event.as_deref(), Some("1"));
    }

    #[test]
    fn a_relay_too_far_behind_is_handed_nothing_more() {
        let (_inlet, outlet) = inlet();
        for n in 0..DEPTH {
            assert!(outlet.hand_over(stray(n as u8)));
        }
        assert!(!outlet.hand_over(stray(0)));
    }

    #[test]
    fn a_closed_inlet_takes_nothing() {
        let (inlet, outlet) = inlet();
        drop(inlet);
        assert!(!outlet.hand_over(stray(0)));
    }
}
