//! Stored responses, for `previous_response_id` and `GET /v1/responses/{id}`: an in-memory
//! store bounded in count and in bytes, least recently used out first. Each response keeps its
//! own turn (input and output as chat messages) and a link to the response it continued, so a
//! chain shares its history instead of copying it; a response evicted from the store stays
//! alive as long as a stored later one continues it. So that the bytes bound holds, each
//! response is charged for its whole chain (what it keeps alive), and a chain is at most
//! [`MAX_RESPONSE_CHAIN`] responses long.

use crate::engine::media::MediaInput;
use std::num::NonZeroUsize;
use std::sync::Arc;

use lru::LruCache;
use parking_lot::Mutex;

use super::wire::ResponseObject;
use crate::api::limits::MAX_RESPONSE_CHAIN;
use crate::chat::ChatMessage;

/// What one message costs beside its texts (its struct and allocations), in bytes.
const MESSAGE_OVERHEAD: usize = 160;

/// One stored response.
#[derive(Debug)]
pub(super) struct StoredResponse {
    /// The response this one continued.
    parent: Option<Arc<StoredResponse>>,
    /// This turn's input and output (the instructions are not carried over, as OpenAI's API
    /// documents).
    turn: Vec<ChatMessage>,
    /// The media this turn's input held (its messages hold their markers).
    media: Vec<MediaInput>,
    /// The response as it was answered.
    pub(super) object: ResponseObject,
    /// Responses in the chain up to this one, this one included.
    length: usize,
    /// Bytes this response and those it continues hold.
    chain_bytes: usize,
}

impl StoredResponse {
    /// A response continuing `parent` with `turn`.
    pub(super) fn new(
        parent: Option<Arc<StoredResponse>>,
        turn: Vec<ChatMessage>,
        media: Vec<MediaInput>,
        object: ResponseObject,
    ) -> Self {
        let own = turn.iter().map(message_bytes).sum::<usize>()
            + media.iter().map(|m| m.bytes.len()).sum::<usize>()
            + object_bytes(&object);
        let (length, chain_bytes) = match &parent {
            Some(parent) => (parent.length + 1, parent.chain_bytes + own),
            None => (1, own),
        };
        Self { parent, turn, media, object, length, chain_bytes }
    }

    /// The media of the whole conversation up to and including this response.
    pub(super) fn media(&self) -> Vec<MediaInput> {
        let mut media: Vec<MediaInput> = Vec::new();
        let mut link = Some(self);
        while let Some(response) = link {
            media.extend(
                response
                    .media
                    .iter()
                    .filter(|m| !media.iter().any(|held| held.id == m.id))
                    .cloned()
                    .collect::<Vec<_>>(),
            );
            link = response.parent.as_deref();
        }
        media
    }

    /// Responses in the chain up to this one, this one included.
    pub(super) fn chain_length(&self) -> usize {
        self.length
    }

    /// Messages in the whole conversation up to and including this response.
    pub(super) fn message_count(&self) -> usize {
        let mut count = self.turn.len();
        let mut link = self.parent.as_deref();
        while let Some(response) = link {
            count += response.turn.len();
            link = response.parent.as_deref();
        }
        count
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

/// The bytes a message's texts take, with its overhead.
fn message_bytes(message: &ChatMessage) -> usize {
    let calls: usize = message.tool_calls.iter().map(|c| c.id.len() + c.name.len() + c.arguments.len()).sum();
    let texts = message.content.len()
        + message.name.as_ref().map_or(0, String::len)
        + message.tool_call_id.as_ref().map_or(0, String::len)
        + message.reasoning.as_ref().map_or(0, String::len);
    MESSAGE_OVERHEAD + texts + calls
}

/// The bytes a response object takes: about twice its JSON (parsed values take more than
/// their text), its echo counted when the request was converted, so that storing a response
/// counts only its output on the async runtime.
fn object_bytes(object: &ResponseObject) -> usize {
    2 * (json_bytes(&object.output) + object.echo.json_bytes + 256)
}

/// The length of `value` as JSON, counted, not written.
pub(super) fn json_bytes(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// The store.
#[derive(Debug)]
pub(crate) struct ResponseStore {
    /// `None`: storing is off.
    entries: Option<Mutex<Entries>>,
}

/// The stored responses and what they are charged.
#[derive(Debug)]
struct Entries {
    responses: LruCache<String, Arc<StoredResponse>>,
    /// The sum of the stored responses' chain bytes.
    bytes: usize,
    max_bytes: usize,
}

impl ResponseStore {
    /// Default bytes bound of a store.
    pub(crate) const DEFAULT_MAX_BYTES: usize = 256 << 20;

    /// A store of at most `capacity` responses (0: none are stored) and the default bytes.
    #[cfg(test)]
    pub(crate) fn new(capacity: usize) -> Self {
        Self::bounded(capacity, Self::DEFAULT_MAX_BYTES)
    }

    /// A store of at most `capacity` responses holding at most `max_bytes` (each response
    /// charged for its chain); 0 for either: none are stored.
    pub(crate) fn bounded(capacity: usize, max_bytes: usize) -> Self {
        let capacity = NonZeroUsize::new(capacity).filter(|_| max_bytes > 0);
        Self { entries: capacity.map(|n| Mutex::new(Entries { responses: LruCache::new(n), bytes: 0, max_bytes })) }
    }

    /// Whether responses are stored at all.
    pub(super) fn enabled(&self) -> bool {
        self.entries.is_some()
    }

    /// Stores `response` under its id, dropping the least recently used ones until the store
    /// is within its bounds; one charged more than the whole store holds is not stored.
    /// Whether it was stored.
    pub(super) fn put(&self, response: Arc<StoredResponse>) -> bool {
        let Some(entries) = &self.entries else { return false };
        let mut entries = entries.lock();
        let charge = response.chain_bytes;
        if charge > entries.max_bytes || response.length > MAX_RESPONSE_CHAIN {
            tracing::warn!(
                "response {} not stored: its conversation takes {charge} bytes, the store holds {}",
                response.object.id,
                entries.max_bytes
            );
            return false;
        }
        while entries.bytes + charge > entries.max_bytes {
            match entries.responses.pop_lru() {
                Some((_, old)) => entries.bytes -= old.chain_bytes,
                None => break,
            }
        }
        entries.bytes += charge;
        if let Some((_, old)) = entries.responses.push(response.object.id.clone(), response) {
            entries.bytes -= old.chain_bytes;
        }
        true
    }

    /// The response stored under `id` (now the most recently used).
    pub(super) fn get(&self, id: &str) -> Option<Arc<StoredResponse>> {
        self.entries.as_ref()?.lock().responses.get(id).cloned()
    }

    /// Removes the response stored under `id`; whether there was one.
    pub(super) fn remove(&self, id: &str) -> bool {
        let Some(entries) = &self.entries else { return false };
        let mut entries = entries.lock();
        match entries.responses.pop(id) {
            Some(old) => {
                entries.bytes -= old.chain_bytes;
                true
            }
            None => false,
        }
    }

    /// The bytes the stored responses are charged, and how many there are.
    #[cfg(test)]
    pub(super) fn usage(&self) -> (usize, usize) {
        self.entries.as_ref().map_or((0, 0), |e| {
            let e = e.lock();
            (e.bytes, e.responses.len())
        })
    }
}
