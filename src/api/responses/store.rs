//! Stored responses, for `previous_response_id` and `GET /v1/responses/{id}`: a bounded
//! in-memory store, least recently used out first. Each response keeps its own turn (input and
//! output as chat messages) and a link to the response it continued, so a chain shares its
//! history instead of copying it; a response evicted from the store stays alive as long as a
//! stored later one continues it.

use std::num::NonZeroUsize;
use std::sync::Arc;

use lru::LruCache;
use parking_lot::Mutex;

use super::wire::ResponseObject;
use crate::chat::ChatMessage;

/// One stored response.
#[derive(Debug)]
pub(super) struct StoredResponse {
    /// The response this one continued.
    parent: Option<Arc<StoredResponse>>,
    /// This turn's input and output (the instructions are not carried over, as OpenAI's API
    /// documents).
    turn: Vec<ChatMessage>,
    /// The response as it was answered.
    pub(super) object: ResponseObject,
}

impl StoredResponse {
    /// A response continuing `parent` with `turn`.
    pub(super) fn new(parent: Option<Arc<StoredResponse>>, turn: Vec<ChatMessage>, object: ResponseObject) -> Self {
        Self { parent, turn, object }
    }

    /// The whole conversation up to and including this response.
    pub(super) fn conversation(&self) -> Vec<ChatMessage> {
        let mut chain = vec![self];
        while let Some(parent) = chain.last().and_then(|r| r.parent.as_deref()) {
            chain.push(parent);
        }
        chain.iter().rev().flat_map(|r| r.turn.iter().cloned()).collect()
    }
}

impl Drop for StoredResponse {
    /// Drops a long chain one link at a time, not by recursion.
    fn drop(&mut self) {
        let mut parent = self.parent.take();
        while let Some(link) = parent {
            parent = match Arc::try_unwrap(link) {
                Ok(mut only) => only.parent.take(),
                Err(_) => None,
            };
        }
    }
}

/// The store.
#[derive(Debug)]
pub(crate) struct ResponseStore {
    /// `None`: storing is off.
    entries: Option<Mutex<LruCache<String, Arc<StoredResponse>>>>,
}

impl ResponseStore {
    /// A store of at most `capacity` responses (0: none are stored).
    pub(crate) fn new(capacity: usize) -> Self {
        Self { entries: NonZeroUsize::new(capacity).map(|n| Mutex::new(LruCache::new(n))) }
    }

    /// Whether responses are stored at all.
    pub(super) fn enabled(&self) -> bool {
        self.entries.is_some()
    }

    /// Stores `response` under its id.
    pub(super) fn put(&self, response: Arc<StoredResponse>) {
        if let Some(entries) = &self.entries {
            entries.lock().put(response.object.id.clone(), response);
        }
    }

    /// The response stored under `id` (now the most recently used).
    pub(super) fn get(&self, id: &str) -> Option<Arc<StoredResponse>> {
        self.entries.as_ref()?.lock().get(id).cloned()
    }

    /// Removes the response stored under `id`; whether there was one.
    pub(super) fn remove(&self, id: &str) -> bool {
        self.entries.as_ref().is_some_and(|entries| entries.lock().pop(id).is_some())
    }
}
