//! The projector (`--mmproj`, llama.cpp's libmtmd): media bytes into the tokens a prompt holds
//! and the embeddings the context evaluates at their place.
//!
//! Decoding and tokenizing (libmtmd's image resize and normalisation, an audio clip's
//! spectrogram) run on the thread that converts a request ([`MediaPreparer::prepare`], through
//! the engine's handle); only the projector's graph (the encoding) and the decoding of its
//! embeddings run on the inference thread ([`Projector::evaluate`]). libmtmd's tokenizing reads
//! its context only (`mtmd_tokenize` takes it `const`), its encoding writes it: a read-write
//! lock lets any number of conversions tokenize while no evaluation runs.

use std::ffi::CString;
use std::path::Path;
use std::sync::Arc;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::mtmd::{
    mtmd_default_marker, MtmdBitmap, MtmdContext, MtmdContextParams, MtmdInputChunkType, MtmdInputChunks, MtmdInputText,
};
use llama_cpp_2::token::LlamaToken;
use parking_lot::{Mutex, RwLock};

use super::segments::SegmentCache;
use super::{placeholder_tokens, MediaId, MediaInput, MediaKind, MediaSupport};
use crate::engine::store::StateBytes;
use crate::engine::EngineError;

/// Bytes of preprocessed input libmtmd holds for each image embedding, at most: 16 × 16-pixel
/// patches merged 4 × 4, three `f32` a pixel (SmolVLM's 512-pixel tiles into 64 embeddings;
/// Gemma 3 holds 37,632, LLaVA-style projectors fewer). libmtmd does not say what it holds,
/// so a picture's segment is counted as this many bytes per embedding.
const IMAGE_BYTES_PER_EMBEDDING: usize = 16 * 16 * 16 * 3 * 4;

/// What the projector made of one media: its tokens (the model's text around the media and
/// placeholders for its embeddings) and libmtmd's chunks, which evaluate them.
pub(crate) struct Segment {
    /// The media it was made of.
    pub(crate) id: MediaId,
    /// The tokens it occupies in a prompt.
    pub(crate) tokens: Vec<LlamaToken>,
    /// Image or audio.
    pub(crate) kind: MediaKind,
    /// Bytes it holds, counted in `--cache-ram` while kept (an upper estimate: the tokens and
    /// the preprocessed input, see [`IMAGE_BYTES_PER_EMBEDDING`]; a clip's spectrogram is
    /// counted as its samples, four bytes each, which no spectrogram of up to 160 bands at
    /// libmtmd's 10 ms hop exceeds).
    bytes: usize,
    chunks: MtmdInputChunks,
}

impl StateBytes for Segment {
    fn byte_len(&self) -> usize {
        self.bytes
    }
}

/// The media of one request, prepared off the inference thread: the job holds them until it
/// is served, whatever the cache evicts meanwhile.
#[derive(Default)]
pub(crate) struct PreparedMedia(Vec<Arc<Segment>>);

impl std::fmt::Debug for PreparedMedia {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PreparedMedia").field(&self.0.len()).finish()
    }
}

/// What the kept media hold, for `/cache` and `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MediaCacheStatus {
    /// Media kept decoded and tokenized.
    pub entries: u32,
    /// Bytes they hold (see the segment's estimate in `docs/serving.md`).
    pub used_bytes: u64,
    /// Their share of `--cache-ram`.
    pub budget_bytes: u64,
}

/// The libmtmd context and the media it prepared, shared by the inference thread (which
/// evaluates) and the handles (which prepare, on the threads requests are converted on).
pub(crate) struct MediaPreparer {
    ctx: RwLock<MtmdContext>,
    support: Mutex<MediaSupport>,
    segments: Mutex<SegmentCache<Segment>>,
    /// The model the context reads its vocabulary from: kept alive while the context is
    /// (dropped after it: fields drop in order).
    _model: Arc<LlamaModel>,
}

impl MediaPreparer {
    /// What it takes.
    pub(crate) fn support(&self) -> MediaSupport {
        self.support.lock().clone()
    }

    /// Evaluates `segment` into sequence `seq` of `target` at positions `n_past..`: its text
    /// through llama.cpp, its media encoded and its embeddings decoded in batches of
    /// `n_batch`. No logits.
    ///
    /// # Errors
    /// Encoding or decoding failed (the caller drops what the sequence holds).
    pub(crate) fn evaluate(
        &self,
        segment: &Segment,
        target: &mut LlamaContext<'_>,
        n_past: usize,
        seq: i32,
        n_batch: usize,
    ) -> Result<(), EngineError> {
        let n_past = i32::try_from(n_past).map_err(|_| EngineError::Decode("position out of range".into()))?;
        let n_batch = i32::try_from(n_batch).unwrap_or(i32::MAX);
        segment
            .chunks
            .eval_chunks(&mut self.ctx.write(), target, n_past, seq, n_batch, false)
            .map(drop)
            .map_err(|e| EngineError::Decode(format!("evaluating {}: {e}", segment.kind.as_str())))
    }

    /// The samples per second audio is resampled to (none without audio).
    fn audio_sample_rate(&self) -> Option<u32> {
        self.ctx.read().get_audio_sample_rate()
    }

    /// `media` decoded and tokenized (or found among the kept ones), on the calling thread.
    ///
    /// # Errors
    /// As [`MediaPreparer::prepare`], for the first part that fails.
    pub(crate) fn prepare_all(&self, media: &[MediaInput]) -> Result<PreparedMedia, EngineError> {
        media.iter().map(|input| self.prepare(input)).collect::<Result<_, _>>().map(PreparedMedia)
    }

    /// `input` decoded and tokenized (or found among the kept ones), on the calling thread.
    ///
    /// # Errors
    /// [`EngineError::Media`] naming the part: a kind the projector does not take, bytes that
    /// do not decode as that kind, a clip longer than allowed.
    pub(crate) fn prepare(&self, input: &MediaInput) -> Result<Arc<Segment>, EngineError> {
        if let Some(segment) = self.segments.lock().get(&input.id) {
            return Ok(segment);
        }
        let refuse = |reason: String| EngineError::Media { part: input.part.clone(), reason };
        self.support.lock().check(input.kind).map_err(refuse)?;
        // Whoever made the input (the API checks its parts, a library caller may not), libmtmd
        // sees only bytes whose decoding is bounded.
        super::check_media(input.kind, &input.bytes, None).map_err(refuse)?;
        fail::fail_point!("media::decode");
        let ctx = self.ctx.read();
        let bitmap = MtmdBitmap::from_buffer(&ctx, &input.bytes, false)
            .map_err(|_| refuse(format!("the {} could not be decoded", input.kind.as_str())))?;
        let decoded = if bitmap.is_audio() { MediaKind::Audio } else { MediaKind::Image };
        if decoded != input.kind {
            return Err(refuse(format!("sent as {} but holds {}", input.kind.as_str(), decoded.as_str())));
        }
        if let (MediaKind::Audio, Some(rate)) = (decoded, ctx.get_audio_sample_rate()) {
            let seconds = u64::from(bitmap.nx()) / u64::from(rate.max(1));
            if seconds > super::MAX_AUDIO_SECONDS {
                return Err(refuse(format!("{seconds} s of audio; at most {} s", super::MAX_AUDIO_SECONDS)));
            }
        }
        let segment = Arc::new(tokenize(&ctx, input.id, input.kind, &bitmap).map_err(refuse)?);
        drop(ctx);
        self.segments.lock().insert(input.id, Arc::clone(&segment));
        Ok(segment)
    }

    /// What the kept media hold.
    pub(crate) fn status(&self) -> MediaCacheStatus {
        let segments = self.segments.lock();
        MediaCacheStatus {
            entries: segments.len() as u32,
            used_bytes: segments.used() as u64,
            budget_bytes: segments.budget() as u64,
        }
    }
}

/// The tokens and chunks of one decoded media.
fn tokenize(ctx: &MtmdContext, id: MediaId, kind: MediaKind, bitmap: &MtmdBitmap) -> Result<Segment, String> {
    let text = MtmdInputText { text: mtmd_default_marker().to_string(), add_special: false, parse_special: true };
    let chunks = ctx.tokenize(text, &[bitmap]).map_err(|e| format!("the projector refused it: {e}"))?;
    let mut tokens = Vec::with_capacity(chunks.total_tokens());
    let mut embeddings = 0;
    for index in 0..chunks.len() {
        let chunk = chunks.get(index).ok_or("the projector lost a chunk")?;
        match chunk.chunk_type() {
            MtmdInputChunkType::Text => tokens.extend_from_slice(chunk.text_tokens().unwrap_or_default()),
            MtmdInputChunkType::Image | MtmdInputChunkType::Audio => {
                embeddings += chunk.n_tokens();
                tokens.extend(placeholder_tokens(id, index, chunk.n_tokens()));
            }
        }
    }
    if tokens.is_empty() {
        return Err("the projector made no tokens of it".into());
    }
    let input_bytes = match kind {
        MediaKind::Image => embeddings.saturating_mul(IMAGE_BYTES_PER_EMBEDDING),
        MediaKind::Audio => bitmap.data().len(),
    };
    let bytes = input_bytes.saturating_add(tokens.len() * std::mem::size_of::<LlamaToken>());
    Ok(Segment { id, tokens, kind, bytes, chunks })
}

/// A loaded projector, as the inference thread holds it: the shared context, and the media of
/// the job being served.
pub(crate) struct Projector {
    shared: Arc<MediaPreparer>,
    held: Vec<Arc<Segment>>,
}

impl Projector {
    /// Loads the projector at `path` for `model`.
    ///
    /// # Errors
    /// The file cannot be read or libmtmd refuses it; a model whose positions are M-RoPE
    /// (the Qwen2-VL family: a media's positions differ from its token count).
    /// `media_budget`: the bytes of `--cache-ram` the prepared media may hold.
    pub(crate) fn load(
        path: &Path,
        model: &Arc<LlamaModel>,
        threads: u32,
        use_gpu: bool,
        media_budget: usize,
    ) -> Result<Self, EngineError> {
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
        let shared = MediaPreparer {
            ctx: RwLock::new(ctx),
            support: Mutex::new(support),
            segments: Mutex::new(SegmentCache::new(media_budget)),
            _model: Arc::clone(model),
        };
        Ok(Self { shared: Arc::new(shared), held: Vec::new() })
    }

    /// What it takes.
    pub(crate) fn support(&self) -> MediaSupport {
        self.shared.support()
    }

    /// Refuses every media input from now on, for `reason`.
    pub(crate) fn refuse(&mut self, reason: String) {
        self.shared.support.lock().refused = Some(reason);
    }

    /// The part the handles share, to prepare media.
    pub(crate) fn preparer(&self) -> Arc<MediaPreparer> {
        Arc::clone(&self.shared)
    }

    /// Holds the media a job brought, prepared, until the next job: found by
    /// [`Projector::segment`] whatever the kept media evicted meanwhile.
    pub(crate) fn hold(&mut self, media: PreparedMedia) {
        self.held = media.0;
    }

    /// `input`'s segment: the one `brought` holds (a job served beside the held one's, in a
    /// lane), else the one the held job brought, else a kept one, else prepared now (on the
    /// inference thread: a caller that queued without preparing).
    ///
    /// # Errors
    /// As [`MediaPreparer::prepare`].
    pub(crate) fn segment(&mut self, input: &MediaInput, brought: &PreparedMedia) -> Result<Arc<Segment>, EngineError> {
        match brought.0.iter().chain(&self.held).find(|segment| segment.id == input.id) {
            Some(segment) => Ok(Arc::clone(segment)),
            None => self.shared.prepare(input),
        }
    }

    /// Evaluates `segment` into sequence 0 of `target` (see [`MediaPreparer::evaluate`]).
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
        self.shared.evaluate(segment, target, n_past, 0, n_batch)
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
                let rate = self.shared.audio_sample_rate().unwrap_or(16_000) as usize;
                let pitch = 220.0 * f32::from(u16::try_from(seed % 8 + 1).unwrap_or(1));
                let samples: Vec<f32> =
                    (0..rate).map(|i| 0.5 * (std::f32::consts::TAU * pitch * i as f32 / rate as f32).sin()).collect();
                MtmdBitmap::from_audio_data(&samples)
            }
        }
        .map_err(|e| fail(e.to_string()))?;
        let id = MediaId::of(kind, &seed.to_le_bytes());
        tokenize(&self.shared.ctx.read(), id, kind, &bitmap).map(Arc::new).map_err(fail)
    }
}
