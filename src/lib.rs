pub mod id;
pub mod jsonrpc;
pub mod sse;
pub mod store;
pub mod stream;
pub mod token;
