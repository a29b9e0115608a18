use proptest::prelude::*;

use super::super::audio::tests::{mp3_header, mp3_of, with_xing, Wav};
use super::super::audio::{MAX_SAMPLE_RATE, MIN_SAMPLE_RATE};
use super::*;

/// The projector fixture's rate (and Whisper's): what the decoder resamples to in the tests.
const OUTPUT_RATE: u32 = 16_000;

/// The most the decoder may allocate for a clip: [`MAX_AUDIO_SECONDS`] at [`OUTPUT_RATE`].
fn allocation_limit() -> u64 {
    AudioBound { frames: MAX_AUDIO_SECONDS, rate: 1 }.decoded_bytes(OUTPUT_RATE)
}

/// A PNG's signature and IHDR declaring `width` × `height`, then `chunks`, no pixel data.
fn png(width: u32, height: u32, chunks: &[u8]) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
    out.extend_from_slice(&width.to_be_bytes());
    out.extend_from_slice(&height.to_be_bytes());
    out.extend_from_slice(&[8, 2, 0, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(chunks);
    out
}

/// A BMP file header and an info header of `header` bytes (12: OS/2, 16-bit sizes) declaring
/// `width` × `height` (negative: top-down rows).
fn bmp(header: u32, width: i32, height: i32) -> Vec<u8> {
    let mut out = b"BM\0\0\0\0\0\0\0\0".to_vec();
    out.extend_from_slice(&(14 + header).to_le_bytes());
    out.extend_from_slice(&header.to_le_bytes());
    if header == 12 {
        out.extend_from_slice(&(width as u16).to_le_bytes());
        out.extend_from_slice(&(height as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&width.to_le_bytes());
        out.extend_from_slice(&height.to_le_bytes());
    }
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&24u16.to_le_bytes());
    out.resize(14 + header as usize, 0);
    out
}

#[test]
fn parts_are_known_by_their_signature_as_libmtmd_knows_them() {
    assert_eq!(sniff(&Wav::pcm(10, 16_000).bytes()), Sniffed::Wav);
    assert_eq!(sniff(&mp3_of(2, mp3_header(9))), Sniffed::Mp3);
    assert_eq!(sniff(&mp3_of(2, mp3_header(9))[15..]), Sniffed::Mp3);
    assert_eq!(sniff(b"fLaC\0\0\0\x22\x10\x00\x10\x00"), Sniffed::Flac);
    assert_eq!(sniff(b"ID3\x04\x00\x00\x00\x00\x00\x00fLaC\0\0\0\x22"), Sniffed::Flac);
    assert_eq!(sniff(&png(2, 2, &[])), Sniffed::Image("png"));
    assert_eq!(sniff(&bmp(40, 2, -2)), Sniffed::Image("bmp"));
    assert_eq!(sniff(b"\xFF\xD8\xFF\xE0\0\x10JFIF\0"), Sniffed::Image("jpeg"));
    assert_eq!(sniff(b"GIF89a\x02\0\x02\0"), Sniffed::Image("gif"));
    // Too short for libmtmd's audio test: stb_image gets it, and reads no such image.
    assert_eq!(sniff(b"ID3\x04\0\0\0"), Sniffed::Unknown);
    assert_eq!(sniff(b"RIFF\0\0\0\0WEBPVP8 "), Sniffed::Unknown);
}

#[test]
fn a_clip_whose_bytes_disagree_with_its_format_is_refused() {
    // The clip: ~4 MB of 8-bit WAV at 1 Hz with an MPEG header planted in its data.
    let mut slow = Wav { bits: 8, ..Wav::pcm(4_000_000, 1) }.bytes();
    slow[1_000..1_004].copy_from_slice(&mp3_header(9));
    let refused = check_media(MediaKind::Audio, &slow, Some("mp3")).expect_err("refused");
    assert!(refused.contains("WAV audio, not mp3"), "{refused}");
    let refused = check_media(MediaKind::Audio, &slow, None).expect_err("refused");
    assert!(refused.contains("1 Hz"), "{refused}");
    let clip = mp3_of(20, mp3_header(9));
    assert!(check_media(MediaKind::Audio, &clip, Some("wav")).expect_err("refused").contains("MP3 audio, not wav"));
    assert!(check_media(MediaKind::Audio, &clip, Some("mp3")).is_ok());
    assert!(check_media(MediaKind::Audio, &clip, None).is_ok());
    let flac = b"fLaC\0\0\0\x22\x10\x00\x10\x00\xFF\xFB\x90\xC4".to_vec();
    assert!(check_media(MediaKind::Audio, &flac, Some("mp3")).expect_err("refused").contains("FLAC"));
    let wav = Wav::pcm(16, 16_000).bytes();
    assert!(check_media(MediaKind::Audio, &wav, Some("flac")).expect_err("refused").contains("wav or mp3"));
    let xing = with_xing(20, mp3_header(9), b"Xing", 5_000_000);
    assert!(check_media(MediaKind::Audio, &xing, None).expect_err("refused").contains("at most"));
}

#[test]
fn a_part_holding_the_other_kind_is_refused_before_any_decoder_runs() {
    // A 10,000 × 10,000 PNG with an MPEG frame header planted in a text chunk.
    let mut text = b"\x00\x00\x00\x0ctEXtComment\x00".to_vec();
    text.extend_from_slice(&mp3_header(9));
    let picture = png(10_000, 10_000, &text);
    assert!(check_media(MediaKind::Audio, &picture, None).expect_err("refused").contains("holds an image"));
    assert!(check_media(MediaKind::Audio, &picture, Some("mp3")).expect_err("refused").contains("holds an image"));
    assert!(check_media(MediaKind::Image, &picture, None).expect_err("refused").contains("at most"));
    let clip = Wav::pcm(16_000, 16_000).bytes();
    assert!(check_media(MediaKind::Image, &clip, None).expect_err("refused").contains("holds audio"));
    assert!(check_media(MediaKind::Image, &mp3_of(4, mp3_header(9)), None)
        .expect_err("refused")
        .contains("holds audio"));
}

#[test]
fn images_are_checked_on_their_headers() {
    let huge = png(40_000, 40_000, &[]);
    assert!(check_media(MediaKind::Image, &huge, None).expect_err("refused").contains("at most"));
    assert!(check_media(MediaKind::Image, &png(64, 64, &[]), None).is_ok());
    assert!(check_media(MediaKind::Image, b"RIFF\x00\x00\x00\x00WEBPVP8 ", None).is_err());
    assert!(check_media(MediaKind::Image, b"plain text", None).is_err());
}

#[test]
fn top_down_and_os2_bmps_have_their_real_size() {
    assert_eq!(image_size("bmp", &bmp(40, 2, -2)), Ok((2, 2)));
    assert_eq!(image_size("bmp", &bmp(124, 640, -480)), Ok((640, 480)));
    assert_eq!(image_size("bmp", &bmp(40, 2, 2)), Ok((2, 2)));
    assert_eq!(image_size("bmp", &bmp(12, 300, 200)), Ok((300, 200)));
    assert_eq!(image_size("bmp", &bmp(12, 65_535, 65_535)), Ok((65_535, 65_535)));
    assert!(check_media(MediaKind::Image, &bmp(40, 2, -2), None).is_ok());
    assert!(check_media(MediaKind::Image, &bmp(12, 2, 2), None).is_ok());
    assert!(check_media(MediaKind::Image, &bmp(12, 65_535, 65_535), None).expect_err("refused").contains("at most"));
    // A negative width is a huge one to stb_image.
    assert!(check_media(MediaKind::Image, &bmp(40, -2, 2), None).expect_err("refused").contains("at most"));
    // A header size stb_image does not know.
    assert!(check_media(MediaKind::Image, &bmp(64, 2, 2), None).expect_err("refused").contains("BMP"));
}

/// A JPEG's start: SOI, a JFIF segment, `junk` bytes, then a frame header (SOF0 behind `fill`
/// extra 0xFF bytes) declaring `width` × `height`.
fn jpeg(width: u16, height: u16, junk: usize, fill: usize) -> Vec<u8> {
    let mut out = b"\xFF\xD8\xFF\xE0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00".to_vec();
    out.resize(out.len() + junk, 0x42);
    out.resize(out.len() + fill, 0xFF);
    out.extend_from_slice(b"\xFF\xC0\x00\x11\x08");
    out.extend_from_slice(&height.to_be_bytes());
    out.extend_from_slice(&width.to_be_bytes());
    out.extend_from_slice(&[3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
    out
}

#[test]
fn the_size_checked_is_the_one_stb_image_reads() {
    assert_eq!(image_size("jpeg", &jpeg(640, 480, 0, 0)), Ok((640, 480)));
    // Fill bytes before the frame header, junk after a segment: stb_image skips both.
    assert_eq!(image_size("jpeg", &jpeg(65_535, 65_535, 3, 2)), Ok((65_535, 65_535)));
    assert!(check_media(MediaKind::Image, &jpeg(65_535, 65_535, 3, 2), None).expect_err("refused").contains("at most"));
    assert!(check_media(MediaKind::Image, &jpeg(640, 480, 3, 2), None).is_ok());
    // A reader taking the fill byte for a marker would skip 49,150 bytes to a decoy 2 × 2 frame.
    let mut decoy = jpeg(65_535, 65_535, 0, 1);
    decoy.resize(49_174, 0);
    decoy.extend_from_slice(b"\xFF\xC0\x00\x11\x08\x00\x02\x00\x02");
    assert_eq!(image_size("jpeg", &decoy), Ok((65_535, 65_535)));
    // A segment stb_image does not know ends its reading: nothing to decode.
    let mut unknown = jpeg(640, 480, 0, 0);
    unknown[3] = 0xC3;
    assert!(image_size("jpeg", &unknown).is_err());
    // Apple's CgBI chunk before the IHDR: stb_image skips it and reads the IHDR after it.
    // (A reader at fixed offsets would take its data and checksum for a 2 × 2 picture.)
    let mut apple = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x04CgBI\x00\x00\x00\x02\x00\x00\x00\x02".to_vec();
    apple.extend_from_slice(&png(40_000, 40_000, &[])[8..]);
    assert_eq!(image_size("png", &apple), Ok((40_000, 40_000)));
    assert!(check_media(MediaKind::Image, &apple, None).expect_err("refused").contains("at most"));
    assert!(image_size("png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIDAT").is_err());
}

proptest! {
    /// The fuzz target `media_headers` in short, on every test run: arbitrary bytes, and valid
    /// files with bytes changed, never panic, and an accepted clip's decoder buffer is within
    /// the limit.
    #[test]
    fn any_bytes_are_inspected_without_panicking(
        noise in proptest::collection::vec(any::<u8>(), 0..2048),
        flips in proptest::collection::vec((0usize..4096, any::<u8>()), 0..8),
    ) {
        let mut seeds = vec![noise, Wav::pcm(400, 16_000).bytes(), mp3_of(20, mp3_header(9)), bmp(40, 3, -3)];
        for seed in &mut seeds[1..] {
            for &(at, byte) in &flips {
                let len = seed.len();
                seed[at % len] = byte;
            }
        }
        for bytes in &seeds {
            let _ = check_media(MediaKind::Image, bytes, None);
            for format in [Some("wav"), Some("mp3"), None] {
                if let Ok(bound) = audio_bound(sniff(bytes), bytes, format) {
                    prop_assert!(bound.decoded_bytes(OUTPUT_RATE) <= allocation_limit());
                }
            }
        }
    }

    /// Generated WAV headers: accepted exactly when the decoder's count (the frames the data
    /// chunk declares, no more than the file holds) is within the limit, and then its buffer is.
    #[test]
    fn a_wav_is_accepted_exactly_when_its_decoded_buffer_fits(
        rate in prop_oneof![1u32..8_000, 8_000u32..=192_000, 192_001u32..1_000_000],
        channels in 1u16..=8,
        (tag, bits) in prop_oneof![Just((1u16, 8u16)), Just((1, 16)), Just((1, 24)), Just((1, 32)), Just((3, 32)), Just((3, 64))],
        frames in 0u32..20_000,
        declared in prop_oneof![Just(None), any::<u32>().prop_map(Some)],
        extensible in any::<bool>(),
    ) {
        let wav = Wav { tag, channels, rate, bits, frames, declared };
        let held = frames * wav.block();
        let decoder_frames = u64::from(declared.unwrap_or(held).min(held) / wav.block());
        let decoded = AudioBound { frames: decoder_frames, rate };
        let verdict = check_media(MediaKind::Audio, &wav.bytes_with(extensible, &[]), None);
        let rate_ok = (MIN_SAMPLE_RATE..=MAX_SAMPLE_RATE).contains(&rate);
        prop_assert_eq!(verdict.is_ok(), rate_ok && decoded.seconds() <= MAX_AUDIO_SECONDS as f64, "{:?}", verdict);
        if verdict.is_ok() {
            prop_assert!(decoded.decoded_bytes(OUTPUT_RATE) <= allocation_limit());
        }
    }

    /// Generated MP3s whose first frame may carry a Xing or Info tag: the decoder counts the
    /// tag's claim where there is one, else the frames; accepted exactly when that fits.
    #[test]
    fn an_mp3_is_accepted_exactly_when_its_decoded_buffer_fits(
        n in 2usize..40,
        kbps_index in 1u8..15,
        rate_index in 0u8..3,
        tag in prop_oneof![Just(None), Just(Some(*b"Xing")), Just(Some(*b"Info"))],
        count in prop_oneof![0u32..100_000, any::<u32>()],
    ) {
        let header = [0xFF, 0xFB, (kbps_index << 4) | (rate_index << 2), 0xC4];
        let rate = [44_100, 48_000, 32_000][usize::from(rate_index)];
        let clip = match tag {
            Some(tag) => with_xing(n, header, &tag, count),
            None => mp3_of(n, header),
        };
        let claimed = if tag.is_some() { u64::from(count) } else { 0 };
        let decoded = AudioBound { frames: claimed.max(n as u64) * 1152, rate };
        let verdict = check_media(MediaKind::Audio, &clip, Some("mp3"));
        prop_assert_eq!(verdict.is_ok(), decoded.seconds() <= MAX_AUDIO_SECONDS as f64, "{:?}", verdict);
        if verdict.is_ok() {
            prop_assert!(decoded.decoded_bytes(OUTPUT_RATE) <= allocation_limit());
        }
    }

    /// Generated image headers: accepted exactly when stb_image's RGB copy (3 bytes a pixel of
    /// the size it reads) is within the limit; never accepted as audio.
    #[test]
    fn an_image_is_accepted_exactly_when_its_decoded_copy_fits(
        width in prop_oneof![1i32..20_000, any::<i32>()],
        height in prop_oneof![1i32..20_000, any::<i32>()],
        format in 0usize..5,
        (junk, fill) in (0usize..4, 0usize..4),
    ) {
        let (bytes, read) = match format {
            0 => (png(width as u32, height as u32, &[]), (u64::from(width as u32), u64::from(height as u32))),
            1 => (bmp(40, width, height), (u64::from(width as u32), u64::from(height.unsigned_abs()))),
            2 => (bmp(12, width, height), (u64::from(width as u16), u64::from(height as u16))),
            3 => (jpeg(width as u16, height as u16, junk, fill), (u64::from(width as u16), u64::from(height as u16))),
            _ => {
                let mut gif = b"GIF89a".to_vec();
                gif.extend_from_slice(&(width as u16).to_le_bytes());
                gif.extend_from_slice(&(height as u16).to_le_bytes());
                gif.extend_from_slice(&[0, 0, 0]);
                (gif, (u64::from(width as u16), u64::from(height as u16)))
            }
        };
        let rgb = read.0.saturating_mul(read.1).saturating_mul(3);
        let verdict = check_media(MediaKind::Image, &bytes, None);
        prop_assert_eq!(verdict.is_ok(), rgb > 0 && rgb <= MAX_IMAGE_PIXELS * 3, "{:?} {:?}", read, verdict);
        prop_assert!(check_media(MediaKind::Audio, &bytes, None).is_err());
    }
}
