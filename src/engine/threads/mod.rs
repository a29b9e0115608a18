//! llama.cpp's CPU threads follow the machine: fewer when other processes keep cores busy.
//!
//! llama.cpp's workers meet at a barrier after every operation of the graph and spin while
//! they wait. When another process runs on a core they need, every barrier waits for the
//! descheduled worker's next time slice: on 2 cores with one kept busy, SmolLM2 decoded at
//! 21.9 tok/s with 2 threads and 47.3 with 1 (docs/benchmarks.md, "Threads on a 2-core
//! machine"). So a sampler thread reads, every [`SAMPLE_EVERY`], how much CPU other processes
//! used on the CPUs firstword may run on (its affinity mask's lines of `/proc/stat` less this
//! process's own time, `/proc/self/stat`; niced work left out: it yields to ours) and what its
//! cgroup's CPU quota allows ([`machine`]), and before each batch the inference thread runs
//! as many threads as those CPUs had free over the last two samples, no more than the quota,
//! within the configured counts ([`fitted_threads`], pure). Other tenants' work on cores
//! outside the mask never counts. The measure is always recent: work that ended a while ago (a
//! job between two requests) does not count. Linux only; elsewhere, or with `fixed` set, the
//! configured counts stay. The counts published are those llama.cpp reports for its context
//! after they were set (`engine::ffi::set_threads`), not the governor's wish.

pub(crate) mod machine;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use machine::{other_busy_cores, Machine, Reading};

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
    /// The counts llama.cpp reports for its context (`llama_n_threads`,
    /// `llama_n_threads_batch`), read back after each change.
    pub counts: ThreadCounts,
    /// Cores other processes kept busy, on the CPUs firstword may run on, over the last
    /// measured stretch (0 before the first measure, or where it is not measured).
    pub other_busy_cores: f64,
    /// CPUs firstword may run on: those of its affinity mask (a container's cpuset, `taskset`;
    /// 0 where it is not measured).
    pub cpus: u32,
    /// Cores' worth of CPU time the process's cgroup quota allows (`cpu.max`), `None` without
    /// a quota or where it is not measured.
    pub cpu_limit: Option<f64>,
}

/// What the last measure leaves this process: the CPUs it may run on, the other work on them
/// and its cgroup's quota.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Capacity {
    /// CPUs of the affinity mask.
    pub cpus: u32,
    /// Cores other processes kept busy on them.
    pub other_busy_cores: f64,
    /// Cores' worth of time the quota allows.
    pub cpu_limit: Option<f64>,
}

impl Capacity {
    /// Whole cores the process can use at all: its CPUs, no more than its quota (rounded
    /// down: a thread beyond it would be throttled at every period's end), at least one.
    fn usable(&self) -> u32 {
        let quota = self.cpu_limit.filter(|limit| limit.is_finite()).map_or(u32::MAX, |limit| limit.max(0.0) as u32);
        self.cpus.min(quota).max(1)
    }

    /// Cores left: the usable ones, less the cores other work keeps busy (rounded to the
    /// nearest whole core).
    fn free(&self) -> u32 {
        let other = self.other_busy_cores;
        let busy = if other.is_finite() { other.max(0.0).round() as u32 } else { 0 };
        self.usable().min(self.cpus.saturating_sub(busy))
    }
}

/// The counts for a batch of `batch_tokens`: generation and short batches fitted to the cores
/// other work leaves ([`fitted_threads`]), long batches at the configured count, no more than
/// the cores the process can use.
pub(crate) fn counts_for_batch(configured: ThreadCounts, capacity: Capacity, batch_tokens: usize) -> ThreadCounts {
    let batch = if batch_tokens >= LONG_BATCH_TOKENS {
        configured.batch.min(capacity.usable()).max(1)
    } else {
        fitted_threads(configured.batch, capacity)
    };
    ThreadCounts { generation: fitted_threads(configured.generation, capacity), batch }
}

/// Threads to run with: the configured count, no more than the cores left
/// ([`Capacity::free`]), at least one.
pub(crate) fn fitted_threads(configured: u32, capacity: Capacity) -> u32 {
    configured.min(capacity.free()).max(1)
}

/// The thread counts, published for the handles (`/metrics`, [`crate::Engine::threads`]).
#[derive(Debug, Default)]
pub(crate) struct PublishedThreads {
    generation: AtomicU32,
    batch: AtomicU32,
    other_busy_cores_milli: AtomicU64,
    cpus: AtomicU32,
    /// Thousandths of a core; `u64::MAX`: no quota.
    cpu_limit_milli: AtomicU64,
}

impl PublishedThreads {
    /// What was last published.
    pub(crate) fn read(&self) -> ThreadsInUse {
        let cpu_limit = self.cpu_limit_milli.load(Ordering::Relaxed);
        ThreadsInUse {
            counts: ThreadCounts {
                generation: self.generation.load(Ordering::Relaxed),
                batch: self.batch.load(Ordering::Relaxed),
            },
            other_busy_cores: self.other_busy_cores_milli.load(Ordering::Relaxed) as f64 / 1000.0,
            cpus: self.cpus.load(Ordering::Relaxed),
            cpu_limit: (cpu_limit != u64::MAX).then(|| cpu_limit as f64 / 1000.0),
        }
    }

    fn publish(&self, now: ThreadsInUse) {
        self.generation.store(now.counts.generation, Ordering::Relaxed);
        self.batch.store(now.counts.batch, Ordering::Relaxed);
        self.other_busy_cores_milli.store(milli(now.other_busy_cores), Ordering::Relaxed);
        self.cpus.store(now.cpus, Ordering::Relaxed);
        self.cpu_limit_milli.store(now.cpu_limit.map_or(u64::MAX, milli), Ordering::Relaxed);
    }
}

/// Thousandths of `value`, rounded (negative: 0).
fn milli(value: f64) -> u64 {
    (value.max(0.0) * 1000.0).round() as u64
}

/// The sampler's latest measure, as the inference thread reads it.
#[derive(Debug)]
struct Measure {
    /// Cores other processes kept busy over the last two samples, in thousandths.
    other_busy_milli: AtomicU64,
    /// CPUs of the affinity mask (0 until the first measure).
    cpus: AtomicU32,
    /// The cgroup's quota in thousandths of a core; `u64::MAX`: none.
    cpu_limit_milli: AtomicU64,
}

/// Reads the machine's CPU use every [`SAMPLE_EVERY`] into `measure`, until it is dropped.
fn sample(measure: &Weak<Measure>, machine: &Machine, first: Reading) {
    let mut before = first;
    let mut last_interval: Option<f64> = None;
    loop {
        std::thread::sleep(SAMPLE_EVERY);
        let Some(measure) = measure.upgrade() else { return };
        let Some(now) = machine.read() else { return };
        // The mask can change while firstword runs: a stretch over another set of CPUs starts
        // the measure again.
        if now.cpus != before.cpus {
            (before, last_interval) = (now, None);
            continue;
        }
        let interval = other_busy_cores(before.times, now.times, now.cpus);
        let over_two = last_interval.map_or(interval, |last| (last + interval) / 2.0);
        measure.other_busy_milli.store(milli(over_two), Ordering::Relaxed);
        measure.cpu_limit_milli.store(now.cpu_limit.map_or(u64::MAX, milli), Ordering::Relaxed);
        measure.cpus.store(now.cpus, Ordering::Relaxed);
        (before, last_interval) = (now, Some(interval));
    }
}

/// Decides, on the inference thread, the thread counts for the next batch.
pub(crate) struct ThreadGovernor {
    configured: ThreadCounts,
    /// The sampler's measure; `None`: the configured counts always.
    measure: Option<Arc<Measure>>,
    /// The counts llama.cpp reported last ([`ThreadGovernor::applied`]) and the last measure.
    now: ThreadsInUse,
    published: Arc<PublishedThreads>,
}

impl ThreadGovernor {
    /// A governor starting at the configured counts (what the contexts were created with,
    /// published until llama.cpp reports its own, [`ThreadGovernor::applied`]); `adaptive`
    /// starts the sampler, where `/proc` has the counters.
    pub(crate) fn new(configured: ThreadCounts, adaptive: bool, published: Arc<PublishedThreads>) -> Self {
        let now = ThreadsInUse { counts: configured, other_busy_cores: 0.0, cpus: 0, cpu_limit: None };
        published.publish(now);
        let measure = adaptive.then(|| {
            let machine = Machine::new();
            let first = machine.read()?;
            let measure = Arc::new(Measure {
                other_busy_milli: AtomicU64::new(0),
                cpus: AtomicU32::new(0),
                cpu_limit_milli: AtomicU64::new(u64::MAX),
            });
            let weak = Arc::downgrade(&measure);
            let spawned = std::thread::Builder::new()
                .name("firstword-cpu-load".into())
                .spawn(move || sample(&weak, &machine, first));
            spawned.is_ok().then_some(measure)
        });
        Self { configured, measure: measure.flatten(), now, published }
    }

    /// The counts the contexts were created with.
    pub(crate) fn configured(&self) -> ThreadCounts {
        self.configured
    }

    /// Whether the counts follow the machine (false: they stay as configured).
    pub(crate) fn adaptive(&self) -> bool {
        self.measure.is_some()
    }

    /// The counts for the next batch, of `batch_tokens` tokens, when they differ from those
    /// llama.cpp last reported (the caller sets them on its contexts, then reports what
    /// llama.cpp read back with [`ThreadGovernor::applied`]), `None` when they stay.
    pub(crate) fn before_batch(&mut self, batch_tokens: usize) -> Option<ThreadCounts> {
        let measure = self.measure.as_ref()?;
        let cpus = measure.cpus.load(Ordering::Relaxed);
        if cpus == 0 {
            return None;
        }
        let limit = measure.cpu_limit_milli.load(Ordering::Relaxed);
        let capacity = Capacity {
            cpus,
            other_busy_cores: measure.other_busy_milli.load(Ordering::Relaxed) as f64 / 1000.0,
            cpu_limit: (limit != u64::MAX).then(|| limit as f64 / 1000.0),
        };
        let counts = counts_for_batch(self.configured, capacity, batch_tokens);
        let changed = counts != self.now.counts;
        if changed {
            tracing::debug!(
                generation = counts.generation,
                batch = counts.batch,
                cpus,
                cpu_limit = capacity.cpu_limit,
                other_busy_cores = capacity.other_busy_cores,
                "llama.cpp threads follow the machine's load"
            );
        }
        let now = ThreadsInUse {
            counts: self.now.counts,
            other_busy_cores: capacity.other_busy_cores,
            cpus,
            cpu_limit: capacity.cpu_limit,
        };
        // Called before every token: the handles' copy is written only when something moved.
        if now != self.now {
            self.now = now;
            self.published.publish(now);
        }
        changed.then_some(counts)
    }

    /// Records and publishes the counts llama.cpp reports for its context.
    pub(crate) fn applied(&mut self, counts: ThreadCounts) {
        if counts != self.now.counts {
            self.now.counts = counts;
            self.published.publish(self.now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `cpus` CPUs, `other` of them busy elsewhere, no quota.
    fn load(cpus: u32, other: f64) -> Capacity {
        Capacity { cpus, other_busy_cores: other, cpu_limit: None }
    }

    #[test]
    fn one_core_busy_elsewhere_leaves_one_thread_on_two_cores() {
        assert_eq!(fitted_threads(2, load(2, 1.0)), 1);
        assert_eq!(fitted_threads(2, load(2, 0.3)), 2);
        assert_eq!(fitted_threads(2, load(2, 0.7)), 1);
        assert_eq!(fitted_threads(2, load(2, 5.0)), 1);
        assert_eq!(fitted_threads(8, load(16, 6.0)), 8);
        assert_eq!(fitted_threads(8, load(16, 10.2)), 6);
        assert_eq!(fitted_threads(4, load(8, f64::NAN)), 4);
    }

    #[test]
    fn a_cgroup_quota_caps_the_threads_whatever_the_cpus() {
        // A container on a 64-CPU host, allowed 2.5 cores' worth: two threads.
        let quota = |limit: f64, other: f64| Capacity { cpus: 64, other_busy_cores: other, cpu_limit: Some(limit) };
        assert_eq!(fitted_threads(8, quota(2.5, 0.0)), 2);
        assert_eq!(fitted_threads(8, quota(0.5, 0.0)), 1);
        // Other work on the shared CPUs still counts where it leaves fewer than the quota.
        assert_eq!(fitted_threads(8, quota(4.0, 61.0)), 3);
        // Long batches keep the configured count only up to the quota.
        let configured = ThreadCounts { generation: 4, batch: 8 };
        assert_eq!(
            counts_for_batch(configured, quota(2.0, 0.0), LONG_BATCH_TOKENS),
            ThreadCounts { generation: 2, batch: 2 }
        );
        assert_eq!(fitted_threads(8, quota(f64::NAN, 0.0)), 8);
    }

    #[test]
    fn a_mask_of_one_cpu_means_one_thread() {
        // `taskset -c 0` on a busy host: the other CPUs' work is not in the measure at all.
        let configured = ThreadCounts { generation: 2, batch: 2 };
        for tokens in [1, LONG_BATCH_TOKENS] {
            assert_eq!(counts_for_batch(configured, load(1, 0.0), tokens), ThreadCounts { generation: 1, batch: 1 });
        }
    }

    proptest! {
        #[test]
        fn fitted_threads_stay_within_one_and_the_configured_count(
            configured in 1u32..64, cpus in 1u32..256, other in -4.0f64..300.0, more in 0.0f64..8.0,
            limit in proptest::option::of(0.0f64..300.0), less in 0.0f64..8.0,
        ) {
            let capacity = Capacity { cpus, other_busy_cores: other, cpu_limit: limit };
            let threads = fitted_threads(configured, capacity);
            prop_assert!((1..=configured).contains(&threads));
            // More load elsewhere, or a tighter quota, never means more threads.
            let busier = Capacity { other_busy_cores: other + more, ..capacity };
            prop_assert!(fitted_threads(configured, busier) <= threads);
            let tighter = Capacity { cpu_limit: Some(limit.unwrap_or(f64::from(cpus)) - less), ..capacity };
            prop_assert!(fitted_threads(configured, tighter) <= threads);
        }
    }

    #[test]
    fn long_prompt_batches_keep_the_configured_batch_threads() {
        let configured = ThreadCounts { generation: 2, batch: 2 };
        let short = counts_for_batch(configured, load(2, 1.0), LONG_BATCH_TOKENS - 1);
        assert_eq!(short, ThreadCounts { generation: 1, batch: 1 });
        let long = counts_for_batch(configured, load(2, 1.0), LONG_BATCH_TOKENS);
        assert_eq!(long, ThreadCounts { generation: 1, batch: 2 });
        assert_eq!(counts_for_batch(configured, load(2, 0.0), 1), configured);
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
        assert_eq!(published.read().cpu_limit, None);
    }
}
