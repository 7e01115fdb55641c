//! A hand-over queue for the few that an open stream keeps: one taker that
//! waits for items, givers that may be refused, bounded, and allocating
//! nothing until the first item comes (room grown in a burst is given back
//! once it is taken). Most open streams are a long call waiting in silence,
//! and a tokio channel would allocate its shared state and a 32-slot block
//! for each of them, kept for as long as the stream is open.
//!
//! Either end can leave: a giver is refused once the taker is gone, and the
//! taker learns that the givers are gone once it took what they gave. What
//! the items are — a stream's strays, a relay's feed — is the user's: this
//! module knows nothing of sessions, streams or messages.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;

/// Slots an empty queue keeps: a queue that holds a few items at a time
/// keeps its room, one that grew in a burst gives the rest back.
const KEPT: usize = 32;

pub struct Queue<T> {
    state: Mutex<State<T>>,
    /// An item came, or the givers are gone.
    came: Notify,
    /// Room was made, or the taker is gone.
    room: Notify,
}

struct State<T> {
    items: VecDeque<T>,
    givers_gone: bool,
    taker_gone: bool,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                items: VecDeque::new(),
                givers_gone: false,
                taker_gone: false,
            }),
            came: Notify::new(),
            room: Notify::new(),
        }
    }
}

impl<T> Queue<T> {
    fn state(&self) -> MutexGuard<'_, State<T>> {
        // A panic while holding the lock leaves a queue that is still whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands `item` over unless `depth` items wait already or the taker is
    /// gone; then gives it back.
    pub fn give(&self, item: T, depth: usize) -> Result<(), T> {
        {
            let mut state = self.state();
            if state.taker_gone || state.items.len() >= depth {
                return Err(item);
            }
            state.items.push_back(item);
        }
        self.came.notify_one();
        Ok(())
    }

    /// Hands `item` over once fewer than `depth` items wait; gives it back
    /// when the taker is gone. Cancel-safe: `item` is queued only when this
    /// returns `Ok`.
    pub async fn give_when_room(&self, item: T, depth: usize) -> Result<(), T> {
        let mut item = item;
        loop {
            // Made before looking: room made between the look and the wait
            // still wakes it (`notify_one` keeps a permit).
            let room = self.room.notified();
            match self.give(item, depth) {
                Ok(()) => return Ok(()),
                Err(back) if self.state().taker_gone => return Err(back),
                Err(back) => item = back,
            }
            room.await;
        }
    }

    /// The next item, once one comes; `None` once the givers are gone and
    /// everything they gave was taken. Cancel-safe: an item leaves the
    /// queue only when this returns it.
    pub async fn take(&self) -> Option<T> {
        loop {
            let came = self.came.notified();
            {
                let mut state = self.state();
                if let Some(item) = state.pop() {
                    drop(state);
                    self.room.notify_one();
                    return Some(item);
                }
                if state.givers_gone {
                    return None;
                }
            }
            came.await;
        }
    }

    /// The next item if one waits.
    pub fn try_take(&self) -> Option<T> {
        let item = self.state().pop()?;
        self.room.notify_one();
        Some(item)
    }

    /// The givers are gone: the taker gets `None` after the last item.
    pub fn givers_left(&self) {
        self.state().givers_gone = true;
        self.came.notify_one();
    }

    /// The taker is gone: givers are refused from now on.
    pub fn taker_left(&self) {
        self.state().taker_gone = true;
        self.room.notify_one();
    }

    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.state().items.capacity()
    }
}

impl<T> State<T> {
    fn pop(&mut self) -> Option<T> {
        let item = self.items.pop_front()?;
        if self.items.is_empty() && self.items.capacity() > KEPT {
            self.items.shrink_to(KEPT);
        }
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_allocated_until_an_item_comes() {
        let queue = Queue::<u32>::default();
        assert!(queue.try_take().is_none());
        assert_eq!(queue.capacity(), 0);
    }

    #[test]
    fn room_grown_in_a_burst_is_given_back_once_it_is_taken() {
        let queue = Queue::default();
        for n in 0..256 {
            queue.give(n, 256).unwrap();
        }
        while queue.try_take().is_some() {}
        assert!(queue.capacity() <= KEPT);
    }
}
