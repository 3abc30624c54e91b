//! The buffers of rebuilt windows, reused: a window goes to hyper and the
//! cache writer as slices of one `Bytes`, and its buffer comes back here
//! when the last slice is dropped. Only the buffers' reuse lives here; what
//! goes into them is the worker's business.
//!
//! Main item: [`WindowPool`].

use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Buffers of rebuilt windows, handed to hyper and the cache writer by
/// value (as slices of one `Bytes`) and back here once the last slice of
/// one is dropped, so that a window costs neither a copy nor, for a large
/// body, a fresh allocation's page faults. A slice waiting in a channel
/// keeps its whole window alive: the queues hold a few slices, so at most
/// about three windows are out at a time.
#[derive(Clone, Default)]
pub(super) struct WindowPool(Arc<Mutex<Vec<Vec<u8>>>>);

/// Free buffers a pool keeps; more are freed.
const POOL_KEEP: usize = 2;

impl WindowPool {
    /// A buffer for the decoder's next window (empty; any capacity).
    pub(super) fn take(&self) -> Vec<u8> {
        self.0
            .lock()
            .expect("the pool lock is never held across a panic")
            .pop()
            .unwrap_or_default()
    }

    /// Frees the buffers kept for reuse.
    pub(super) fn clear(&self) {
        self.0
            .lock()
            .expect("the pool lock is never held across a panic")
            .clear();
    }

    /// `window`'s bytes as a `Bytes` that returns its buffer to the pool.
    pub(super) fn share(&self, window: Vec<u8>) -> Bytes {
        Bytes::from_owner(PooledWindow {
            window,
            pool: self.clone(),
        })
    }
}

/// A window's buffer on its way to hyper.
struct PooledWindow {
    window: Vec<u8>,
    pool: WindowPool,
}

impl AsRef<[u8]> for PooledWindow {
    fn as_ref(&self) -> &[u8] {
        &self.window
    }
}

impl Drop for PooledWindow {
    fn drop(&mut self) {
        let mut window = std::mem::take(&mut self.window);
        window.clear();
        let mut free = self
            .pool
            .0
            .lock()
            .expect("the pool lock is never held across a panic");
        if free.len() < POOL_KEEP {
            free.push(window);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window's buffer comes back to the pool when the last slice of it
    /// is dropped, wherever that is; the pool keeps two at most.
    #[test]
    fn window_buffers_come_back_when_their_last_slice_is_dropped() {
        let pool = WindowPool::default();
        let mut window = pool.take();
        assert_eq!(window.capacity(), 0, "an empty pool gives a new buffer");
        window.extend_from_slice(&[7; 1000]);
        let pointer = window.as_ptr();
        let shared = pool.share(window);
        let slice = shared.slice(200..300);
        drop(shared);
        let sent = std::thread::spawn(move || slice.to_vec()).join().unwrap();
        assert_eq!(sent, [7; 100]);
        let again = pool.take();
        assert!(again.is_empty());
        assert_eq!(again.as_ptr(), pointer, "the same allocation, reused");
        assert!(again.capacity() >= 1000);

        let held: Vec<Bytes> = (0..4).map(|_| pool.share(vec![1; 10])).collect();
        drop(held);
        let kept = pool.0.lock().unwrap().len();
        assert_eq!(kept, POOL_KEEP);
    }
}
