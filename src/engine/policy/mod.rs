//! The cache policy: every decision about what the KV cache keeps, saves, restores and forgets,
//! made from token lists alone. No llama.cpp and no I/O here: the live sequence
//! ([`super::sequence`]) and the disk cache execute what these functions decide, and report
//! back what failed (a file refused on reading, a state llama.cpp did not take), so the plan is
//! made again without it.
//!
//! - [`plan_prompt`]: for an incoming prompt, where its cached prefix comes from (the live
//!   sequence, a RAM entry, a disk file), how many of its tokens that spares, whether the live
//!   sequence is saved before it is displaced or forgotten, and why no more was served.
//! - [`plan_evaluation`]: how far a prompt is evaluated and where checkpoints are taken: on a
//!   model whose cache cannot be cut, a partial transcript stops before its unstable end.
//! - [`same_conversation`]: whether a live sequence is an older form of a conversation that was
//!   shortened by its oldest turns (nothing will continue it).
//! - [`RestoreCosts`]: when a file is worth reading rather than prefilling what it holds.
//! - [`plan_changes`]: a prompt that changed in short spans (a clock line) keeps what follows
//!   them, an approximation used only where asked ([`ChangeRules`]).
//! - [`reply_cut`] and [`reply_checkpoint_due`]: a next turn that cuts the reply (barge-in),
//!   and the checkpoints inside a reply that serve it where the live cache cannot be cut.

use llama_cpp_2::token::LlamaToken;

use super::prefix::{common_prefix_len, plan_reuse, window_covers};
use super::store::usable;
use super::CacheMiss;

mod change;
mod reply;
#[cfg(test)]
mod tests;

pub use change::ChangeRules;
pub(crate) use change::{plan_changes, served_past_changes, ChangePlan, ChangedSpan};
pub(crate) use reply::{reply_checkpoint_due, reply_cut, Cut};

/// How many more prompt tokens a RAM entry must spare than the live sequence before it is
/// restored: a restore copies the whole state (a few ms for thousands of tokens of a small
/// model), which a handful of prefilled tokens would cost as well. Disk files have a margin of
/// their own, from measured costs ([`RestoreCosts`]), never below this one.
pub(crate) const RAM_RESTORE_MARGIN: usize = 32;

/// How far before its last reply a prompt may leave the live sequence and still be taken for
/// that conversation's next turn: a template may render the answered assistant turn's opening
/// differently from the generation prompt (DeepSeek-R1's `<think>\n` is in the generation
/// prompt, not in the history), so the next turn can part a token or two before the reply
/// began. Another conversation parts at least a whole user turn before it: its header, its
/// text and the generation prompt, more than this in every template.
pub(crate) const NEXT_TURN_SLACK: usize = 4;

/// Tokens of a displaced live sequence looked for in a shortened conversation's full token list.
const SAME_CONVERSATION_PROBE: usize = 64;

/// What the model's cache can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CacheShape {
    /// Recurrent state (Mamba, the recurrent layers of hybrid models): the cache can be cut
    /// only within the last batch's snapshots.
    pub(crate) recurrent: bool,
    /// The sliding window llama.cpp applies, for models with one.
    pub(crate) n_swa: Option<u32>,
}

impl CacheShape {
    /// Whether a restored state can only be continued from its end (recurrent state cannot be
    /// cut after a restore; a restored sliding window holds only its last positions).
    pub(crate) fn whole_only(self) -> bool {
        self.recurrent || self.n_swa.is_some()
    }
}

/// The live sequence, as the policy sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LiveView<'a> {
    /// The tokens the cache holds, position by position.
    pub(crate) tokens: &'a [LlamaToken],
    /// How many of the last positions the cache can drop now (recurrent models).
    pub(crate) rewindable: usize,
    /// The smallest position the cache still holds (negative when it holds none).
    pub(crate) pos_min: i32,
    /// Where the reply generated after the last prompt begins (that prompt's length), when
    /// the live sequence holds one.
    pub(crate) reply_start: Option<usize>,
}

/// A stored state (a RAM entry or a written disk file), as the policy sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StoredView<'a> {
    /// Its index in its store.
    pub(crate) index: usize,
    /// The tokens its state holds.
    pub(crate) tokens: &'a [LlamaToken],
    /// Its size.
    pub(crate) bytes: usize,
    /// Larger is more recently used.
    pub(crate) last_used: u64,
}

/// The stores the policy can restore from.
#[derive(Clone, Debug, Default)]
pub(crate) struct Stores<'a> {
    /// The RAM store's entries; `None` when the store is off.
    pub(crate) ram: Option<Vec<StoredView<'a>>>,
    /// Token lists of the RAM entries evicted last (to explain a miss).
    pub(crate) evicted: Vec<&'a [LlamaToken]>,
    /// The disk cache's written files (none without a disk cache).
    pub(crate) disk: Vec<StoredView<'a>>,
}

/// How an incoming prompt came to be.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Derivation<'a> {
    /// As the request sent it.
    AsSent,
    /// A chat shortened by its oldest turns to fit the context; `full` is the whole
    /// conversation's token list.
    Shortened {
        /// The conversation before its oldest turns were left out.
        full: &'a [LlamaToken],
    },
}

/// The engine's settings the plan follows.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rules {
    /// Shortest sequence worth saving.
    pub(crate) min_save: usize,
    /// Cost of a disk restore against prefilling.
    pub(crate) costs: RestoreCosts,
    /// Where the prompt accepts a reuse past short changed spans and the cache can carry one
    /// out: its limits. Stored entries are then also weighed by what they serve past changes.
    pub(crate) changes: Option<ChangeRules>,
}

/// Where a prompt's cached prefix comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// The live sequence, cut to what the prompt shares with it (emptied when that is nothing).
    Live,
    /// The RAM store's entry at this index.
    Ram(usize),
    /// The disk cache's file at this index.
    Disk(usize),
}

/// What to do for one prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Where the cached prefix comes from.
    pub(crate) source: Source,
    /// Prompt tokens the cache holds once the plan is carried out; the rest is evaluated.
    pub(crate) keep: usize,
    /// Save the live sequence to the RAM store first: it loses much of what it holds, and a
    /// later prompt may continue it.
    pub(crate) save_live: bool,
    /// The first prompt position that differs from what the source held; `None` where the
    /// prompt continues all of it.
    pub(crate) diverged_at: Option<usize>,
    /// What kept the cache from serving more, when something did.
    pub(crate) obstacle: Option<CacheMiss>,
    /// The restored entry is reused past the prompt's changed spans ([`plan_changes`]), not
    /// only up to where they part; `keep` counts what that serves.
    pub(crate) past_changes: bool,
}

/// Decides where `prompt`'s cached prefix comes from, given the live sequence and the stores.
///
/// A stored entry is restored only when it spares more prompt tokens than the live sequence by
/// its store's margin, and only for the prefix it shares with the prompt (all of it, where the
/// model's cache cannot be cut after a restore). The live sequence is saved before it is
/// displaced when it holds at least `min_save` tokens and loses enough of them
/// ([`least_loss_saved`]), unless it is an older form of the same conversation shortened by its
/// oldest turns, which nothing continues.
pub(crate) fn plan_prompt(
    shape: CacheShape,
    live: LiveView<'_>,
    stores: &Stores<'_>,
    prompt: &[LlamaToken],
    derivation: Derivation<'_>,
    rules: Rules,
) -> Plan {
    let (live_keep, live_obstacle) = live_reusable(shape, live, prompt);
    let whole_only = shape.whole_only();
    let ram_worth = live_keep + RAM_RESTORE_MARGIN;
    let ram =
        stores.ram.as_deref().and_then(|ram| best_entry(ram, prompt, whole_only, |_, reusable| reusable >= ram_worth));
    let disk_base = ram.map_or(live_keep, |(_, reusable)| reusable);
    let disk = best_entry(&stores.disk, prompt, whole_only, |entry, reusable| {
        reusable >= disk_base + rules.costs.disk_margin(entry.bytes)
    });
    let restore = disk
        .map(|(entry, reusable)| (Source::Disk(entry.index), entry, reusable))
        .or(ram.map(|(entry, reusable)| (Source::Ram(entry.index), entry, reusable)));

    let forgotten = match derivation {
        Derivation::Shortened { full } => same_conversation(live.tokens, prompt, full),
        Derivation::AsSent => false,
    };
    // The live sequence is saved when it holds enough and loses enough, keeping `kept`.
    let save_live = |kept: usize| {
        stores.ram.is_some()
            && !forgotten
            && live.tokens.len() >= rules.min_save
            && live.tokens.len() - kept >= least_loss_saved(live, prompt, rules)
    };

    let exact_best = restore.map_or(live_keep, |(_, _, reusable)| reusable);
    let past_changes = rules.changes.filter(|_| !whole_only).and_then(|changes| {
        let live_served = served_past_changes(live.tokens, prompt, changes);
        stored_past_changes(stores, prompt, changes, exact_best.max(live_served), rules.costs)
    });
    if let Some((source, entry, served)) = past_changes {
        return Plan {
            source,
            keep: served,
            save_live: save_live(0),
            diverged_at: divergence(entry.tokens, prompt),
            // Said once it is carried out.
            obstacle: None,
            past_changes: true,
        };
    }

    let kept = if restore.is_some() { 0 } else { live_keep };
    match restore {
        Some((source, entry, reusable)) => Plan {
            source,
            keep: reusable,
            save_live: save_live(kept),
            diverged_at: divergence(entry.tokens, prompt),
            obstacle: None,
            past_changes: false,
        },
        None => {
            let cold = live.tokens.is_empty();
            let mut obstacle = if cold { Some(CacheMiss::Cold) } else { live_obstacle };
            if let Some(missed) = store_miss(shape, stores, prompt, ram_worth) {
                obstacle = Some(missed);
            }
            Plan {
                source: Source::Live,
                keep: live_keep,
                save_live: save_live(kept),
                diverged_at: divergence(live.tokens, prompt),
                obstacle,
                past_changes: false,
            }
        }
    }
}

/// The stored entry (a disk file before a RAM entry, as for exact reuse) that serves the most
/// of `prompt` past its short changed spans, when that beats `base` (what the live sequence or
/// an exact restore serves) by its store's margin: a conversation another one displaced, whose
/// clock line moved meanwhile.
fn stored_past_changes<'a>(
    stores: &Stores<'a>,
    prompt: &[LlamaToken],
    changes: ChangeRules,
    base: usize,
    costs: RestoreCosts,
) -> Option<(Source, StoredView<'a>, usize)> {
    let best = |entries: &[StoredView<'a>], worth: &dyn Fn(&StoredView<'a>) -> usize| {
        (entries.iter())
            .map(|entry| (*entry, served_past_changes(entry.tokens, prompt, changes)))
            .filter(|(entry, served)| *served > 0 && *served >= worth(entry))
            .max_by_key(|(entry, served)| (*served, entry.last_used))
    };
    let ram = stores.ram.as_deref().and_then(|ram| best(ram, &|_| base + RAM_RESTORE_MARGIN));
    let disk_base = ram.map_or(base, |(_, served)| served);
    let disk = best(&stores.disk, &|entry| disk_base + costs.disk_margin(entry.bytes));
    disk.map(|(entry, served)| (Source::Disk(entry.index), entry, served))
        .or(ram.map(|(entry, served)| (Source::Ram(entry.index), entry, served)))
}

/// The fewest tokens a displaced live sequence must lose to be saved. A prompt that leaves it
/// before its last reply began (by more than [`NEXT_TURN_SLACK`]) is another conversation, or
/// an earlier turn edited: the displaced one may come back, and saving it pays once the loss
/// outweighs copying its state out and back ([`RestoreCosts::switch_margin`], never under the
/// RAM margin) — two conversations that share a long system prompt each lose only their own
/// turns. A prompt that leaves it inside or at the reply (the next turn, a barge-in's cut)
/// moves the same conversation on: only a loss of `min_save` is kept, so a cut reply tail does
/// not cost a copy on the way to the first token.
pub(crate) fn least_loss_saved(live: LiveView<'_>, prompt: &[LlamaToken], rules: Rules) -> usize {
    let parted = common_prefix_len(live.tokens, prompt);
    let another = live.reply_start.is_some_and(|start| parted + NEXT_TURN_SLACK < start);
    if another {
        rules.min_save.min(rules.costs.switch_margin(live.tokens.len()))
    } else {
        rules.min_save
    }
}

/// The masked attention sequence 0's evaluation may spend on kept conversations' cells, in
/// evaluated tokens × cells kept beside them (not shared with sequence 0). llama.cpp's attention
/// runs over every used cell of the unified cache, masked or not, so kept cells slow every
/// evaluation: measured on SmolLM2 with 2 threads, 0.14–0.2 µs per token and kept cell, a
/// 4,100-token prompt 15–28% slower beside one to three other 4,100-token conversations
/// (docs/benchmarks.md, "Kept cells cost long evaluations"). This budget is about 0.2 s of it
/// there; a turn of a few dozen tokens keeps thousands of kept cells well inside it.
pub(crate) const KEPT_ATTENTION_BUDGET: usize = 1 << 20;

/// Whether kept conversations holding `kept_cells` cells of their own cost sequence 0's
/// evaluation of `evaluate` tokens more than [`KEPT_ATTENTION_BUDGET`]: then those the RAM
/// store holds a copy of are dropped first (a restore, should they come back, costs
/// milliseconds).
pub(crate) fn kept_cost_too_much(evaluate: usize, kept_cells: usize) -> bool {
    evaluate.saturating_mul(kept_cells) > KEPT_ATTENTION_BUDGET
}

/// How many of the `common` tokens a prompt shares with a live sequence holding `held` tokens
/// a lane can take from it by sharing its cells (`seq_cp`): all of them, except where the
/// model keeps a recurrent state, which is the sequence's whole history (llama.cpp shares the
/// state as it is, whatever positions are asked): then only a sequence that holds nothing
/// more than the prefix gives it.
pub(crate) fn lane_shareable(shape: CacheShape, held: usize, common: usize) -> usize {
    if shape.recurrent && common < held {
        0
    } else {
        common
    }
}

/// Whether a lane restores a stored state serving `stored` prompt tokens rather than share
/// the `live` tokens a live sequence holds: a restore copies the state's bytes in, so it must
/// save at least [`RAM_RESTORE_MARGIN`] tokens of prefill over sharing, which copies nothing.
pub(crate) fn restore_for_lane(live: usize, stored: usize) -> bool {
    stored >= live + RAM_RESTORE_MARGIN
}

/// The entry that lets `prompt` skip the most tokens among those `qualifies` accepts (the most
/// recently used among equals), with how many: only the prefix it shares, and with
/// `whole_only`, only an entry the prompt continues in full.
pub(crate) fn best_entry<'a>(
    entries: &[StoredView<'a>],
    prompt: &[LlamaToken],
    whole_only: bool,
    qualifies: impl Fn(&StoredView<'a>, usize) -> bool,
) -> Option<(StoredView<'a>, usize)> {
    entries
        .iter()
        .map(|entry| (*entry, usable(entry.tokens, prompt, whole_only)))
        .filter(|(entry, reusable)| *reusable > 0 && qualifies(entry, *reusable))
        .max_by_key(|(entry, reusable)| (*reusable, entry.last_used))
}

/// The most tokens of `prompt` one of `evicted` would have let it skip.
pub(crate) fn evicted_reusable(evicted: &[&[LlamaToken]], prompt: &[LlamaToken], whole_only: bool) -> usize {
    evicted.iter().map(|tokens| usable(tokens, prompt, whole_only)).max().unwrap_or(0)
}

/// How much of the live sequence `prompt` can reuse, and what stopped it from reusing all they
/// share: the sliding window no longer holds what the prefix needs, or recurrent state cannot
/// be rolled back that far.
pub(crate) fn live_reusable(
    shape: CacheShape,
    live: LiveView<'_>,
    prompt: &[LlamaToken],
) -> (usize, Option<CacheMiss>) {
    let keep = plan_reuse(live.tokens, prompt);
    if keep > 0 && !window_covers(live.pos_min, keep, shape.n_swa) {
        return (0, Some(CacheMiss::SwaWindow));
    }
    if keep > 0 && !can_cut(shape, live, keep) {
        return (0, Some(CacheMiss::CannotRewind));
    }
    (keep, None)
}

/// Whether the live cache can drop every position from `keep` on.
pub(crate) fn can_cut(shape: CacheShape, live: LiveView<'_>, keep: usize) -> bool {
    !shape.recurrent || live.tokens.len().saturating_sub(keep) <= live.rewindable
}

/// Why no RAM entry served `prompt` though one shares at least `worth` tokens with it: it was
/// evicted, or the prompt leaves it early and a restored state cannot be cut there.
fn store_miss(shape: CacheShape, stores: &Stores<'_>, prompt: &[LlamaToken], worth: usize) -> Option<CacheMiss> {
    let ram = stores.ram.as_deref()?;
    if evicted_reusable(&stores.evicted, prompt, shape.whole_only()) >= worth {
        return Some(CacheMiss::Evicted);
    }
    let shared = ram.iter().map(|entry| plan_reuse(entry.tokens, prompt)).max().unwrap_or(0);
    (shared >= worth).then_some(if shape.recurrent { CacheMiss::CannotRewind } else { CacheMiss::SwaWindow })
}

/// Where `prompt` departs from `held`; `None` where it continues all of it.
pub(crate) fn divergence(held: &[LlamaToken], prompt: &[LlamaToken]) -> Option<usize> {
    let common = common_prefix_len(held, prompt);
    (common < held.len()).then_some(common)
}

/// Whether `live` is an older form of the conversation `full` that `prompt` shortened by its
/// oldest turns: what `live` holds past the prefix it shares with `prompt` (the turns the
/// prompt left out, or the start of the turns it kept) is found in `full`. Another
/// conversation's turns are not, and it is kept for its next turn.
pub(crate) fn same_conversation(live: &[LlamaToken], prompt: &[LlamaToken], full: &[LlamaToken]) -> bool {
    let shared = common_prefix_len(live, prompt);
    let rest = &live[shared..];
    if rest.is_empty() {
        return true;
    }
    let probe = &rest[..rest.len().min(SAME_CONVERSATION_PROBE)];
    full.len() >= probe.len() && full.windows(probe.len()).any(|window| window == probe)
}

/// What an evaluation is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// A request that generates after its prompt.
    Reply,
    /// A partial transcript sent ahead of the request (`/v1/prefill`): the next partial, or
    /// the request, continues it with more words.
    Partial,
    /// A prompt evaluated for later requests to start from (`--warm`).
    Warm,
}

/// Positions in a prompt's tokens that a partial transcript's plan needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PartialMarks {
    /// Where the newest turn's text starts: what comes before is the same in every partial of
    /// this turn.
    pub(crate) opening: Option<usize>,
    /// Where the newest message's last word starts: the next partial may change that word, and
    /// what the template writes after it (the turn's end, the generation prompt) comes later.
    pub(crate) stable: Option<usize>,
}

/// How far a prompt is evaluated and where its checkpoints are taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EvaluationPlan {
    /// Evaluate the prompt up to this many tokens (from what the cache holds).
    pub(crate) evaluate_to: usize,
    /// Take a checkpoint when the cache holds this many tokens, on the way.
    pub(crate) checkpoint_at: Option<usize>,
    /// Take a checkpoint of the evaluated prompt once the first token is out.
    pub(crate) checkpoint_end: bool,
}

/// How far `prompt_len` tokens are evaluated after the `keep` the cache holds, and where
/// checkpoints are taken (`checkpoints`: the model takes them at all).
///
/// A reply or a warm prompt is evaluated in full and checkpointed at its end. A partial
/// transcript on a model whose cache cannot be cut stops before its last word: the next
/// partial, and the request, continue the cache there instead of diverging at the generation
/// prompt; it is checkpointed once per turn, where the turn opens (a revised earlier word
/// goes back there), never at its end.
pub(crate) fn plan_evaluation(
    shape: CacheShape,
    checkpoints: bool,
    purpose: Purpose,
    prompt_len: usize,
    keep: usize,
    marks: PartialMarks,
    min_save: usize,
) -> EvaluationPlan {
    let worth = |at: usize| checkpoints && at >= min_save;
    match purpose {
        Purpose::Reply | Purpose::Warm => {
            EvaluationPlan { evaluate_to: prompt_len, checkpoint_at: None, checkpoint_end: worth(prompt_len) }
        }
        Purpose::Partial if !shape.recurrent => {
            EvaluationPlan { evaluate_to: prompt_len, checkpoint_at: None, checkpoint_end: false }
        }
        Purpose::Partial => {
            let evaluate_to = marks.stable.unwrap_or(prompt_len).clamp(keep, prompt_len);
            let checkpoint_at = marks.opening.filter(|&at| at > keep && at <= evaluate_to && worth(at));
            EvaluationPlan { evaluate_to, checkpoint_at, checkpoint_end: false }
        }
    }
}

/// Measured costs that decide when a disk file is worth reading (reading, verifying and
/// restoring a file against prefilling the tokens it holds) and when a displaced conversation
/// is worth copying to RAM ([`RestoreCosts::switch_margin`]). Starts from conservative guesses
/// and follows the engine's own measurements (at load and at each save, restore or prefill).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RestoreCosts {
    /// Seconds to read, verify and restore one MiB of a file.
    pub(crate) disk_secs_per_mib: f64,
    /// Seconds to prefill one prompt token.
    pub(crate) prefill_secs_per_token: f64,
    /// Seconds to copy one MiB of state to or from the RAM store (a save or a restore).
    ram_secs_per_mib: f64,
    /// Bytes of state per token held, as the saves measured it.
    bytes_per_token: f64,
    /// Whether each figure is measured yet (the first measurement replaces the guess): disk,
    /// prefill, RAM copies.
    measured: (bool, bool, bool),
}

impl Default for RestoreCosts {
    /// Guesses until measured: 2 ms per MiB (a fast SSD and the checksum), 1 ms per token; no
    /// guess for RAM copies (the switch margin is the RAM margin until one is measured).
    fn default() -> Self {
        Self {
            disk_secs_per_mib: 0.002,
            prefill_secs_per_token: 0.001,
            ram_secs_per_mib: 0.0,
            bytes_per_token: 0.0,
            measured: (false, false, false),
        }
    }
}

impl RestoreCosts {
    /// Weight of the newest measurement in the running averages.
    const NEWEST_WEIGHT: f64 = 0.3;

    /// How many more prompt tokens a file of `bytes` must spare than the alternative to be
    /// worth reading: the tokens that could be prefilled in the time the restore takes, never
    /// fewer than the RAM margin.
    pub(crate) fn disk_margin(&self, bytes: usize) -> usize {
        let restore_secs = self.disk_secs_per_mib * bytes as f64 / f64::from(1u32 << 20);
        let tokens = (restore_secs / self.prefill_secs_per_token.max(1e-9)).ceil();
        (tokens.min(1e9) as usize).max(RAM_RESTORE_MARGIN)
    }

    /// The fewest tokens a conversation another one displaces must lose for saving it to pay:
    /// the tokens that could be prefilled in the time its state of `tokens` takes to copy out
    /// now and back in later, never fewer than the RAM margin. On a CPU a small model's copy
    /// costs a few prompt tokens (the margin); on a GPU a large model's state can take longer to
    /// copy than a few hundred tokens take to prefill.
    pub(crate) fn switch_margin(&self, tokens: usize) -> usize {
        if !self.measured.2 {
            return RAM_RESTORE_MARGIN;
        }
        let mib = self.bytes_per_token * tokens as f64 / f64::from(1u32 << 20);
        let copy_secs = 2.0 * self.ram_secs_per_mib * mib;
        let tokens = (copy_secs / self.prefill_secs_per_token.max(1e-9)).ceil();
        (tokens.min(1e9) as usize).max(RAM_RESTORE_MARGIN)
    }

    /// Records a copy of a RAM state of `bytes` holding `tokens` (a save or a restore) that
    /// took `secs`.
    pub(crate) fn record_ram(&mut self, bytes: usize, tokens: usize, secs: f64) {
        if bytes >= 1 << 20 && tokens > 0 && secs.is_finite() && secs > 0.0 {
            let per_mib = secs / (bytes as f64 / f64::from(1u32 << 20));
            let per_token = bytes as f64 / tokens as f64;
            let first = !self.measured.2;
            self.ram_secs_per_mib = average(self.ram_secs_per_mib, per_mib, &mut self.measured.2);
            self.bytes_per_token = if first { per_token } else { blend(self.bytes_per_token, per_token) };
        }
    }

    /// Records a disk restore of `bytes` that took `secs`.
    pub(crate) fn record_disk(&mut self, bytes: usize, secs: f64) {
        if bytes >= 1 << 20 && secs.is_finite() && secs > 0.0 {
            let per_mib = secs / (bytes as f64 / f64::from(1u32 << 20));
            self.disk_secs_per_mib = average(self.disk_secs_per_mib, per_mib, &mut self.measured.0);
        }
    }

    /// Records a prefill of `tokens` that took `secs` (short ones say little: skipped).
    pub(crate) fn record_prefill(&mut self, tokens: usize, secs: f64) {
        if tokens >= 64 && secs.is_finite() && secs > 0.0 {
            let per_token = secs / tokens as f64;
            self.prefill_secs_per_token = average(self.prefill_secs_per_token, per_token, &mut self.measured.1);
        }
    }
}

/// A running average of `old` and `new`; the first measurement replaces the guess.
fn average(old: f64, new: f64, measured: &mut bool) -> f64 {
    if !std::mem::replace(measured, true) {
        return new;
    }
    blend(old, new)
}

/// `old` moved toward `new` by the newest measurement's weight.
fn blend(old: f64, new: f64) -> f64 {
    old * (1.0 - RestoreCosts::NEWEST_WEIGHT) + new * RestoreCosts::NEWEST_WEIGHT
}
