//! Keeping every cell of a sliding-window cache. llama.cpp writes a new token over any cell
//! that fell out of its sequence's window (whatever the cache's size), as long as only one
//! sequence holds it: a prompt that changed in its middle then cannot be reused past the
//! change, since the span evaluated there needs the window before it, and a sequence can lose
//! cells anywhere in its past, not only its oldest. With `--reuse-after-change` on a model
//! with a sliding window and the full-size window cache, the context gets one more sequence,
//! the guard, which is made to hold every other sequence's cells before a batch or state is
//! placed, wherever cells were dropped, moved or restored since or half a window of tokens was
//! placed: no cell is then held by one sequence alone when llama.cpp looks for room, and it
//! writes only into empty cells, as for a model without a window. The guard is emptied first
//! each time, so a cell the other sequences dropped is let go before anything else is placed.

use super::Decoder;

/// The guard sequence and when it must next hold the other sequences' cells again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WindowGuard {
    /// The guard's own sequence: the context's last; every sequence before it is guarded.
    seq: i32,
    /// Tokens placed after which the guard holds the cells again: half the window. A cell
    /// placed since the last time falls out of its sequence's window only after a window's
    /// worth of that sequence's tokens (a batch is placed one micro-batch a call).
    every: usize,
    /// Tokens placed since the guard last took the cells.
    placed: usize,
    /// Whether cells were dropped, moved or restored since: the guard must let go of the
    /// dropped ones (it would keep them on its own) before anything else is placed.
    dropped: bool,
}

impl WindowGuard {
    /// A guard on sequence `seq` for a window of `n_swa` positions.
    pub(crate) fn new(seq: i32, n_swa: u32) -> Self {
        Self { seq, every: (n_swa as usize / 2).max(1), placed: 0, dropped: true }
    }
}

impl Decoder<'_> {
    /// Before `placing` tokens' cells are placed: makes the guard hold exactly the cells the
    /// other sequences hold now where it is due ([`WindowGuard`]); nothing without a guard.
    /// `usize::MAX` for a state or a media whose cells are not counted: the guard takes the
    /// cells now and again before the next placement.
    pub(super) fn guard_before(&mut self, placing: usize) {
        let Self::Plain(ctx, Some(guard)) = self else { return };
        if guard.dropped || guard.placed.saturating_add(placing) >= guard.every {
            if ctx.kv_cache_seq_rm(guard.seq, None, None).is_err() {
                tracing::warn!("llama.cpp did not empty the window guard's sequence");
            }
            for seq in 0..guard.seq {
                if ctx.kv_cache_seq_cp(seq, guard.seq, None, None).is_err() {
                    tracing::warn!(seq, "llama.cpp did not share a sequence's cells with the window guard");
                }
            }
            guard.placed = 0;
            guard.dropped = false;
        }
        guard.placed = guard.placed.saturating_add(placing);
    }

    /// Cells were dropped, moved or written by a restore: the guard takes the cells again
    /// before the next placement.
    pub(super) fn guard_dropped(&mut self) {
        if let Self::Plain(_, Some(guard)) = self {
            guard.dropped = true;
        }
    }

    /// Whether a guard keeps every cell of the sliding window.
    pub(crate) fn guards_window(&self) -> bool {
        matches!(self, Self::Plain(_, Some(_)))
    }
}
