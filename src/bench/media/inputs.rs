//! The media scenario's inputs: known sentences spoken by espeak-ng into WAV clips, and
//! pictures of distinct patterns and colours drawn in code (BMP, which every stb_image-based
//! server reads), each as an OpenAI chat content part.

use std::path::Path;

use base64::Engine as _;
use serde_json::{json, Value};

use super::super::BenchError;

/// The sentences spoken: everyday words, no numbers or names a transcript could write
/// another way.
pub(super) const SENTENCES: [&str; 4] = [
    "The quick brown fox jumps over the lazy dog.",
    "Please turn off the kitchen lights before you go to bed.",
    "The weather tomorrow will be sunny with a light breeze from the west.",
    "Can you remind me to water the plants in the garden this evening?",
];

/// A sentence and its clip.
#[derive(Clone, Debug)]
pub(in crate::bench) struct SpokenClip {
    /// What is said.
    pub text: &'static str,
    /// The WAV file espeak-ng wrote.
    pub wav: Vec<u8>,
}

/// Everything the media scenario sends, made once per run.
#[derive(Clone, Debug)]
pub(in crate::bench) struct MediaInputs {
    /// One clip per sentence.
    pub clips: Vec<SpokenClip>,
    /// Distinct pictures, as many as clips.
    pub images: Vec<Vec<u8>>,
}

impl MediaInputs {
    /// Speaks [`SENTENCES`] with espeak-ng and draws the pictures.
    ///
    /// # Errors
    /// [`BenchError::NoEspeak`] when espeak-ng is not installed, [`BenchError::Espeak`] when it
    /// fails.
    pub(in crate::bench) async fn prepare() -> Result<Self, BenchError> {
        let mut clips = Vec::with_capacity(SENTENCES.len());
        for text in SENTENCES {
            clips.push(SpokenClip { text, wav: speak(text).await? });
        }
        Ok(Self { clips, images: pictures() })
    }
}

/// `text` spoken by espeak-ng (`espeak-ng -w OUT.wav -v en TEXT`, a temporary file), as WAV
/// bytes.
async fn speak(text: &str) -> Result<Vec<u8>, BenchError> {
    let path =
        std::env::temp_dir().join(format!("firstword-bench-{}-{:016x}.wav", std::process::id(), fastrand::u64(..)));
    let output = tokio::process::Command::new("espeak-ng")
        .arg("-w")
        .arg(&path)
        .args(["-v", "en", text])
        .output()
        .await
        .map_err(|error| match error.kind() {
            std::io::ErrorKind::NotFound => BenchError::NoEspeak,
            _ => BenchError::Espeak { text: text.into(), message: error.to_string() },
        })?;
    let wav = read_and_remove(&path);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
        return Err(BenchError::Espeak { text: text.into(), message: format!("{}: {stderr}", output.status) });
    }
    wav.map_err(|error| BenchError::Espeak { text: text.into(), message: format!("{}: {error}", path.display()) })
}

fn read_and_remove(path: &Path) -> std::io::Result<Vec<u8>> {
    let bytes = std::fs::read(path);
    let _ = std::fs::remove_file(path);
    bytes
}

/// A chat `input_audio` part holding a WAV clip.
pub(in crate::bench) fn audio_part(wav: &[u8]) -> Value {
    json!({"type": "input_audio", "input_audio": {"data": base64(wav), "format": "wav"}})
}

/// A chat `image_url` part holding a BMP picture as a data URL.
pub(in crate::bench) fn image_part(bmp: &[u8]) -> Value {
    json!({"type": "image_url", "image_url": {"url": format!("data:image/bmp;base64,{}", base64(bmp))}})
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Four pictures no one would describe alike: a red square, a blue and white checkerboard,
/// green stripes on black, a yellow-to-purple gradient.
pub(super) fn pictures() -> Vec<Vec<u8>> {
    vec![
        bmp(64, 64, |_, _| [220, 20, 20]),
        bmp(64, 64, |x, y| if (x / 8 + y / 8) % 2 == 0 { [255, 255, 255] } else { [0, 0, 140] }),
        bmp(64, 64, |_, y| if (y / 6) % 2 == 0 { [20, 200, 40] } else { [0, 0, 0] }),
        bmp(64, 64, |x, y| {
            let t = (x + y) * 255 / 126;
            [(255 - t / 2) as u8, (230 - t * 3 / 4) as u8, (40 + t * 3 / 4) as u8]
        }),
    ]
}

/// A 24-bit BMP of `width` × `height` whose pixel at (x, y) is `color(x, y)` (RGB): the
/// probe's pictures (BMP: every server's decoder reads it, and it needs no compressor).
pub fn bmp(width: u32, height: u32, color: impl Fn(u32, u32) -> [u8; 3]) -> Vec<u8> {
    let row = (width * 3).div_ceil(4) * 4;
    let size = 54 + row * height;
    let mut out = Vec::with_capacity(size as usize);
    out.extend_from_slice(b"BM");
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&54u32.to_le_bytes());
    out.extend_from_slice(&40u32.to_le_bytes());
    out.extend_from_slice(&width.to_le_bytes());
    out.extend_from_slice(&height.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&24u16.to_le_bytes());
    out.extend_from_slice(&[0; 24]);
    // Rows bottom-up, BGR, each padded to four bytes.
    for y in (0..height).rev() {
        let start = out.len();
        for x in 0..width {
            let [r, g, b] = color(x, y);
            out.extend_from_slice(&[b, g, r]);
        }
        out.resize(start + row as usize, 0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pictures_are_distinct_bmps_as_many_as_the_sentences() {
        let pictures = pictures();
        assert_eq!(pictures.len(), SENTENCES.len());
        for (i, picture) in pictures.iter().enumerate() {
            assert_eq!(&picture[..2], b"BM");
            assert_eq!(picture.len(), 54 + 64 * 64 * 3);
            assert_eq!(u32::from_le_bytes(picture[2..6].try_into().expect("4 bytes")) as usize, picture.len());
            assert!(pictures[..i].iter().all(|other| other != picture), "picture {i} repeats one before it");
        }
        // Bottom-up BGR: the red square's first pixel is (B, G, R) = (20, 20, 220).
        assert_eq!(&pictures[0][54..57], &[20, 20, 220]);
    }

    #[test]
    fn parts_carry_base64_in_openai_shapes() {
        assert_eq!(audio_part(b"RIFF")["input_audio"], json!({"data": "UklGRg==", "format": "wav"}));
        assert_eq!(image_part(b"BM")["image_url"]["url"], "data:image/bmp;base64,Qk0=");
    }
}
