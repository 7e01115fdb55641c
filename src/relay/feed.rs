//! The feed: how a relay's reading half hands what it read to its writing
//! half, in order, at most [`DEPTH`] batches ahead of the log (backpressure
//! on the upstream: hyper reads a body only as fast as it is polled).
//!
//! Both halves are polled by the relay's one task and share a queue that
//! lives in that task's state, so the feed allocates nothing until a batch
//! comes, and then only the queue's slots. A tokio channel allocated its
//! shared state and a 32-slot block (about 2 KiB) for every call, and kept
//! the block for as long as the stream was open — and most open streams are
//! a long call waiting in silence. It owns only the hand-over; what a batch
//! holds is the reading half's business.

use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::ingest::Batch;
use crate::jsonrpc::RequestId;

/// Batches read ahead of the log at most.
const DEPTH: usize = 256;

/// Slots an empty queue keeps: room grown in a burst (up to [`DEPTH`]
/// batches, about 16 KiB) is given back once the burst is written, while
/// a stream that keeps a few batches in flight keeps its room.
const KEPT: usize = 32;

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

/// The queue both ends borrow; see [`Queue::ends`].
#[derive(Default)]
pub(super) struct Queue {
    state: Mutex<State>,
    /// A batch came, or the reading half is gone.
    came: Notify,
    /// Room was made, or the writing half is gone.
    room: Notify,
}

#[derive(Default)]
struct State {
    batches: VecDeque<Feed>,
    feeder_gone: bool,
    fed_gone: bool,
}

impl State {
    fn take(&mut self) -> Option<Feed> {
        let feed = self.batches.pop_front()?;
        if self.batches.is_empty() && self.batches.capacity() > KEPT {
            self.batches.shrink_to(KEPT);
        }
        Some(feed)
    }
}

impl Queue {
    /// The reading half's end and the writing half's. Dropping either tells
    /// the other: the writer sees the end of the feed once it took what was
    /// fed, the reader's next hand-over is refused.
    pub(super) fn ends(&self) -> (Feeder<'_>, Fed<'_>) {
        (Feeder(self), Fed(self))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Only this task takes the lock, and a panic while holding it
        // leaves a queue that is still whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The reading half's end of the feed.
pub(super) struct Feeder<'a>(&'a Queue);

impl Feeder<'_> {
    /// Hands `feed` over, once there is room; gives it back when the
    /// writing half is gone. Cancel-safe: `feed` is queued only when this
    /// returns `Ok`.
    pub(super) async fn send(&self, feed: Feed) -> Result<(), Feed> {
        let queue = self.0;
        loop {
            // Made before looking: room made between the look and the wait
            // still wakes it (`notify_one` keeps a permit).
            let room = queue.room.notified();
            {
                let mut state = queue.state();
                if state.fed_gone {
                    return Err(feed);
                }
                if state.batches.len() < DEPTH {
                    state.batches.push_back(feed);
                    drop(state);
                    queue.came.notify_one();
                    return Ok(());
                }
            }
            room.await;
        }
    }
}

impl Drop for Feeder<'_> {
    fn drop(&mut self) {
        self.0.state().feeder_gone = true;
        self.0.came.notify_one();
    }
}

/// The writing half's end of the feed.
pub(super) struct Fed<'a>(&'a Queue);

impl Fed<'_> {
    /// The next batch, once one comes; `None` once the reading half is gone
    /// and everything it fed was taken. Cancel-safe.
    pub(super) async fn recv(&mut self) -> Option<Feed> {
        let queue = self.0;
        loop {
            let came = queue.came.notified();
            {
                let mut state = queue.state();
                if let Some(feed) = state.take() {
                    drop(state);
                    queue.room.notify_one();
                    return Some(feed);
                }
                if state.feeder_gone {
                    return None;
                }
            }
            came.await;
        }
    }

    /// The next batch if one is waiting.
    pub(super) fn try_recv(&mut self) -> Option<Feed> {
        let feed = self.0.state().take()?;
        self.0.room.notify_one();
        Some(feed)
    }
}

impl Drop for Fed<'_> {
    fn drop(&mut self) {
        self.0.state().fed_gone = true;
        self.0.room.notify_one();
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
        let (feeder, mut fed) = queue.ends();
        feeder.send(batch("a")).await.ok().unwrap();
        feeder.send(batch("b")).await.ok().unwrap();
        assert_eq!(text(fed.recv().await), "a");
        assert_eq!(text(fed.try_recv()), "b");
        assert_eq!(text(fed.try_recv()), "none");
    }

    #[tokio::test]
    async fn the_feed_ends_after_the_last_batch_once_the_reader_is_gone() {
        let queue = Queue::default();
        let (feeder, mut fed) = queue.ends();
        feeder.send(batch("a")).await.ok().unwrap();
        drop(feeder);
        assert_eq!(text(fed.recv().await), "a");
        assert_eq!(text(fed.recv().await), "none");
    }

    #[tokio::test]
    async fn a_waiting_writer_wakes_when_a_batch_comes() {
        let queue = Queue::default();
        let (feeder, mut fed) = queue.ends();
        let mut recv = pin!(fed.recv());
        assert!(poll_once(recv.as_mut()).is_pending());
        feeder.send(batch("a")).await.ok().unwrap();
        assert_eq!(text(recv.await), "a");
    }

    #[tokio::test]
    async fn a_waiting_writer_learns_the_feed_ended_when_the_reader_leaves() {
        let queue = Queue::default();
        let (feeder, mut fed) = queue.ends();
        let mut recv = pin!(fed.recv());
        assert!(poll_once(recv.as_mut()).is_pending());
        drop(feeder);
        // Bounds a writer nobody wakes; asserts no time.
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), recv).await;
        assert_eq!(text(ended.expect("the writer was not woken")), "none");
    }

    #[tokio::test]
    async fn room_grown_in_a_burst_is_given_back_once_it_is_written() {
        let queue = Queue::default();
        let (feeder, mut fed) = queue.ends();
        for _ in 0..DEPTH {
            feeder.send(batch("a")).await.ok().unwrap();
        }
        while fed.try_recv().is_some() {}
        assert!(queue.state().batches.capacity() <= KEPT);
    }

    #[tokio::test]
    async fn a_full_feed_holds_the_reader_until_the_writer_takes_one() {
        let queue = Queue::default();
        let (feeder, mut fed) = queue.ends();
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
        let (feeder, fed) = queue.ends();
        drop(fed);
        assert!(feeder.send(batch("a")).await.is_err());
    }

    #[tokio::test]
    async fn a_reader_held_by_a_full_feed_is_let_go_when_the_writer_leaves() {
        let queue = Queue::default();
        let (feeder, fed) = queue.ends();
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
        let (_feeder, mut fed) = queue.ends();
        assert!(fed.try_recv().is_none());
        assert_eq!(queue.state().batches.capacity(), 0);
    }
}
