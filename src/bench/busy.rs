//! A fixed background load for a whole run (`--busy-cores`): spinning threads, pinned nowhere,
//! so the servers are measured next to other work, as on a home server that also runs other
//! services.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Threads that each keep one core busy until dropped.
#[derive(Debug)]
pub struct BusyLoad {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<u64>>,
}

impl BusyLoad {
    /// Starts `cores` spinning threads (none for 0).
    ///
    /// # Panics
    /// If the OS cannot start a thread.
    #[must_use]
    pub fn start(cores: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..cores)
            .map(|i| {
                let stop = Arc::clone(&stop);
                std::thread::Builder::new()
                    .name(format!("bench-busy-{i}"))
                    .spawn(move || spin(&stop))
                    .expect("a busy-load thread starts")
            })
            .collect();
        Self { stop, threads }
    }

    /// Stops the threads; returns the rounds of work each did.
    pub fn stop(mut self) -> Vec<u64> {
        self.stop_threads()
    }

    fn stop_threads(&mut self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.drain(..).map(|thread| thread.join().unwrap_or(0)).collect()
    }
}

/// Rounds of integer work until `stop` is set (at least one); returns how many.
fn spin(stop: &AtomicBool) -> u64 {
    let mut rounds = 0u64;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    loop {
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        std::hint::black_box(x);
        rounds += 1;
        if stop.load(Ordering::Relaxed) {
            return rounds;
        }
    }
}

impl Drop for BusyLoad {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_busy_thread_works_until_stopped() {
        let rounds = BusyLoad::start(2).stop();
        assert_eq!(rounds.len(), 2);
        assert!(rounds.iter().all(|&r| r >= 1), "{rounds:?}");
        assert!(BusyLoad::start(0).stop().is_empty());
        // Dropped without stop(): the threads end too.
        drop(BusyLoad::start(1));
    }
}
