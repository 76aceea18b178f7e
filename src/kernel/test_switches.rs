//! The tests' process-wide switches (`*_TEST` atomics: the dense route, node blocks, waves,
//! tiles, the symmetric and first-layer routes) are read on the worker threads, so a test
//! that flips one would change the route of another test's kernel halfway through it. A test
//! that flips them holds [`exclusive`] for its whole run; every [`crate::kernel::compute`] in a
//! test build holds [`shared`] (re-entrant on its thread, as `compute` calls itself per layer),
//! so no kernel runs while a switch is flipped but the flipping test's own.

use std::cell::Cell;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static LOCK: RwLock<()> = RwLock::new(());

thread_local! {
    /// This thread's hold: 0 none, 1 shared (with a depth below), 2 exclusive.
    static HOLD: Cell<(u8, usize)> = const { Cell::new((0, 0)) };
}

/// The exclusive hold of a test that flips switches; released when dropped.
pub(crate) struct Exclusive(#[allow(dead_code)] RwLockWriteGuard<'static, ()>);

impl Drop for Exclusive {
    fn drop(&mut self) {
        HOLD.with(|h| h.set((0, 0)));
    }
}

/// Holds the switches exclusively (a panicking holder's poison is ignored: the switches are
/// set back by each test before it checks anything).
pub(crate) fn exclusive() -> Exclusive {
    let guard = LOCK.write().unwrap_or_else(|e| e.into_inner());
    HOLD.with(|h| h.set((2, 0)));
    Exclusive(guard)
}

/// A kernel computation's shared hold; nested holds on one thread take the lock once.
pub(crate) struct Shared(#[allow(dead_code)] Option<RwLockReadGuard<'static, ()>>);

impl Drop for Shared {
    fn drop(&mut self) {
        HOLD.with(|h| {
            let (kind, depth) = h.get();
            if kind == 1 {
                h.set(if depth <= 1 { (0, 0) } else { (1, depth - 1) });
            }
        });
    }
}

/// Holds the switches shared, unless this thread already holds them.
pub(crate) fn shared() -> Shared {
    HOLD.with(|h| match h.get() {
        (2, _) => Shared(None),
        (1, depth) => {
            h.set((1, depth + 1));
            Shared(None)
        }
        _ => {
            let guard = LOCK.read().unwrap_or_else(|e| e.into_inner());
            h.set((1, 1));
            Shared(Some(guard))
        }
    })
}
