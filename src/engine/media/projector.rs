//! The projector (`--mmproj`, llama.cpp's libmtmd): media bytes into the tokens a prompt holds
//! and the embeddings the context evaluates at their place. Owned by the inference thread.

use std::ffi::CString;
use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Arc;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::mtmd::{
    mtmd_default_marker, MtmdBitmap, MtmdContext, MtmdContextParams, MtmdInputChunkType, MtmdInputChunks, MtmdInputText,
};
use llama_cpp_2::token::LlamaToken;
use lru::LruCache;

use super::{placeholder_tokens, MediaId, MediaInput, MediaKind, MediaSupport};
use crate::engine::EngineError;

/// Media kept decoded and tokenized, by identity: a conversation re-sends its pictures every
/// turn, and decoding a photo costs more than comparing its hash.
const SEGMENTS_KEPT: usize = 32;

/// What the projector made of one media: its tokens (the model's text around the media and
/// placeholders for its embeddings) and libmtmd's chunks, which evaluate them.
pub(crate) struct Segment {
    /// The tokens it occupies in a prompt.
    pub(crate) tokens: Vec<LlamaToken>,
    /// Image or audio.
    pub(crate) kind: MediaKind,
    chunks: MtmdInputChunks,
}

/// A loaded projector, and the media it made recently.
pub(crate) struct Projector {
    ctx: MtmdContext,
    support: MediaSupport,
    segments: LruCache<MediaId, Arc<Segment>>,
}

impl Projector {
    /// Loads the projector at `path` for `model`.
    ///
    /// # Errors
    /// The file cannot be read or libmtmd refuses it; a model whose positions are M-RoPE
    /// (the Qwen2-VL family: a media's positions differ from its token count).
    pub(crate) fn load(path: &Path, model: &LlamaModel, threads: u32, use_gpu: bool) -> Result<Self, EngineError> {
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let fail = |reason: String| EngineError::LoadFailed(format!("--mmproj {}: {reason}", path.display()));
        std::fs::File::open(path).map_err(|e| fail(e.to_string()))?;
        let params = MtmdContextParams {
            use_gpu,
            print_timings: false,
            n_threads: threads.max(1) as i32,
            media_marker: CString::new(mtmd_default_marker()).map_err(|e| fail(e.to_string()))?,
            ..MtmdContextParams::default()
        };
        let path_text = path.to_str().ok_or_else(|| fail("the path is not UTF-8".into()))?;
        let ctx = MtmdContext::init_from_file(path_text, model, &params)
            .map_err(|e| fail(format!("{e} (not a projector for this model? llama.cpp's log says more)")))?;
        if ctx.decode_use_mrope() {
            return Err(fail("models with M-RoPE positions (the Qwen2-VL family) are not supported yet".into()));
        }
        let support = MediaSupport {
            projector: Some(name),
            image: ctx.support_vision(),
            audio: ctx.support_audio(),
            refused: None,
        };
        let kept = NonZeroUsize::new(SEGMENTS_KEPT).unwrap_or(NonZeroUsize::MIN);
        Ok(Self { ctx, support, segments: LruCache::new(kept) })
    }

    /// What it takes.
    pub(crate) fn support(&self) -> &MediaSupport {
        &self.support
    }

    /// Refuses every media input from now on, for `reason`.
    pub(crate) fn refuse(&mut self, reason: String) {
        self.support.refused = Some(reason);
    }

    /// The samples per second audio is resampled to (none without audio).
    pub(crate) fn audio_sample_rate(&self) -> Option<u32> {
        self.ctx.get_audio_sample_rate()
    }

    /// `input` decoded and tokenized (or found among the recent ones).
    ///
    /// # Errors
    /// [`EngineError::Media`] naming the part: a kind the projector does not take, bytes that
    /// do not decode as that kind, a clip longer than allowed.
    pub(crate) fn segment(&mut self, input: &MediaInput) -> Result<Arc<Segment>, EngineError> {
        if let Some(segment) = self.segments.get(&input.id) {
            return Ok(Arc::clone(segment));
        }
        let refuse = |reason: String| EngineError::Media { part: input.part.clone(), reason };
        self.support.check(input.kind).map_err(refuse)?;
        // Whoever made the input (the API checks its parts, a library caller may not), libmtmd
        // sees only bytes whose decoding is bounded.
        super::check_media(input.kind, &input.bytes, None).map_err(refuse)?;
        let bitmap = MtmdBitmap::from_buffer(&self.ctx, &input.bytes, false)
            .map_err(|_| refuse(format!("the {} could not be decoded", input.kind.as_str())))?;
        let decoded = if bitmap.is_audio() { MediaKind::Audio } else { MediaKind::Image };
        if decoded != input.kind {
            return Err(refuse(format!("sent as {} but holds {}", input.kind.as_str(), decoded.as_str())));
        }
        if let (MediaKind::Audio, Some(rate)) = (decoded, self.audio_sample_rate()) {
            let seconds = u64::from(bitmap.nx()) / u64::from(rate.max(1));
            if seconds > super::MAX_AUDIO_SECONDS {
                return Err(refuse(format!("{seconds} s of audio; at most {} s", super::MAX_AUDIO_SECONDS)));
            }
        }
        let segment = Arc::new(self.tokenize(input.id, input.kind, &bitmap).map_err(refuse)?);
        self.segments.put(input.id, Arc::clone(&segment));
        Ok(segment)
    }

    /// The tokens and chunks of one decoded media.
    fn tokenize(&self, id: MediaId, kind: MediaKind, bitmap: &MtmdBitmap) -> Result<Segment, String> {
        let text = MtmdInputText { text: mtmd_default_marker().to_string(), add_special: false, parse_special: true };
        let chunks = self.ctx.tokenize(text, &[bitmap]).map_err(|e| format!("the projector refused it: {e}"))?;
        let mut tokens = Vec::with_capacity(chunks.total_tokens());
        for index in 0..chunks.len() {
            let chunk = chunks.get(index).ok_or("the projector lost a chunk")?;
            match chunk.chunk_type() {
                MtmdInputChunkType::Text => tokens.extend_from_slice(chunk.text_tokens().unwrap_or_default()),
                MtmdInputChunkType::Image | MtmdInputChunkType::Audio => {
                    tokens.extend(placeholder_tokens(id, index, chunk.n_tokens()));
                }
            }
        }
        if tokens.is_empty() {
            return Err("the projector made no tokens of it".into());
        }
        Ok(Segment { tokens, kind, chunks })
    }

    /// Evaluates `segment` into `target` at positions `n_past..`: its text through llama.cpp,
    /// its media encoded and its embeddings decoded in batches of `n_batch`. No logits.
    ///
    /// # Errors
    /// Encoding or decoding failed (the caller clears the cache).
    pub(crate) fn evaluate(
        &mut self,
        segment: &Segment,
        target: &mut LlamaContext<'_>,
        n_past: usize,
        n_batch: usize,
    ) -> Result<(), EngineError> {
        let n_past = i32::try_from(n_past).map_err(|_| EngineError::Decode("position out of range".into()))?;
        let n_batch = i32::try_from(n_batch).unwrap_or(i32::MAX);
        segment
            .chunks
            .eval_chunks(&mut self.ctx, target, n_past, 0, n_batch, false)
            .map(drop)
            .map_err(|e| EngineError::Decode(format!("evaluating {}: {e}", segment.kind.as_str())))
    }

    /// A synthetic input of `kind` (for the load-time probe): an image of a pattern drawn from
    /// `seed`, or a second of a tone whose pitch `seed` sets.
    pub(crate) fn synthetic(&self, kind: MediaKind, seed: u32) -> Result<Arc<Segment>, EngineError> {
        let fail = |e: String| EngineError::LoadFailed(format!("probing the projector: {e}"));
        let bitmap = match kind {
            MediaKind::Image => {
                let side = 64u32;
                let mut rng = fastrand::Rng::with_seed(u64::from(seed));
                let pixels: Vec<u8> = (0..side * side * 3).map(|_| rng.u8(..)).collect();
                MtmdBitmap::from_image_data(side, side, &pixels)
            }
            MediaKind::Audio => {
                let rate = self.audio_sample_rate().unwrap_or(16_000) as usize;
                let pitch = 220.0 * f32::from(u16::try_from(seed % 8 + 1).unwrap_or(1));
                let samples: Vec<f32> =
                    (0..rate).map(|i| 0.5 * (std::f32::consts::TAU * pitch * i as f32 / rate as f32).sin()).collect();
                MtmdBitmap::from_audio_data(&samples)
            }
        }
        .map_err(|e| fail(e.to_string()))?;
        let id = MediaId::of(kind, &seed.to_le_bytes());
        self.tokenize(id, kind, &bitmap).map(Arc::new).map_err(fail)
    }
}
