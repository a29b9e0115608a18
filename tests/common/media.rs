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

/// A 2 × 2 red BMP whose rows run top-down (a negative height).
pub(crate) fn top_down_bmp() -> Vec<u8> {
    let mut out = bmp(2, 2, |_, _| [220, 20, 20]);
    out[22..26].copy_from_slice(&(-2i32).to_le_bytes());
    out
}

/// A 2 × 2 red BMP with an OS/2 header (BITMAPCOREHEADER: 16-bit width and height).
pub(crate) fn os2_bmp() -> Vec<u8> {
    let mut out = b"BM".to_vec();
    out.extend_from_slice(&(26u32 + 16).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&26u32.to_le_bytes());
    out.extend_from_slice(&12u32.to_le_bytes());
    for field in [2u16, 2, 1, 24] {
        out.extend_from_slice(&field.to_le_bytes());
    }
    for _ in 0..2 {
        out.extend_from_slice(&[20, 20, 220, 20, 20, 220, 0, 0]);
    }
    out
}

/// CRC-32 (PNG's chunk checksum).
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// Deflate's bits, least significant first.
#[derive(Default)]
struct Bits {
    out: Vec<u8>,
    pending: u64,
    count: u32,
}

impl Bits {
    fn put(&mut self, value: u32, bits: u32) {
        self.pending |= u64::from(value) << self.count;
        self.count += bits;
        while self.count >= 8 {
            self.out.push(self.pending as u8);
            self.pending >>= 8;
            self.count -= 8;
        }
    }

    /// A Huffman code: its bits go most significant first.
    fn code(&mut self, code: u32, bits: u32) {
        self.put(code.reverse_bits() >> (32 - bits), bits);
    }

    fn finish(mut self) -> Vec<u8> {
        if self.count > 0 {
            self.out.push(self.pending as u8);
        }
        self.out
    }
}

/// A zlib stream of `len` zero bytes: one fixed-Huffman block, a literal zero and then
/// repeats of the longest match (258 bytes one back), about 13 bits per 258 bytes.
fn zlib_zeros(len: u64) -> Vec<u8> {
    let mut bits = Bits::default();
    bits.put(1, 1); // the last block
    bits.put(1, 2); // fixed Huffman codes
    let literal_zero = |bits: &mut Bits| bits.code(0x30, 8);
    literal_zero(&mut bits);
    for _ in 0..(len - 1) / 258 {
        bits.code(0xC5, 8); // length 258 (symbol 285)
        bits.code(0, 5); // distance 1
    }
    for _ in 0..(len - 1) % 258 {
        literal_zero(&mut bits);
    }
    bits.code(0, 7); // end of block
    let mut out = vec![0x78, 0x01];
    out.extend_from_slice(&bits.finish());
    // Adler-32 of zeros: a stays 1, b adds it once per byte.
    let adler = (((len % 65_521) as u32) << 16) | 1;
    out.extend_from_slice(&adler.to_be_bytes());
    out
}

/// A black 8-bit grey PNG of `side` × `side` pixels (small: its rows compress to almost
/// nothing), with a `tEXt` chunk holding `text`.
pub(crate) fn black_png(side: u32, text: &[u8]) -> Vec<u8> {
    let chunk = |out: &mut Vec<u8>, kind: &[u8], data: &[u8]| {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let start = out.len();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        let crc = crc32(&out[start..]);
        out.extend_from_slice(&crc.to_be_bytes());
    };
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut header = Vec::new();
    header.extend_from_slice(&side.to_be_bytes());
    header.extend_from_slice(&side.to_be_bytes());
    header.extend_from_slice(&[8, 0, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &header);
    chunk(&mut out, b"tEXt", &[b"Comment\0".as_slice(), text].concat());
    // Each row: filter byte 0, then one byte a pixel.
    chunk(&mut out, b"IDAT", &zlib_zeros(u64::from(side) * (u64::from(side) + 1)));
    chunk(&mut out, b"IEND", &[]);
    out
}
