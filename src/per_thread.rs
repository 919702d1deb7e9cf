//! Which worker thread this is, and state kept once per worker thread.
//!
//! The proxy's worker threads ([`crate::workers`]) each have a runtime of their own; hot state
//! that every request writes (counters, idle upstream connections) is kept per thread so it stays
//! on the core that writes it.

use std::cell::Cell;

use crossbeam_utils::CachePadded;

thread_local! {
    static HOME: Cell<usize> = const { Cell::new(0) };
}

/// The index of the worker thread this runs on, from 1; 0 on any other thread (the main runtime,
/// or every thread when the gateway serves on its caller's runtime).
pub fn home() -> usize {
    HOME.get()
}

/// Makes this thread worker thread `index` (from 1) for [`home`].
pub fn set_home(index: usize) {
    HOME.set(index);
}

/// One `T` for each worker thread and one for every other thread, each on cache lines of its
/// own: state that every request writes stays on the core of the thread that writes it, instead
/// of its lines passing between cores on every request.
pub struct PerThread<T>(Box<[CachePadded<T>]>);

impl<T> PerThread<T> {
    /// Room for `threads` worker threads (a thread whose [`home`] is past them uses the last).
    pub fn new(threads: usize, mut make: impl FnMut() -> T) -> Self {
        PerThread((0..=threads).map(|_| CachePadded::new(make())).collect())
    }

    /// The index of this thread's `T`.
    pub fn index_here(&self) -> usize {
        home().min(self.0.len() - 1)
    }

    /// This thread's `T`.
    pub fn here(&self) -> &T {
        &self.0[self.index_here()]
    }

    /// The `T` at `index` (from [`PerThread::index_here`]).
    pub fn get(&self, index: usize) -> &T {
        &self.0[index.min(self.0.len() - 1)]
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.0.iter().map(|t| &**t)
    }
}
