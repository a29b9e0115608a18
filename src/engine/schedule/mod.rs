//! The batch scheduler: what the next decode step carries when several sequences share the one
//! context, decided from plain data (what each sequence waits for, since when, and what a step
//! has been costing). No llama.cpp here: the worker builds the batch the plan names, measures
//! the step, and asks again.
//!
//! The rules, in order:
//! - **Every reply a person reads advances every step.** A sequence that streams gets its next
//!   token in every batch: batching it with other work costs little more than the step it rides
//!   on (the weights are read once per step), and a reply never stalls behind another request.
//! - **The first word first.** A prompt a person waits for (no token produced yet) is evaluated
//!   ahead of everything nobody waits for, oldest first, in chunks as large as the streaming
//!   replies allow: the step must end before the most pressed reply's reader would run out of
//!   text at the speech floor ([`Limits::min_gap`] a token, counted from its first token, so
//!   a reply that streamed ahead of speech lends a new speaker the time it banked:
//!   [`reader_due`]), judged by the measured [`StepCost`]; with nothing streaming a
//!   prompt gets the whole batch. A step is two decodes when it carries both: the replies'
//!   tokens in one, the prompt chunk in its own ([`Batch::time`]), so a reply's numbers never
//!   depend on a prompt evaluated beside it. At least [`Limits::min_chunk`] prompt tokens go into every
//!   batch while a prompt waits, so a new speaker progresses even when a step is slower than
//!   the floor allows.
//! - **Nobody's work yields.** Anticipation, parked generations, pregeneration and `--warm` (a
//!   [`Waiter::Nobody`]) go into a batch only while no person's prompt waits; their prompts are
//!   sized like a person's, so they never slow a streaming reply below the floor either.
//! - **Drafts only alone.** A reply that would verify drafted tokens gets them only when it is
//!   the only sequence with work; with others it takes one token a step, as they do.

use std::time::Duration;

#[cfg(test)]
mod tests;

/// A sequence of the shared context (llama.cpp's `seq_id`).
pub(crate) type SeqId = i32;

/// Who waits for a sequence's work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Waiter {
    /// A client waiting for its reply.
    Person,
    /// Nobody: work done ahead (anticipation, parked generations, pregeneration, `--warm`).
    Nobody,
}

/// What a sequence waits to have computed next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// Prompt tokens not evaluated yet: the sequence has produced no token.
    Prompt {
        /// Tokens left to evaluate (at least one).
        remaining: u32,
    },
    /// The next token of a reply under way.
    Token {
        /// When its last token came out (its first, when it has one only).
        last_at: Duration,
        /// Tokens it would decode in the step: one, or one plus the drafted tokens it verifies.
        wanted: u32,
        /// When its first token came out.
        first_at: Duration,
        /// Tokens it has streamed so far.
        produced: u32,
    },
}

/// One sequence with work, as the scheduler sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pending {
    /// Its sequence.
    pub(crate) seq: SeqId,
    /// Who waits for it.
    pub(crate) waiter: Waiter,
    /// Since when it has waited (a prompt: since its request was admitted); the order among
    /// prompts.
    pub(crate) since: Duration,
    /// What it waits for.
    pub(crate) need: Need,
}

/// What a decode step has been costing: a fixed part (reading the weights, the graph) and a
/// part per token in the batch. The worker keeps both from its recent steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StepCost {
    /// The cost of a step whatever it carries.
    pub(crate) per_step: Duration,
    /// What each token in the batch adds.
    pub(crate) per_token: Duration,
}

impl StepCost {
    /// The predicted time of a step carrying `tokens` tokens.
    pub(crate) fn of(self, tokens: u32) -> Duration {
        self.per_step + self.per_token * tokens
    }
}

/// The scheduler's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Most tokens in one batch (llama.cpp's `n_batch`).
    pub(crate) n_batch: u32,
    /// Longest time a streaming reply a person reads may go without a token while other work
    /// shares its steps: the speech floor (12 tokens a second is 83 ms).
    pub(crate) min_gap: Duration,
    /// Fewest prompt tokens a batch carries while a prompt waits (fewer only when the prompt
    /// has fewer left, or the replies fill the batch).
    pub(crate) min_chunk: u32,
}

/// Why a sequence is in a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Work {
    /// A chunk of its prompt.
    Prompt,
    /// Its reply's next token (and drafted ones, when it verifies a draft).
    Reply,
}

/// One sequence's part of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The sequence.
    pub(crate) seq: SeqId,
    /// What it computes.
    pub(crate) work: Work,
    /// How many tokens it puts in the batch (at least one).
    pub(crate) tokens: u32,
}

/// The next step's batch: replies first, then prompt chunks in the order they were admitted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Batch {
    /// Each sequence's part; a sequence appears at most once.
    pub(crate) entries: Vec<Entry>,
}

impl Batch {
    /// Tokens in the batch.
    #[cfg(test)]
    pub(crate) fn tokens(&self) -> u32 {
        self.entries.iter().map(|entry| entry.tokens).sum()
    }

    /// Whether nothing is to be computed.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `seq`'s part, if it has one.
    pub(crate) fn entry(&self, seq: SeqId) -> Option<&Entry> {
        self.entries.iter().find(|entry| entry.seq == seq)
    }

    /// The predicted time of the step: the replies' decode, and the prompt chunks' own decode
    /// when there are any.
    pub(crate) fn time(&self, cost: StepCost) -> Duration {
        let of = |work: Work| self.entries.iter().filter(|e| e.work == work).map(|e| e.tokens).sum::<u32>();
        let (replies, prompts) = (of(Work::Reply), of(Work::Prompt));
        let call = |tokens: u32| if tokens == 0 { Duration::ZERO } else { cost.of(tokens) };
        call(replies) + call(prompts)
    }

    /// How many other sequences' replies share the batch with `seq`.
    #[cfg(test)]
    pub(crate) fn replies_beside(&self, seq: SeqId) -> usize {
        self.entries.iter().filter(|entry| entry.seq != seq && entry.work == Work::Reply).count()
    }
}

/// When the reader of a streaming reply would run out of text if no token came: its reader
/// (a voice reading it aloud, a person reading along) takes the reply at the speech floor, one
/// token every `min_gap` from its first, so a reply that streamed ahead of that has banked the
/// difference; never sooner than `min_gap` after its last token. `None` for a prompt.
pub(crate) fn reader_due(need: Need, min_gap: Duration) -> Option<Duration> {
    match need {
        Need::Token { last_at, first_at, produced, .. } => {
            Some((last_at + min_gap).max(first_at + min_gap * produced.max(1)))
        }
        Need::Prompt { .. } => None,
    }
}

/// The batch of the next step at `now` for the sequences in `pending` (each at most once).
pub(crate) fn next_batch(now: Duration, pending: &[Pending], cost: StepCost, limits: Limits) -> Batch {
    let person_prompt_waits = pending
        .iter()
        .any(|p| p.waiter == Waiter::Person && matches!(p.need, Need::Prompt { remaining } if remaining > 0));
    let alone = pending.len() == 1;

    // Replies: a person's always, nobody's while no person's prompt waits; the longest waiting
    // first should the batch be too small for them all.
    let mut replies: Vec<(&Pending, Duration, u32)> = pending
        .iter()
        .filter(|p| p.waiter == Waiter::Person || !person_prompt_waits)
        .filter_map(|p| match p.need {
            Need::Token { last_at, wanted, .. } => Some((p, last_at, if alone { wanted.max(1) } else { 1 })),
            Need::Prompt { .. } => None,
        })
        .collect();
    replies.sort_by_key(|(p, last_at, _)| (*last_at, p.waiter == Waiter::Nobody, p.seq));
    let mut batch = Batch::default();
    let mut room = limits.n_batch;
    let mut pressed_until: Option<Duration> = None;
    for (p, last_at, wanted) in replies {
        let tokens = wanted.min(room);
        if tokens == 0 {
            break;
        }
        room -= tokens;
        batch.entries.push(Entry { seq: p.seq, work: Work::Reply, tokens });
        if p.waiter == Waiter::Person {
            let due = reader_due(p.need, limits.min_gap).unwrap_or(last_at + limits.min_gap);
            pressed_until = Some(pressed_until.map_or(due, |until| until.min(due)));
        }
    }

    // Prompts: a person's, oldest first; nobody's only when no person's waits.
    let waiter = if person_prompt_waits { Waiter::Person } else { Waiter::Nobody };
    let mut prompts: Vec<(&Pending, u32)> = pending
        .iter()
        .filter(|p| p.waiter == waiter)
        .filter_map(|p| match p.need {
            Need::Prompt { remaining } if remaining > 0 => Some((p, remaining)),
            _ => None,
        })
        .collect();
    prompts.sort_by_key(|(p, _)| (p.since, p.seq));
    let mut budget = match pressed_until {
        None => room,
        Some(until) => {
            let slack = until.saturating_sub(now);
            // The replies' decode, then the prompt chunk's own call.
            let fits = slack.saturating_sub(batch.time(cost) + cost.per_step);
            let by_time = tokens_within(fits, cost.per_token);
            by_time.max(limits.min_chunk).min(room)
        }
    };
    for (p, remaining) in prompts {
        if budget == 0 {
            break;
        }
        let tokens = remaining.min(budget);
        budget -= tokens;
        batch.entries.push(Entry { seq: p.seq, work: Work::Prompt, tokens });
    }
    batch
}

/// How many tokens fit in `time` at `per_token` each (all of them when tokens cost nothing).
fn tokens_within(time: Duration, per_token: Duration) -> u32 {
    if per_token.is_zero() {
        return u32::MAX;
    }
    u32::try_from(time.as_nanos() / per_token.as_nanos()).unwrap_or(u32::MAX)
}
