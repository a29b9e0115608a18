//! Adaptive draft depth: how many drafted tokens each verification step is worth.

/// How many drafted tokens to verify next. The depth follows the recent run of accepted drafts,
/// so a drafter that is often wrong costs little and one that is usually right is used deeply;
/// and speculation pauses (depth 0) while it measures slower per token than plain decoding,
/// which it does whenever drafting costs more than it saves (a draft model nearly as large as
/// the target, a tiny target). The way not taken is measured again after [`PROBE_EVERY`]
/// steps, and after twice as many each time a measurement confirms the choice (up to
/// [`MAX_PROBE_INTERVAL`]), so probing a losing drafter costs little.
#[derive(Clone, Debug)]
pub(crate) struct DraftDepth {
    ceiling: usize,
    /// Moving average of accepted drafts per step (a fully accepted step counts one more, as
    /// the drafter might have gone on being right).
    average_run: f32,
    /// Moving averages of seconds per generated token, without and with drafts.
    plain_cost: Option<f32>,
    draft_cost: Option<f32>,
    /// Steps since the way not preferred was last measured, and how many to wait.
    since_probe: u64,
    probe_interval: u64,
    /// The preference when the step being measured was chosen as a probe.
    probing: Option<bool>,
    /// Never pause drafting.
    always: bool,
}

/// Steps before the way not preferred is first measured again.
const PROBE_EVERY: u64 = 16;
/// Longest wait between measurements.
const MAX_PROBE_INTERVAL: u64 = 1024;
/// While drafting is paused, a probe waits while the drafter would first have to evaluate more
/// than this many tokens it has not seen (a paused draft model falls behind the target), until
/// the interval has grown to its longest.
const PROBE_MAX_BACKLOG: usize = 32;

impl DraftDepth {
    /// A depth below `ceiling` drafts per step, starting modestly; unless `always`, plain
    /// decoding is measured first, as what drafting has to beat.
    pub(crate) fn new(ceiling: u32, always: bool) -> Self {
        let ceiling = ceiling.max(1) as usize;
        Self {
            ceiling,
            average_run: ceiling.min(4) as f32 - 1.0,
            plain_cost: None,
            draft_cost: None,
            since_probe: 0,
            probe_interval: PROBE_EVERY,
            probing: None,
            always,
        }
    }

    fn prefers_drafts(&self) -> bool {
        match (self.plain_cost, self.draft_cost) {
            (Some(plain), Some(drafts)) => drafts <= plain,
            _ => true,
        }
    }

    /// Tokens to draft and verify in the next step, for a drafter `backlog()` tokens behind
    /// the target (asked only when a paused drafter is due for a probe); 0 for a plain step.
    pub(crate) fn next(&mut self, backlog: impl FnOnce() -> usize) -> usize {
        let drafting = ((self.average_run + 1.0).round() as usize).clamp(1, self.ceiling);
        if self.always {
            return drafting;
        }
        if self.plain_cost.is_none() {
            return 0;
        }
        let prefer_drafts = self.prefers_drafts();
        self.since_probe += 1;
        let probe = self.since_probe >= self.probe_interval
            && (prefer_drafts || self.probe_interval >= MAX_PROBE_INTERVAL || backlog() <= PROBE_MAX_BACKLOG);
        if probe {
            self.since_probe = 0;
            self.probing = Some(prefer_drafts);
        }
        if prefer_drafts != probe {
            drafting
        } else {
            0
        }
    }

    /// Records a verified step: `proposed` drafts, of which the first `accepted` matched.
    pub(crate) fn record(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        let run = if accepted == proposed { accepted + 1 } else { accepted };
        self.average_run = 0.7 * self.average_run + 0.3 * run as f32;
    }

    /// Records what one step cost: `seconds` for `tokens` generated, with or without drafts.
    pub(crate) fn record_cost(&mut self, drafted: bool, seconds: f32, tokens: usize) {
        let per_token = seconds / tokens.max(1) as f32;
        let probed = self.probing.take();
        let average = if drafted { &mut self.draft_cost } else { &mut self.plain_cost };
        // A probe's measurement replaces the way's stale average; others move it.
        *average = Some(match (*average, probed) {
            (Some(old), None) => 0.7 * old + 0.3 * per_token,
            _ => per_token,
        });
        if let Some(preferred) = probed {
            self.probe_interval = if self.prefers_drafts() == preferred {
                (2 * self.probe_interval).min(MAX_PROBE_INTERVAL)
            } else {
                PROBE_EVERY
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_follows_acceptance() {
        let mut depth = DraftDepth::new(8, false);
        assert_eq!(depth.next(|| 0), 0, "plain decoding is measured first");
        depth.record_cost(false, 0.010, 1);
        let start = depth.next(|| 0);
        for _ in 0..10 {
            let d = depth.next(|| 0);
            depth.record(d, d);
        }
        assert_eq!(depth.next(|| 0), 8, "all accepted: up to the ceiling");
        for _ in 0..10 {
            let d = depth.next(|| 0);
            depth.record(d, 0);
        }
        assert_eq!(depth.next(|| 0), 1, "none accepted: one token");
        assert!(start > 1 && start <= 4);
        let mut half = DraftDepth::new(8, false);
        half.record_cost(false, 0.010, 1);
        for _ in 0..20 {
            half.record(4, 2);
        }
        assert_eq!(half.next(|| 0), 3);
    }

    /// Drives `depth` for `steps` steps where a plain step costs `plain` and a drafting step
    /// `drafting` seconds per token; returns how many steps drafted.
    fn drafting_steps(depth: &mut DraftDepth, steps: usize, backlog: usize, plain: f32, drafting: f32) -> usize {
        (0..steps)
            .filter(|_| {
                let drafts = depth.next(|| backlog);
                depth.record_cost(drafts > 0, if drafts > 0 { drafting } else { plain }, 1);
                drafts > 0
            })
            .count()
    }

    #[test]
    fn drafting_pauses_while_it_is_slower_and_probes_back_off() {
        let mut depth = DraftDepth::new(4, false);
        assert_eq!(depth.next(|| 0), 0, "plain decoding is measured first");
        depth.record_cost(false, 0.010, 1);
        // Slower drafts: tried once, then only probed, ever more rarely (16, 32, 64, ... steps).
        let slow = drafting_steps(&mut depth, 2000, 0, 0.010, 0.030);
        assert!((5..=9).contains(&slow), "{slow} drafting steps of 2000");
        // Faster drafts win back at the next probe and then draft nearly always.
        let fast = drafting_steps(&mut depth, 2000, 0, 0.010, 0.004);
        assert!(fast > 1900, "{fast} drafting steps of 2000");
        // A paused draft model far behind is probed only at the longest interval.
        let mut behind = DraftDepth::new(4, false);
        behind.record_cost(false, 0.010, 1);
        behind.record_cost(true, 0.030, 1);
        let probes = drafting_steps(&mut behind, 2 * MAX_PROBE_INTERVAL as usize, PROBE_MAX_BACKLOG + 1, 0.010, 0.030);
        assert!(probes <= 2, "{probes} probes far behind");
        let mut always = DraftDepth::new(4, true);
        always.record_cost(false, 0.001, 1);
        always.record_cost(true, 1.0, 1);
        assert!((0..100).all(|_| always.next(|| 0) > 0));
    }

    proptest::proptest! {
        #[test]
        fn depth_stays_within_the_ceiling_whatever_is_measured(
            ceiling in 0..10u32,
            always in proptest::bool::ANY,
            steps in proptest::collection::vec((0..12usize, 0..12usize, 0.0..1.0f32, 0..8usize), 0..200),
        ) {
            let mut depth = DraftDepth::new(ceiling, always);
            for (backlog, accepted, seconds, tokens) in steps {
                let drafts = depth.next(|| backlog);
                proptest::prop_assert!(drafts <= ceiling.max(1) as usize);
                proptest::prop_assert!(!always || drafts >= 1, "an always-on drafter never pauses");
                depth.record(drafts, accepted.min(drafts));
                depth.record_cost(drafts > 0, seconds, tokens);
            }
        }
    }
}
