//! The feed: how a relay's reading half hands what it read to its writing
//! half, in order, at most [`DEPTH`] batches ahead of the log (backpressure
//! on the upstream: hyper reads a body only as fast as it is polled).
//!
//! Both halves are polled by the relay's one task, so the [`Queue`] lives in
//! that task's state and both ends borrow it: nothing is allocated for a
//! feed until a batch comes. It owns only the hand-over; what a batch holds
//! is the reading half's business.

use std::collections::HashSet;

use crate::jsonrpc::RequestId;
use crate::upstream::ingest::Batch;

/// Batches read ahead of the log at most.
const DEPTH: usize = 256;

/// What the reading half of a relay hands the writing half.
pub(super) enum Feed {
    /// Upstream messages; `complete` when they answer the last request.
    Messages(Batch),
    /// The upstream stream ended (for good) with these requests unanswered.
    Ended {
        pending: HashSet<RequestId>,
        why: &'static str,
    },
}

/// The queue both ends borrow.
pub(super) type Queue = crate::session::queue::Queue<Feed>;

/// The reading half's end and the writing half's. Dropping either tells the
/// other: the writer sees the end of the feed once it took what was fed,
/// the reader's next hand-over is refused.
pub(super) fn ends(queue: &Queue) -> (Feeder<'_>, Fed<'_>) {
    (Feeder(queue), Fed(queue))
}

/// The reading half's end of the feed.
pub(super) struct Feeder<'a>(&'a Queue);

impl Feeder<'_> {
    /// Hands `feed` over, once there is room; gives it back when the
    /// writing half is gone. Cancel-safe.
    pub(super) async fn send(&self, feed: Feed) -> Result<(), Feed> {
        self.0.give_when_room(feed, DEPTH).await
    }
}

impl Drop for Feeder<'_> {
    fn drop(&mut self) {
        self.0.givers_left();
    }
}

/// The writing half's end of the feed.
pub(super) struct Fed<'a>(&'a Queue);

impl Fed<'_> {
    /// The next batch, once one comes; `None` once the reading half is gone
    /// and everything it fed was taken. Cancel-safe.
    pub(super) async fn recv(&mut self) -> Option<Feed> {
        self.0.take().await
    }

    /// The next batch if one is waiting.
    pub(super) fn try_recv(&mut self) -> Option<Feed> {
        self.0.try_take()
    }
}

impl Drop for Fed<'_> {
    fn drop(&mut self) {
        self.0.taker_left();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    fn batch(text: &'static str) -> Feed {
        Feed::Messages(Batch {
            messages: vec![Bytes::from_static(text.as_bytes())],
            complete: false,
            upstream_event: None,
        })
    }

    fn text(feed: Option<Feed>) -> &'static str {
        match feed {
            Some(Feed::Messages(b)) => match b.messages[0].as_ref() {
                b"a" => "a",
                b"b" => "b",
                _ => "other",
            },
            Some(Feed::Ended { .. }) => "ended",
            None => "none",
        }
    }

    fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        f.poll(&mut Context::from_waker(Waker::noop()))
    }

    #[tokio::test]
    async fn batches_arrive_in_the_order_they_were_fed() {
        let queue = Queue::default();
        let (feeder, mut fed) = ends(&queue);
        feeder.send(batch("a")).await.ok().unwrap();
        feeder.send(batch("b")).await.ok().unwrap();
        assert_eq!(text(fed.recv().await), "a");
        assert_eq!(text(fed.try_recv()), "b");
        assert_eq!(text(fed.try_recv()), "none");
    }

    #[tokio::test]
    async fn the_feed_ends_after_the_last_batch_once_the_reader_is_gone() {
        let queue = Queue::default();
        let (feeder, mut fed) = ends(&queue);
        feeder.send(batch("a")).await.ok().unwrap();
        drop(feeder);
        assert_eq!(text(fed.recv().await), "a");
        assert_eq!(text(fed.recv().await), "none");
    }

    #[tokio::test]
    async fn a_waiting_writer_wakes_when_a_batch_comes() {
        let queue = Queue::default();
        let (feeder, mut fed) = ends(&queue);
        let mut recv = pin!(fed.recv());
        assert!(poll_once(recv.as_mut()).is_pending());
        feeder.send(batch("a")).await.ok().unwrap();
        assert_eq!(text(recv.await), "a");
    }

    #[tokio::test]
    async fn a_waiting_writer_learns_the_feed_ended_when_the_reader_leaves() {
        let queue = Queue::default();
        let (feeder, mut fed) = ends(&queue);
        let mut recv = pin!(fed.recv());
        assert!(poll_once(recv.as_mut()).is_pending());
        drop(feeder);
        // Bounds a writer nobody wakes; asserts no time.
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), recv).await;
        assert_eq!(text(ended.expect("the writer was not woken")), "none");
    }

    #[tokio::test]
    async fn a_full_feed_holds_the_reader_until_the_writer_takes_one() {
        let queue = Queue::default();
        let (feeder, mut fed) = ends(&queue);
        for _ in 0..DEPTH {
            feeder.send(batch("a")).await.ok().unwrap();
        }
        {
            let mut send = pin!(feeder.send(batch("b")));
            assert!(poll_once(send.as_mut()).is_pending());
            assert_eq!(text(fed.try_recv()), "a");
            assert!(matches!(poll_once(send.as_mut()), Poll::Ready(Ok(()))));
        }
        for _ in 1..DEPTH {
            assert_eq!(text(fed.try_recv()), "a");
        }
        assert_eq!(text(fed.try_recv()), "b");
    }

    #[tokio::test]
    async fn a_hand_over_is_refused_once_the_writer_is_gone() {
        let queue = Queue::default();
        let (feeder, fed) = ends(&queue);
        drop(fed);
        assert!(feeder.send(batch("a")).await.is_err());
    }

    #[tokio::test]
    async fn a_reader_held_by_a_full_feed_is_let_go_when_the_writer_leaves() {
        let queue = Queue::default();
        let (feeder, fed) = ends(&queue);
        for _ in 0..DEPTH {
            feeder.send(batch("a")).await.ok().unwrap();
        }
        let mut send = pin!(feeder.send(batch("b")));
        assert!(poll_once(send.as_mut()).is_pending());
        drop(fed);
        assert!(send.await.is_err());
    }

    #[tokio::test]
    async fn nothing_is_allocated_for_a_feed_nothing_was_fed_through() {
        let queue = Queue::default();
        let (_feeder, mut fed) = ends(&queue);
        assert!(fed.try_recv().is_none());
        assert_eq!(queue.capacity(), 0);
    }
}
