//! llama.cpp's CPU threads follow the machine: fewer when other processes keep cores busy.
//!
//! llama.cpp's workers meet at a barrier after every operation of the graph and spin while
//! they wait. When another process runs on a core they need, every barrier waits for the
//! descheduled worker's next time slice: on 2 cores with one kept busy, SmolLM2 decoded at
//! 21.9 tok/s with 2 threads and 47.3 with 1 (docs/benchmarks.md, "Threads on a 2-core
//! machine"). So a sampler thread reads, every [`SAMPLE_EVERY`], how much CPU the rest of the
//! machine used (`/proc/stat` less this process's own time, `/proc/self/stat`; niced work
//! left out: it yields to ours), and before each batch the inference thread runs as many
//! threads as cores were left over the last two samples, within the configured counts
//! ([`fitted_threads`], pure). The measure is always recent: work that ended a while ago (a
//! job between two requests) does not count. Linux only; elsewhere, or with `fixed` set, the
//! configured counts stay.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Time between two readings of the machine's CPU use (each reads two small `/proc` files:
/// tens of microseconds); the measure spans the last two.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// Prompt batches of at least this many tokens keep the configured batch threads: their
/// operations are long enough that two threads sharing a core with other work still finish
/// sooner than one (a cold 2K-token prompt next to a busy core: 11.1 s with 2 threads, 12.2 s
/// with 1, docs/benchmarks.md), and a measure taken just before a long batch (another
/// process's start-up) would otherwise hold for the seconds the batch lasts.
pub(crate) const LONG_BATCH_TOKENS: usize = 256;

/// Threads for generation (one token a batch) and for prompt batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadCounts {
    /// Threads while generating.
    pub generation: u32,
    /// Threads while evaluating a prompt.
    pub batch: u32,
}

/// The threads llama.cpp runs with now and what the engine last measured of the machine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ThreadsInUse {
    /// The counts in use.
    pub counts: ThreadCounts,
    /// Cores other processes kept busy over the last measured stretch (0 before the first
    /// measure, or where it is not measured).
    pub other_busy_cores: f64,
    /// Logical CPUs the machine has (0 where it is not measured).
    pub cpus: u32,
}

/// The counts for a batch of `batch_tokens`: generation and short batches fitted to the cores
/// other work leaves ([`fitted_threads`]), long batches at the configured count.
pub(crate) fn counts_for_batch(
    configured: ThreadCounts,
    cpus: u32,
    other_busy_cores: f64,
    batch_tokens: usize,
) -> ThreadCounts {
    let batch = if batch_tokens >= LONG_BATCH_TOKENS {
        configured.batch
    } else {
        fitted_threads(configured.batch, cpus, other_busy_cores)
    };
    ThreadCounts { generation: fitted_threads(configured.generation, cpus, other_busy_cores), batch }
}

/// Threads to run with: the configured count, less the cores other work keeps busy (rounded
/// to the nearest whole core), at least one.
pub(crate) fn fitted_threads(configured: u32, cpus: u32, other_busy_cores: f64) -> u32 {
    let busy = if other_busy_cores.is_finite() { other_busy_cores.max(0.0).round() as u32 } else { 0 };
    configured.min(cpus.saturating_sub(busy)).max(1)
}

/// CPU time counters at one moment, in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CpuTimes {
    /// Busy time of the whole machine, niced user time left out.
    pub busy: u64,
    /// All time of the whole machine (every CPU's, idle included).
    pub total: u64,
    /// This process's user and system time.
    pub own: u64,
}

/// Cores other processes kept busy between two readings, for a machine of `cpus` CPUs.
pub(crate) fn other_busy_cores(before: CpuTimes, after: CpuTimes, cpus: u32) -> f64 {
    let total = after.total.saturating_sub(before.total);
    if total == 0 {
        return 0.0;
    }
    let busy = after.busy.saturating_sub(before.busy);
    let own = after.own.saturating_sub(before.own);
    busy.saturating_sub(own) as f64 / total as f64 * f64::from(cpus)
}

/// The machine's busy and total ticks and its CPU count, from `/proc/stat`'s text.
pub(crate) fn parse_proc_stat(text: &str) -> Option<(u64, u64, u32)> {
    let mut lines = text.lines();
    let first = lines.next()?;
    let mut fields = first.strip_prefix("cpu ")?.split_whitespace().map(|f| f.parse::<u64>().ok());
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let mut next = || fields.next().flatten();
    let (user, nice, system, idle, iowait, irq, softirq) =
        (next()?, next()?, next()?, next()?, next()?, next()?, next()?);
    let steal = next().unwrap_or(0);
    let busy = user + system + irq + softirq + steal;
    let total = user + nice + system + idle + iowait + irq + softirq + steal;
    let cpus =
        lines.filter(|line| line.starts_with("cpu") && line.as_bytes().get(3).is_some_and(u8::is_ascii_digit)).count();
    Some((busy, total, u32::try_from(cpus).ok().filter(|&n| n > 0)?))
}

/// A process's user plus system ticks, from its `/proc/PID/stat` text.
pub(crate) fn parse_process_stat(text: &str) -> Option<u64> {
    // The command name is in parentheses and may hold spaces: count fields after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime = fields.next()?.parse::<u64>().ok()?;
    let stime = fields.next()?.parse::<u64>().ok()?;
    Some(utime + stime)
}

/// Reads the counters now; `None` where `/proc` does not have them.
fn read_cpu_times() -> Option<(CpuTimes, u32)> {
    let (busy, total, cpus) = parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)?;
    let own = parse_process_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    Some((CpuTimes { busy, total, own }, cpus))
}

/// The thread counts, published for the handles (`/metrics`, [`crate::Engine::threads`]).
#[derive(Debug, Default)]
pub(crate) struct PublishedThreads {
    generation: AtomicU32,
    batch: AtomicU32,
    other_busy_cores_milli: AtomicU64,
    cpus: AtomicU32,
}

impl PublishedThreads {
    /// What was last published.
    pub(crate) fn read(&self) -> ThreadsInUse {
        ThreadsInUse {
            counts: ThreadCounts {
                generation: self.generation.load(Ordering::Relaxed),
                batch: self.batch.load(Ordering::Relaxed),
            },
            other_busy_cores: self.other_busy_cores_milli.load(Ordering::Relaxed) as f64 / 1000.0,
            cpus: self.cpus.load(Ordering::Relaxed),
        }
    }

    fn publish(&self, now: ThreadsInUse) {
        self.generation.store(now.counts.generation, Ordering::Relaxed);
        self.batch.store(now.counts.batch, Ordering::Relaxed);
        self.other_busy_cores_milli.store((now.other_busy_cores.max(0.0) * 1000.0).round() as u64, Ordering::Relaxed);
        self.cpus.store(now.cpus, Ordering::Relaxed);
    }
}

/// The sampler's latest measure, as the inference thread reads it.
#[derive(Debug, Default)]
struct Measure {
    /// Cores other processes kept busy over the last two samples, in thousandths.
    other_busy_milli: AtomicU64,
    /// Logical CPUs (0 until the first measure).
    cpus: AtomicU32,
}

/// Reads the machine's CPU use every [`SAMPLE_EVERY`] into `measure`, until it is dropped.
fn sample(measure: &Weak<Measure>, first: (CpuTimes, u32)) {
    let (mut before, _) = first;
    let mut last_interval: Option<f64> = None;
    loop {
        std::thread::sleep(SAMPLE_EVERY);
        let Some(measure) = measure.upgrade() else { return };
        let Some((now, cpus)) = read_cpu_times() else { return };
        let interval = other_busy_cores(before, now, cpus);
        let over_two = last_interval.map_or(interval, |last| (last + interval) / 2.0);
        measure.other_busy_milli.store((over_two * 1000.0).round() as u64, Ordering::Relaxed);
        measure.cpus.store(cpus, Ordering::Relaxed);
        (before, last_interval) = (now, Some(interval));
    }
}

/// Decides, on the inference thread, the thread counts for the next batch.
pub(crate) struct ThreadGovernor {
    configured: ThreadCounts,
    /// The sampler's measure; `None`: the configured counts always.
    measure: Option<Arc<Measure>>,
    now: ThreadsInUse,
    published: Arc<PublishedThreads>,
}

impl ThreadGovernor {
    /// A governor starting at the configured counts (what the context was created with);
    /// `adaptive` starts the sampler, where `/proc` has the counters.
    pub(crate) fn new(configured: ThreadCounts, adaptive: bool, published: Arc<PublishedThreads>) -> Self {
        let now = ThreadsInUse { counts: configured, other_busy_cores: 0.0, cpus: 0 };
        published.publish(now);
        let measure = adaptive.then(read_cpu_times).flatten().and_then(|first| {
            let measure = Arc::new(Measure::default());
            let weak = Arc::downgrade(&measure);
            let spawned =
                std::thread::Builder::new().name("firstword-cpu-load".into()).spawn(move || sample(&weak, first));
            spawned.is_ok().then_some(measure)
        });
        Self { configured, measure, now, published }
    }

    /// The counts for the next batch, of `batch_tokens` tokens, when they differ from those in
    /// use (the caller sets them on its contexts), `None` when they stay.
    pub(crate) fn before_batch(&mut self, batch_tokens: usize) -> Option<ThreadCounts> {
        let measure = self.measure.as_ref()?;
        let cpus = measure.cpus.load(Ordering::Relaxed);
        if cpus == 0 {
            return None;
        }
        let other = measure.other_busy_milli.load(Ordering::Relaxed) as f64 / 1000.0;
        let counts = counts_for_batch(self.configured, cpus, other, batch_tokens);
        let changed = counts != self.now.counts;
        if changed {
            tracing::debug!(
                generation = counts.generation,
                batch = counts.batch,
                other_busy_cores = other,
                "llama.cpp threads follow the machine's load"
            );
        }
        let now = ThreadsInUse { counts, other_busy_cores: other, cpus };
        // Called before every token: the handles' copy is written only when something moved.
        if now != self.now {
            self.now = now;
            self.published.publish(now);
        }
        changed.then_some(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_core_busy_elsewhere_leaves_one_thread_on_two_cores() {
        assert_eq!(fitted_threads(2, 2, 1.0), 1);
        assert_eq!(fitted_threads(2, 2, 0.3), 2);
        assert_eq!(fitted_threads(2, 2, 0.7), 1);
        assert_eq!(fitted_threads(2, 2, 5.0), 1);
        assert_eq!(fitted_threads(8, 16, 6.0), 8);
        assert_eq!(fitted_threads(8, 16, 10.2), 6);
        assert_eq!(fitted_threads(4, 8, f64::NAN), 4);
    }

    proptest! {
        #[test]
        fn fitted_threads_stay_within_one_and_the_configured_count(
            configured in 1u32..64, cpus in 1u32..256, other in -4.0f64..300.0, more in 0.0f64..8.0,
        ) {
            let threads = fitted_threads(configured, cpus, other);
            prop_assert!((1..=configured).contains(&threads));
            // More load elsewhere never means more threads.
            prop_assert!(fitted_threads(configured, cpus, other + more) <= threads);
        }
    }

    #[test]
    fn long_prompt_batches_keep_the_configured_batch_threads() {
        let configured = ThreadCounts { generation: 2, batch: 2 };
        let short = counts_for_batch(configured, 2, 1.0, LONG_BATCH_TOKENS - 1);
        assert_eq!(short, ThreadCounts { generation: 1, batch: 1 });
        let long = counts_for_batch(configured, 2, 1.0, LONG_BATCH_TOKENS);
        assert_eq!(long, ThreadCounts { generation: 1, batch: 2 });
        assert_eq!(counts_for_batch(configured, 2, 0.0, 1), configured);
    }

    #[test]
    fn proc_stat_is_read_without_niced_time() {
        let text = "cpu  1000 300 200 5000 100 10 20 5 0 0\ncpu0 500 150 100 2500 50 5 10 2 0 0\n\
                    cpu1 500 150 100 2500 50 5 10 3 0 0\nintr 12345\nctxt 99\n";
        // busy: user 1000 (nice apart) + system 200 + irq 10 + softirq 20 + steal 5.
        assert_eq!(parse_proc_stat(text), Some((1235, 1000 + 300 + 200 + 5000 + 100 + 10 + 20 + 5, 2)));
        assert_eq!(parse_proc_stat("intr 1\n"), None);
        assert_eq!(parse_proc_stat("cpu  1 2\n"), None);
    }

    #[test]
    fn a_process_stat_with_spaces_in_its_name_is_read() {
        let text = "4242 (fire word) S 1 4242 4242 0 -1 4194304 5000 0 0 0 1234 567 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_process_stat(text), Some(1234 + 567));
        assert_eq!(parse_process_stat("4242 (x S 1"), None);
    }

    #[test]
    fn other_work_is_the_machine_s_busy_time_less_our_own() {
        let before = CpuTimes { busy: 1000, total: 10_000, own: 400 };
        // 200 ticks on 2 CPUs (1 s at 100 Hz): 150 busy, 50 of them ours.
        let after = CpuTimes { busy: 1150, total: 10_200, own: 450 };
        assert!((other_busy_cores(before, after, 2) - 1.0).abs() < 1e-9);
        // Our own time counted beyond the machine's (sampled apart): never below zero.
        let after = CpuTimes { busy: 1010, total: 10_200, own: 500 };
        assert_eq!(other_busy_cores(before, after, 2), 0.0);
        assert_eq!(other_busy_cores(before, before, 2), 0.0);
    }

    #[test]
    fn a_fixed_governor_never_changes_the_counts() {
        let configured = ThreadCounts { generation: 2, batch: 2 };
        let published = Arc::new(PublishedThreads::default());
        let mut governor = ThreadGovernor::new(configured, false, published.clone());
        for _ in 0..3 {
            assert_eq!(governor.before_batch(1), None);
        }
        assert_eq!(published.read().counts, configured);
    }
}
