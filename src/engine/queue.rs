//! The inference thread's queue: admission (one job served and `queue_size` waiting) and the
//! prefills waiting in it. A prefill that a newer one replaces while both wait is answered as
//! superseded at once and gives its place back then, not when the thread would have reached
//! it; a newer prefill refused for lack of room replaces nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Command, EngineError, Job, PrefillReport};

/// One admitted job (queued or being served); dropping it frees its place.
pub(crate) struct Admission(Arc<AtomicUsize>);

impl Admission {
    /// Takes a place if fewer than `limit` jobs are admitted.
    pub(crate) fn take(admitted: &Arc<AtomicUsize>, limit: usize) -> Option<Self> {
        admitted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
            .ok()
            .map(|_| Self(Arc::clone(admitted)))
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A prefill job in the queue, until the inference thread takes it or a newer prefill
/// replaces it.
pub(crate) struct QueuedPrefill(Mutex<Slot>);

enum Slot {
    Waiting(Box<Job>),
    /// Taken by the inference thread (served or being served).
    Taken,
    /// Replaced by a newer prefill that was queued behind it.
    Superseded,
}

impl QueuedPrefill {
    fn new(job: Box<Job>) -> Self {
        Self(Mutex::new(Slot::Waiting(job)))
    }

    /// The job, for the inference thread to serve; `None` when a newer prefill replaced it
    /// (it was answered then).
    pub(crate) fn take(&self) -> Option<Box<Job>> {
        let mut slot = self.0.lock();
        match std::mem::replace(&mut *slot, Slot::Taken) {
            Slot::Waiting(job) => Some(job),
            other => {
                *slot = other;
                None
            }
        }
    }

    /// Where the waiting job's events go, if it still waits.
    pub(crate) fn events(&self) -> Option<tokio::sync::mpsc::UnboundedSender<super::Event>> {
        match &*self.0.lock() {
            Slot::Waiting(job) => Some(job.events.clone()),
            Slot::Taken | Slot::Superseded => None,
        }
    }

    /// Puts `job` in the waiting one's place, returning that one; `job` itself back when the
    /// inference thread took the slot's job already.
    fn replace(&self, job: Box<Job>) -> Result<Box<Job>, Box<Job>> {
        let mut slot = self.0.lock();
        match &mut *slot {
            Slot::Waiting(waiting) => Ok(std::mem::replace(waiting, job)),
            Slot::Taken | Slot::Superseded => Err(job),
        }
    }

    /// Empties the slot: the job that waited in it, if one did.
    fn supersede(&self) -> Option<Box<Job>> {
        let mut slot = self.0.lock();
        match std::mem::replace(&mut *slot, Slot::Superseded) {
            Slot::Waiting(job) => Some(job),
            other => {
                *slot = other;
                None
            }
        }
    }
}

/// What was last sent to the inference thread: how many generations, and the newest prefill.
#[derive(Default)]
pub(crate) struct Tail {
    /// Generation jobs sent so far.
    generations: u64,
    /// The newest prefill sent, with `generations` at the time.
    prefill: Option<(Arc<QueuedPrefill>, u64)>,
}

/// Sends jobs to the inference thread in order, under one lock so a prefill knows what was
/// queued after the one it replaces.
pub(crate) struct Sender {
    commands: SyncSender<Command>,
    tail: Mutex<Tail>,
    /// The capacity reported when the queue is full.
    queue_size: usize,
}

impl Sender {
    /// Sends over `commands`; `queue_size` is the capacity named when the queue is full.
    pub(crate) fn new(commands: SyncSender<Command>, queue_size: usize) -> Self {
        Self { commands, tail: Mutex::default(), queue_size }
    }

    /// The channel, for commands that are not jobs.
    pub(crate) fn commands(&self) -> &SyncSender<Command> {
        &self.commands
    }

    /// Queues an admitted job. A prefill replaces the newest prefill still waiting: in its
    /// place when nothing was queued after that one (no stale entry is left in the channel),
    /// else at the end of the queue; either way the replaced one is answered as superseded at
    /// once, which frees its place. A job that cannot be sent replaces nothing.
    ///
    /// # Errors
    /// [`EngineError::QueueFull`] or [`EngineError::ShuttingDown`].
    pub(crate) fn send(&self, job: Box<Job>) -> Result<(), EngineError> {
        let mut tail = self.tail.lock();
        if job.report.is_none() {
            self.try_send(Command::Generate(job))?;
            tail.generations += 1;
            return Ok(());
        }
        let mut job = job;
        let newest = tail.prefill.take();
        if let Some((waiting, sent_at)) = &newest {
            if *sent_at == tail.generations {
                match waiting.replace(job) {
                    Ok(replaced) => {
                        tail.prefill = newest;
                        answer_superseded(replaced);
                        return Ok(());
                    }
                    Err(returned) => job = returned,
                }
            }
        }
        let queued = Arc::new(QueuedPrefill::new(job));
        if let Err(e) = self.try_send(Command::Prefill(Arc::clone(&queued))) {
            tail.prefill = newest;
            return Err(e);
        }
        if let Some(replaced) = newest.and_then(|(older, _)| older.supersede()) {
            answer_superseded(replaced);
        }
        tail.prefill = Some((queued, tail.generations));
        Ok(())
    }

    fn try_send(&self, command: Command) -> Result<(), EngineError> {
        match self.commands.try_send(command) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(EngineError::QueueFull { capacity: self.queue_size }),
            Err(TrySendError::Disconnected(_)) => Err(EngineError::ShuttingDown),
        }
    }
}

/// Answers a prefill a newer one replaced before it ran; dropping it frees its place.
fn answer_superseded(mut job: Box<Job>) {
    if let Some(report) = job.report.take() {
        let _ = report.send(PrefillReport { superseded: true, ..PrefillReport::default() });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::mpsc::{self, Receiver};
    use std::sync::Arc;

    use tokio::sync::oneshot;

    use super::{Admission, Sender};
    use crate::chat::Landmarks;
    use crate::engine::worker::PromptInput;
    use crate::engine::{Command, EngineError, GenerationRequest, Job, PrefillReport};

    /// A queue of `queue_size` places (channel capacity `capacity`) and its admission count.
    fn queue(queue_size: usize, capacity: usize) -> (Sender, Receiver<Command>, Arc<AtomicUsize>) {
        let (commands, received) = mpsc::sync_channel(capacity);
        (Sender::new(commands, queue_size), received, Arc::new(AtomicUsize::new(0)))
    }

    /// An admitted job: a prefill (with where its report goes) or a generation.
    fn job(admitted: &Arc<AtomicUsize>, prefill: bool) -> (Box<Job>, Option<oneshot::Receiver<PrefillReport>>) {
        let (report, report_rx) = oneshot::channel();
        let (events, _) = tokio::sync::mpsc::unbounded_channel();
        let job = Job {
            prompt: PromptInput::Text("hi".into()),
            report: prefill.then_some(report),
            landmarks: Landmarks::default(),
            request: GenerationRequest::chat(Vec::new()),
            events,
            finish_requested: Arc::new(AtomicBool::new(false)),
            clock: None,
            media: crate::engine::PreparedMedia::default(),
            _admitted: Admission::take(admitted, usize::MAX).expect("admitted"),
        };
        (Box::new(job), prefill.then_some(report_rx))
    }

    fn superseded(report: &mut Option<oneshot::Receiver<PrefillReport>>) -> bool {
        report.as_mut().and_then(|r| r.try_recv().ok()).is_some_and(|report| report.superseded)
    }

    /// What the inference thread would serve, in order: `p` for a prefill, `g` for a
    /// generation; a replaced prefill's entry serves nothing.
    fn served(received: &Receiver<Command>) -> String {
        received
            .try_iter()
            .filter_map(|command| match command {
                Command::Generate(_) => Some('g'),
                Command::Prefill(queued) => queued.take().map(|_| 'p'),
                Command::Idle(_) => None,
            })
            .collect()
    }

    #[test]
    fn admission_never_passes_its_limit() {
        let admitted = Arc::new(AtomicUsize::new(0));
        let first = Admission::take(&admitted, 2).expect("a place");
        let second = Admission::take(&admitted, 2).expect("a place");
        assert!(Admission::take(&admitted, 2).is_none());
        drop(first);
        assert!(Admission::take(&admitted, 2).is_some());
        drop(second);
        assert_eq!(admitted.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_newer_prefill_takes_the_older_one_s_place_and_frees_its_own_at_once() {
        let (sender, received, admitted) = queue(2, 6);
        let (older, mut older_report) = job(&admitted, true);
        sender.send(older).expect("queued");
        let (newer, mut newer_report) = job(&admitted, true);
        sender.send(newer).expect("queued");
        assert!(superseded(&mut older_report), "answered at once");
        assert_eq!(admitted.load(Ordering::Relaxed), 1, "the older one's place is free");
        assert!(newer_report.as_mut().expect("report").try_recv().is_err(), "the newer one waits");
        assert_eq!(served(&received), "p", "one entry in the channel");
    }

    #[test]
    fn a_prefill_replaced_after_a_generation_queued_behind_it_runs_behind_that_generation() {
        let (sender, received, admitted) = queue(4, 10);
        let (older, mut older_report) = job(&admitted, true);
        sender.send(older).expect("queued");
        sender.send(job(&admitted, false).0).expect("queued");
        let (newer, _newer_report) = job(&admitted, true);
        sender.send(newer).expect("queued");
        assert!(superseded(&mut older_report));
        assert_eq!(admitted.load(Ordering::Relaxed), 2);
        assert_eq!(served(&received), "gp", "the older entry serves nothing");
    }

    #[test]
    fn a_prefill_the_channel_refuses_replaces_nothing() {
        let (sender, received, admitted) = queue(1, 2);
        let (older, mut older_report) = job(&admitted, true);
        sender.send(older).expect("queued");
        sender.send(job(&admitted, false).0).expect("queued");
        let (refused, _) = job(&admitted, true);
        assert!(matches!(sender.send(refused), Err(EngineError::QueueFull { capacity: 1 })));
        assert!(!superseded(&mut older_report), "the queued prefill still runs");
        assert_eq!(admitted.load(Ordering::Relaxed), 2, "the refused one's place is freed");
        assert_eq!(served(&received), "pg");
    }

    #[test]
    fn a_prefill_already_taken_is_not_replaced() {
        let (sender, received, admitted) = queue(2, 6);
        let (running, mut running_report) = job(&admitted, true);
        sender.send(running).expect("queued");
        assert_eq!(served(&received), "p", "taken by the inference thread");
        let (next, _) = job(&admitted, true);
        sender.send(next).expect("queued");
        assert!(!superseded(&mut running_report));
        assert_eq!(served(&received), "p", "queued anew");
    }
}
