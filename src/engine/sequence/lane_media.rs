//! Media in a lane's prompt (a picture or a clip sent while another reply streams): the
//! prompt's chunks stop where a media starts, and a media is evaluated whole, through the
//! projector, into the lane's sequence. A media's encoder run pauses the streaming replies for
//! its length (it cannot be split); the text around it is chunked as any lane's prompt.

use std::sync::Arc;

use super::LiveSequence;
use crate::engine::media::projector::MediaPreparer;
use crate::engine::media::MediaSpan;
use crate::engine::schedule::SeqId;
use crate::engine::EngineError;

/// What a lane's next prompt chunk is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LaneChunk {
    /// Text tokens up to this prompt position (a media starts there, or the chunk ends).
    Text { end: usize },
    /// The media `media[index]`, which starts where the lane's evaluation stands: whole.
    Media { index: usize },
}

/// The next chunk of a prompt whose first `start` tokens are evaluated, at most `wanted`
/// tokens of text (a media whole, whatever `wanted` says), among `media` (in prompt order).
/// `None` when `start` lies inside a media (a prefix that ended there: the caller never
/// shares one).
pub(super) fn next_chunk(start: usize, wanted: usize, prompt_len: usize, media: &[MediaSpan]) -> Option<LaneChunk> {
    let bounds = media.iter().map(|span| (span.start, span.end()));
    next_chunk_of(start, wanted, prompt_len, bounds)
}

/// How a lane's prompt chunk went.
pub(super) enum ChunkOutcome {
    /// Text evaluated; the batch row of its last token's logits.
    Logits(i32),
    /// A media evaluated (no logits: text always follows a media).
    Done,
    /// Stopped midway by sequence 0's leaving client: nothing of it is kept, it goes again.
    Again,
    /// The lane ends with this error.
    Failed(EngineError),
}

/// [`next_chunk`] over the media's `(start, end)` positions.
fn next_chunk_of(
    start: usize,
    wanted: usize,
    prompt_len: usize,
    bounds: impl Iterator<Item = (usize, usize)>,
) -> Option<LaneChunk> {
    let mut end = (start + wanted.max(1)).min(prompt_len);
    for (index, (from, to)) in bounds.enumerate() {
        if from == start {
            return Some(LaneChunk::Media { index });
        }
        if from < start && start < to {
            return None;
        }
        if start < from && from < end {
            end = from;
        }
    }
    Some(LaneChunk::Text { end })
}

impl LiveSequence<'_> {
    /// Lets lanes take requests with media, evaluated through `preparer` (the projector's).
    pub(crate) fn evaluate_lane_media_with(&mut self, preparer: Arc<MediaPreparer>) {
        self.lane_media = Some(preparer);
    }

    /// Whether lanes can evaluate media.
    pub(crate) fn lanes_take_media(&self) -> bool {
        self.lane_media.is_some()
    }

    /// Evaluates `span` into lane `seq` at its start. A decode that sequence 0's leaving
    /// client stopped leaves nothing of it (evaluated again at the next step).
    pub(super) fn lane_media(&mut self, seq: SeqId, span: &MediaSpan) -> ChunkOutcome {
        let Some(preparer) = self.lane_media.clone() else {
            return ChunkOutcome::Failed(EngineError::Internal("a lane's media without a projector".into()));
        };
        match self.decoder.decode_lane_media(seq, &preparer, &span.segment, span.start, self.n_batch) {
            Ok(()) => ChunkOutcome::Done,
            Err(_) if self.decode_stop.as_ref().is_some_and(|stop| stop.requested()) => {
                self.decoder.cut_sequence(seq, span.start);
                ChunkOutcome::Again
            }
            Err(e) => ChunkOutcome::Failed(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{next_chunk_of, LaneChunk};

    #[test]
    fn text_chunks_stop_where_a_media_starts_and_a_media_goes_whole() {
        let media = [(10, 74), (80, 144)];
        let chunk = |start, wanted| next_chunk_of(start, wanted, 150, media.iter().copied());
        assert_eq!(chunk(0, 64), Some(LaneChunk::Text { end: 10 }));
        assert_eq!(chunk(0, 4), Some(LaneChunk::Text { end: 4 }));
        assert_eq!(chunk(10, 4), Some(LaneChunk::Media { index: 0 }));
        assert_eq!(chunk(74, 64), Some(LaneChunk::Text { end: 80 }));
        assert_eq!(chunk(80, 1), Some(LaneChunk::Media { index: 1 }));
        assert_eq!(chunk(144, 64), Some(LaneChunk::Text { end: 150 }));
        assert_eq!(chunk(20, 64), None, "inside a media");
        assert_eq!(next_chunk_of(3, 64, 9, std::iter::empty()), Some(LaneChunk::Text { end: 9 }));
        assert_eq!(next_chunk_of(3, 0, 9, std::iter::empty()), Some(LaneChunk::Text { end: 4 }));
    }
}
