//! PLACEHOLDER (helper-3 replaces this file): the demo server over stdio.
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};

use super::upstream::DemoStats;

pub async fn serve<R, W>(_input: R, _output: W, _stats: Arc<DemoStats>) -> std::io::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    Err(std::io::Error::other("not yet"))
}
