//! Media for the multimodal tests: small BMP pictures and WAV tones built in code, their
//! OpenAI content parts, and the tiny projector fixtures (`scripts/fixtures.sh`).

use std::path::PathBuf;

use base64::Engine as _;
use serde_json::{json, Value};

use firstword::bench::bmp;

use super::model_path;

/// The vision projector fixture (LLaVA `mlp`, 16 tokens per image, for SmolLM2).
pub(crate) fn vision_projector() -> PathBuf {
    model_path("tiny-mmproj-vision.gguf")
}

/// The audio projector fixture (`ultravox`, 60 tokens per 30 s of 16 kHz audio).
pub(crate) fn audio_projector() -> PathBuf {
    model_path("tiny-mmproj-audio.gguf")
}

/// The vision projector whose every image gives the same embeddings.
pub(crate) fn degenerate_projector() -> PathBuf {
    model_path("tiny-mmproj-degenerate.gguf")
}

/// Tokens the vision fixture makes of any image.
pub(crate) const VISION_TOKENS: u32 = 16;
/// Tokens the audio fixture makes of a clip shorter than 30 s.
pub(crate) const AUDIO_TOKENS: u32 = 60;

/// A red picture.
pub(crate) fn red() -> Vec<u8> {
    bmp(64, 64, |_, _| [220, 20, 20])
}

/// A blue and white checkerboard.
pub(crate) fn checkerboard() -> Vec<u8> {
    bmp(48, 80, |x, y| if (x / 8 + y / 8) % 2 == 0 { [255, 255, 255] } else { [0, 0, 120] })
}

/// `seconds` of a `pitch` Hz tone, 16-bit mono PCM WAV at `rate` Hz.
pub(crate) fn tone(seconds: f32, pitch: f32, rate: u32) -> Vec<u8> {
    let frames = (seconds * rate as f32) as u32;
    let mut out = Vec::new();
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + frames * 2).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&(rate * 2).to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&(frames * 2).to_le_bytes());
    for i in 0..frames {
        let sample = (0.4 * (std::f32::consts::TAU * pitch * i as f32 / rate as f32).sin() * 32767.0) as i16;
        out.extend_from_slice(&sample.to_le_bytes());
    }
    out
}

/// Base64, as OpenAI's parts carry it.
pub(crate) fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A chat `image_url` part holding `bytes` as a data URL.
pub(crate) fn image_part(bytes: &[u8]) -> Value {
    json!({"type": "image_url", "image_url": {"url": format!("data:image/bmp;base64,{}", base64(bytes))}})
}

/// A chat `input_audio` part holding a WAV clip.
pub(crate) fn audio_part(wav: &[u8]) -> Value {
    json!({"type": "input_audio", "input_audio": {"data": base64(wav), "format": "wav"}})
}
