//! What a guest writes to its stdout and stderr, kept as a bounded tail per `wasmtime::Store`: a
//! trap's reason quotes the guest's last words (a Python traceback, a JavaScript exception, a Rust
//! panic message), which otherwise show only as "wasm `unreachable` instruction executed".
//!
//! The host keeps at most [`GUEST_OUTPUT_TAIL`] bytes per instance, whatever the guest
//! writes; the tail is emptied before every call, so it holds what the failing call wrote.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

use crate::text::bounded_tail;

/// Bytes of guest output kept per instance (the end of what it wrote).
pub(crate) const GUEST_OUTPUT_TAIL: usize = 4 * 1024;
/// Most bytes a guest may hand over in one write (what `check-write` grants): bounds the
/// host's allocation per write, as WASI's own streams do.
const WRITE_PERMIT: usize = 64 * 1024;

/// The tail of one instance's stdout and stderr (both, interleaved as written). Cheap to
/// clone: every clone shares the buffer.
#[derive(Clone, Default)]
pub(crate) struct GuestOutput(Arc<Mutex<VecDeque<u8>>>);

impl GuestOutput {
    fn tail(&self) -> std::sync::MutexGuard<'_, VecDeque<u8>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn push(&self, data: &[u8]) {
        let data = &data[data.len().saturating_sub(GUEST_OUTPUT_TAIL)..];
        let mut tail = self.tail();
        tail.extend(data);
        let excess = tail.len().saturating_sub(GUEST_OUTPUT_TAIL);
        tail.drain(..excess);
    }

    /// Forgets what was written so far (before a call).
    pub(crate) fn clear(&self) {
        self.tail().clear();
    }

    /// What was written since the last [`clear`](Self::clear), as text made safe to log and
    /// store (control characters escaped, at most `max` bytes from the end); `None` if
    /// nothing but white space was written.
    pub(crate) fn text(&self, max: usize) -> Option<String> {
        let bytes: Vec<u8> = self.tail().iter().copied().collect();
        let text = String::from_utf8_lossy(&bytes);
        let text = text.trim();
        (!text.is_empty()).then(|| bounded_tail(text, max))
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

impl tokio::io::AsyncWrite for GuestOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_tail_is_kept_however_much_is_written() {
        let mut out = GuestOutput::default();
        for _ in 0..1_000 {
            out.write(Bytes::from(vec![b'x'; 1_000])).unwrap();
        }
        out.write(Bytes::from_static(b"\nKeyError: 'id'\n"))
            .unwrap();
        assert_eq!(out.tail().len(), GUEST_OUTPUT_TAIL);
        let text = out.text(GUEST_OUTPUT_TAIL).unwrap();
        assert!(text.ends_with("KeyError: 'id'"), "{text}");
        out.clear();
        assert_eq!(out.text(100), None);
    }

    #[test]
    fn control_characters_are_escaped_and_the_end_survives_a_cut() {
        let mut out = GuestOutput::default();
        out.write(Bytes::from_static(b"\x1b[31mred\0 and then the message"))
            .unwrap();
        let text = out.text(12).unwrap();
        assert!(!text.contains('\0') && !text.contains('\u{1b}'), "{text}");
        assert!(text.ends_with("the message"), "{text}");
    }
}
