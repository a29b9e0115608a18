//! The media kept decoded and tokenized, by identity (pure): a conversation re-sends its
//! pictures every turn, and decoding a photo costs more than comparing its hash. Bounded by a
//! count and by bytes, its share of `--cache-ram`; the least recently used go first.

use std::sync::Arc;

use lru::LruCache;

use super::MediaId;
use crate::engine::store::StateBytes;

/// Most media kept, whatever their size.
pub(crate) const SEGMENTS_KEPT: usize = 32;

/// The part of `--cache-ram` (`budget` bytes) the media may hold, with a projector loaded: a
/// quarter. The state store gets the rest.
pub(crate) fn media_share(budget: usize) -> usize {
    budget / 4
}

/// Prepared media under a count and a byte budget, least recently used evicted first.
pub(crate) struct SegmentCache<S> {
    entries: LruCache<MediaId, Arc<S>>,
    budget: usize,
    used: usize,
}

impl<S: StateBytes> SegmentCache<S> {
    /// An empty cache of at most [`SEGMENTS_KEPT`] entries and `budget` bytes.
    pub(crate) fn new(budget: usize) -> Self {
        Self { entries: LruCache::unbounded(), budget, used: 0 }
    }

    /// The media `id`, if kept (now the most recently used).
    pub(crate) fn get(&mut self, id: &MediaId) -> Option<Arc<S>> {
        self.entries.get(id).cloned()
    }

    /// Keeps `segment` as `id`, evicting the least recently used until it fits; false, and
    /// nothing evicted, when it alone is larger than the budget (it is used, not kept).
    pub(crate) fn insert(&mut self, id: MediaId, segment: Arc<S>) -> bool {
        let bytes = segment.byte_len();
        if bytes > self.budget {
            return false;
        }
        if let Some(old) = self.entries.pop(&id) {
            self.used -= old.byte_len();
        }
        while self.entries.len() >= SEGMENTS_KEPT || self.used + bytes > self.budget {
            let Some((_, evicted)) = self.entries.pop_lru() else { break };
            self.used -= evicted.byte_len();
        }
        self.used += bytes;
        self.entries.put(id, segment);
        true
    }

    /// Entries kept.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Bytes held.
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    /// The byte budget.
    pub(crate) fn budget(&self) -> usize {
        self.budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::media::MediaKind;

    struct Sized(usize);

    impl StateBytes for Sized {
        fn byte_len(&self) -> usize {
            self.0
        }
    }

    fn id(n: u32) -> MediaId {
        MediaId::of(MediaKind::Image, &n.to_le_bytes())
    }

    #[test]
    fn bytes_stay_within_the_budget_and_the_least_recently_used_go_first() {
        let mut cache = SegmentCache::new(100);
        assert!(cache.insert(id(1), Arc::new(Sized(40))));
        assert!(cache.insert(id(2), Arc::new(Sized(40))));
        assert!(cache.get(&id(1)).is_some(), "1 is now the most recently used");
        assert!(cache.insert(id(3), Arc::new(Sized(40))));
        assert_eq!((cache.len(), cache.used()), (2, 80));
        assert!(cache.get(&id(2)).is_none(), "2 was the least recently used");
        assert!(cache.get(&id(1)).is_some() && cache.get(&id(3)).is_some());
        assert!(!cache.insert(id(4), Arc::new(Sized(101))), "larger than the budget: not kept");
        assert_eq!((cache.len(), cache.used()), (2, 80), "and nothing evicted for it");
        assert!(cache.insert(id(3), Arc::new(Sized(10))), "the same media again replaces itself");
        assert_eq!((cache.len(), cache.used()), (2, 50));
    }

    #[test]
    fn no_more_than_the_count_are_kept_however_small() {
        let mut cache = SegmentCache::new(usize::MAX);
        for n in 0..(SEGMENTS_KEPT as u32 + 5) {
            assert!(cache.insert(id(n), Arc::new(Sized(1))));
        }
        assert_eq!(cache.len(), SEGMENTS_KEPT);
        assert!(cache.get(&id(0)).is_none() && cache.get(&id(SEGMENTS_KEPT as u32 + 4)).is_some());
    }

    #[test]
    fn a_zero_budget_keeps_nothing() {
        let mut cache = SegmentCache::new(0);
        assert!(!cache.insert(id(1), Arc::new(Sized(1))));
        assert_eq!((cache.len(), cache.used(), cache.budget()), (0, 0, 0));
    }
}
