//! Dialects: the ways a client can come back for what it missed. Each is a thin
//! adapter over the core's append / read-after-cursor / status; logic two
//! dialects would share belongs in `stream.rs`, not here.

pub mod last_event_id;
