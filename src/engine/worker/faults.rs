//! Fault isolation on the inference thread: a panic while serving one command (a bug) fails
//! that command's request with [`EngineError::Internal`], the cache is cleared (the panic may
//! have left the KV cache and its token list apart), and the thread serves the next command.
//! Only a panic during that recovery stops the thread.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use tokio::sync::mpsc::UnboundedSender;

use super::Session;
use crate::engine::{Command, EngineError, Event};

/// Where a command's failure is reported.
enum Requester {
    /// A generation's or a prefill's events.
    Events(UnboundedSender<Event>),
    /// Nobody waits for an answer that could fail.
    Nobody,
}

impl Requester {
    fn of(command: &Command) -> Self {
        match command {
            Command::Generate(job) => Self::Events(job.events.clone()),
            Command::Prefill(queued) => queued.events().map_or(Self::Nobody, Self::Events),
            Command::Idle(_) => Self::Nobody,
        }
    }

    fn fail(self, error: EngineError) {
        match self {
            Self::Events(events) => {
                let _ = events.send(Event::Failed(error));
            }
            Self::Nobody => {}
        }
    }
}

impl Session<'_> {
    /// Handles one command; a panic fails its request and the session recovers from it.
    ///
    /// # Errors
    /// Why the thread must stop: the recovery itself panicked.
    pub(super) fn handle_isolated(&mut self, command: Command) -> Result<(), String> {
        let requester = Requester::of(&command);
        let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.handle(command))) else { return Ok(()) };
        let message = panic_message(&*panic);
        tracing::error!("the inference thread panicked while serving a request: {message}; the cache is cleared");
        requester.fail(EngineError::Internal(message.clone()));
        catch_unwind(AssertUnwindSafe(|| self.recover()))
            .map_err(|panic| format!("{message}; then, clearing the cache: {}", panic_message(&*panic)))
    }

    /// Forgets every cached state of this process (the live sequence, the drafter's, the RAM
    /// store): none is known to be whole after a panic. Files in the disk cache were written
    /// before and are checked when read.
    fn recover(&mut self) {
        fail::fail_point!("engine::recover");
        self.sequence.forget_all();
        self.publish_cache_status();
    }
}

/// A panic's message (`panic!` payloads are a `&str` or a `String`).
pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

#[cfg(test)]
mod tests {
    use super::panic_message;

    #[test]
    fn panic_messages_are_read_from_both_payload_types() {
        let literal = std::panic::catch_unwind(|| panic!("literal")).expect_err("panics");
        assert_eq!(panic_message(&*literal), "literal");
        let formatted = std::panic::catch_unwind(|| panic!("formatted {}", 42)).expect_err("panics");
        assert_eq!(panic_message(&*formatted), "formatted 42");
        let other = std::panic::catch_unwind(|| std::panic::panic_any(7_u8)).expect_err("panics");
        assert_eq!(panic_message(&*other), "a panic without a message");
    }
}
