//! Keeping every cell of a sliding-window cache. llama.cpp writes a new token over any cell
//! that fell out of its sequence's window (whatever the cache's size), as long as only one
//! sequence holds it: a prompt that changed in its middle then cannot be reused past the
//! change, since the span evaluated there needs the window before it, and a sequence can lose
//! cells anywhere in its past, not only its oldest. With `--reuse-after-change` on a model
//! with a sliding window and the full-size window cache, the context gets one more sequence,
//! the guard, which is made to hold every other sequence's cells before each batch or state is
//! placed: no cell is then held by one sequence alone, and llama.cpp writes only into empty
//! cells, as for a model without a window. Cells the other sequences dropped since are let go
//! at the same moment (the guard is emptied first), so it never keeps a cell on its own.

use super::Decoder;

/// The sequence that holds every other sequence's cells (see the module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WindowGuard {
    /// The guard's own sequence: the context's last; every sequence before it is guarded.
    pub(crate) seq: i32,
}

impl Decoder<'_> {
    /// Makes the guard hold exactly the cells the other sequences hold now, before llama.cpp
    /// places new cells ([`WindowGuard`]); nothing without a guard.
    pub(super) fn guard_window(&mut self) {
        let Self::Plain(ctx, Some(guard)) = self else { return };
        let guard = guard.seq;
        if ctx.kv_cache_seq_rm(guard, None, None).is_err() {
            tracing::warn!("llama.cpp did not empty the window guard's sequence");
        }
        for seq in 0..guard {
            if ctx.kv_cache_seq_cp(seq, guard, None, None).is_err() {
                tracing::warn!(seq, "llama.cpp did not share a sequence's cells with the window guard");
            }
        }
    }

    /// Whether a guard keeps every cell of the sliding window.
    pub(crate) fn guards_window(&self) -> bool {
        matches!(self, Self::Plain(_, Some(_)))
    }
}
