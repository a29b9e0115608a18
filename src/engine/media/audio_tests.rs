use super::*;

/// A WAV of `frames` frames at `rate`: `tag` samples of `bits` bits on `channels` channels,
/// a data chunk declaring `declared` bytes.
pub(crate) struct Wav {
    pub(crate) tag: u16,
    pub(crate) channels: u16,
    pub(crate) rate: u32,
    pub(crate) bits: u16,
    pub(crate) frames: u32,
    pub(crate) declared: Option<u32>,
}

impl Wav {
    /// Mono 16-bit PCM.
    pub(crate) fn pcm(frames: u32, rate: u32) -> Self {
        Self { tag: 1, channels: 1, rate, bits: 16, frames, declared: None }
    }

    /// The frame size its header declares.
    pub(crate) fn block(&self) -> u32 {
        u32::from(self.channels) * u32::from(self.bits) / 8
    }

    /// The file: `fmt ` (40 bytes with the extensible subformat `tag` where `extensible`),
    /// then `extra` chunks, then the data.
    pub(crate) fn bytes_with(&self, extensible: bool, extra: &[u8]) -> Vec<u8> {
        let data = self.frames * self.block();
        let mut fmt = Vec::new();
        fmt.extend_from_slice(&(if extensible { 0xFFFE } else { self.tag }).to_le_bytes());
        fmt.extend_from_slice(&self.channels.to_le_bytes());
        fmt.extend_from_slice(&self.rate.to_le_bytes());
        fmt.extend_from_slice(&self.rate.wrapping_mul(self.block()).to_le_bytes());
        fmt.extend_from_slice(&(self.block() as u16).to_le_bytes());
        fmt.extend_from_slice(&self.bits.to_le_bytes());
        if extensible {
            fmt.extend_from_slice(&22u16.to_le_bytes());
            fmt.extend_from_slice(&self.bits.to_le_bytes());
            fmt.extend_from_slice(&4u32.to_le_bytes());
            fmt.extend_from_slice(&self.tag.to_le_bytes());
            fmt.extend_from_slice(&SUBTYPE_TAIL);
        }
        let mut out = b"RIFF\0\0\0\0WAVEfmt ".to_vec();
        out.extend_from_slice(&(fmt.len() as u32).to_le_bytes());
        out.extend_from_slice(&fmt);
        out.extend_from_slice(extra);
        out.extend_from_slice(b"data");
        out.extend_from_slice(&self.declared.unwrap_or(data).to_le_bytes());
        out.resize(out.len() + data as usize, 0);
        let riff = (out.len() - 8) as u32;
        out[4..8].copy_from_slice(&riff.to_le_bytes());
        out
    }

    /// The plain file.
    pub(crate) fn bytes(&self) -> Vec<u8> {
        self.bytes_with(false, &[])
    }
}

#[test]
fn a_wav_is_as_long_as_its_decoder_counts() {
    let bound = wav_bound(&Wav::pcm(16_000, 16_000).bytes()).expect("accepted");
    assert_eq!(bound, AudioBound { frames: 16_000, rate: 16_000 });
    assert_eq!(bound.decoded_bytes(16_000), 16_001 * 4);
    // A data size larger than the file counts only what the file holds, as the decoder does.
    let lying = Wav { declared: Some(u32::MAX), ..Wav::pcm(8_000, 16_000) };
    assert_eq!(wav_bound(&lying.bytes()).expect("accepted").frames, 8_000);
    let stereo_float = Wav { tag: 3, channels: 2, bits: 32, ..Wav::pcm(100, 48_000) };
    assert_eq!(wav_bound(&stereo_float.bytes()).expect("accepted").frames, 100);
    assert_eq!(wav_bound(&stereo_float.bytes_with(true, &[])).expect("extensible float").frames, 100);
}

#[test]
fn a_wav_the_decoder_might_read_otherwise_is_refused() {
    let refused = |wav: &[u8], why: &str| {
        let reason = wav_bound(wav).expect_err("refused");
        assert!(reason.contains(why), "{reason}");
    };
    refused(&Wav::pcm(8_000, 1).bytes(), "sample rate of 1 Hz");
    refused(&Wav::pcm(8_000, 7_999).bytes(), "sample rate");
    refused(&Wav::pcm(8_000, 192_001).bytes(), "sample rate");
    assert!(wav_bound(&Wav::pcm(8_000, MIN_SAMPLE_RATE).bytes()).is_ok());
    assert!(wav_bound(&Wav::pcm(8_000, MAX_SAMPLE_RATE).bytes()).is_ok());
    // Microsoft ADPCM, plain or as an extensible subformat, with a fact chunk claiming a length.
    let adpcm = Wav { tag: 2, bits: 4, ..Wav::pcm(16, 16_000) };
    let fact = [b"fact".as_slice(), &4u32.to_le_bytes(), &u32::MAX.to_le_bytes()].concat();
    refused(&adpcm.bytes_with(false, &fact), "PCM or float");
    refused(&Wav { bits: 16, ..adpcm }.bytes_with(true, &fact), "subformat must be PCM or float");
    refused(&Wav { tag: 6, bits: 8, ..Wav::pcm(16, 8_000) }.bytes(), "PCM or float");
    let short_fact = [b"fact".as_slice(), &2u32.to_le_bytes(), &[0, 0]].concat();
    refused(&Wav::pcm(16, 16_000).bytes_with(false, &short_fact), "short fact");
    refused(&Wav { bits: 12, ..Wav::pcm(16, 16_000) }.bytes(), "12-bit");
    refused(&Wav { channels: 9, ..Wav::pcm(16, 16_000) }.bytes(), "9 channels");
    let mut odd_block = Wav::pcm(16, 16_000).bytes();
    odd_block[32] = 200;
    refused(&odd_block, "frame size");
    let mut long_fmt = Wav::pcm(16, 16_000).bytes();
    long_fmt[16] = 20;
    refused(&long_fmt, "fmt chunk of 20 bytes");
    refused(b"RIFF....WAVE", "no data chunk");
    refused(b"RIFF....WAVEdata\x04\x00\x00\x00abcd", "data before its fmt chunk");
}

/// One MPEG-1 layer III mono frame header at 32 kHz, of the bit rate at `kbps_index`.
pub(crate) fn mp3_header(kbps_index: u8) -> [u8; 4] {
    [0xFF, 0xFB, (kbps_index << 4) | (2 << 2), 0xC4]
}

/// `n` frames of `header`, zero-filled, after a short ID3 tag.
pub(crate) fn mp3_of(n: usize, header: [u8; 4]) -> Vec<u8> {
    let len = MpegHeader::at(&header, 0).expect("a header").len();
    let mut out = b"ID3\x04\x00\x00\x00\x00\x00\x05hello".to_vec();
    for _ in 0..n {
        out.extend_from_slice(&header);
        out.resize(out.len() + len - 4, 0);
    }
    out
}

/// `n` frames at 128 kbit/s, 32 kHz.
fn mp3(n: usize) -> Vec<u8> {
    mp3_of(n, mp3_header(9))
}

/// `mp3_of(n, header)` whose first frame carries a Xing (or Info) tag claiming `count` frames.
pub(crate) fn with_xing(n: usize, header: [u8; 4], tag: &[u8; 4], count: u32) -> Vec<u8> {
    let mut out = mp3_of(n, header);
    // After the 15-byte ID3 tag, the header and MPEG-1 mono side information (17 bytes).
    let at = 15 + 4 + 17;
    out[at..at + 4].copy_from_slice(tag);
    out[at + 4..at + 8].copy_from_slice(&1u32.to_be_bytes());
    out[at + 8..at + 12].copy_from_slice(&count.to_be_bytes());
    out
}

#[test]
fn an_mp3_is_as_long_as_its_frames() {
    let bound = mp3_bound(&mp3(100)).expect("accepted");
    assert_eq!(bound, AudioBound { frames: 100 * 1152, rate: 32_000 });
    // Junk between frames is skipped, the frames after it still count; the frame before it has
    // no header after it, so the decoder drops it as it resynchronises.
    let mut junk = mp3(10);
    junk.extend_from_slice(&[0u8; 37]);
    junk.extend_from_slice(&mp3(10)[15..]);
    assert_eq!(mp3_bound(&junk).expect("accepted").frames, 19 * 1152);
    // A lone header in other bytes (nothing continues it) is not a frame the decoder keeps.
    let mut planted = vec![7u8; 5_000];
    planted[100..104].copy_from_slice(&mp3_header(9));
    assert!(mp3_bound(&planted).is_err());
    // An ID3v1 tag at the end is cut off, as the decoder does: the last frame still ends the stream.
    let mut tagged = mp3(10);
    tagged.extend_from_slice(b"TAG");
    tagged.resize(tagged.len() + 125, b' ');
    assert_eq!(mp3_bound(&tagged).expect("accepted").frames, 10 * 1152);
    assert!(mp3_bound(b"no frames here at all").is_err());
}

#[test]
fn a_xing_or_info_tag_is_the_length_it_claims() {
    let claimed = with_xing(20, mp3_header(9), b"Xing", 5_000_000);
    let bound = mp3_bound(&claimed).expect("a bound");
    assert_eq!(bound, AudioBound { frames: 5_000_000 * 1152, rate: 32_000 });
    assert!(bound.seconds() > 100_000.0);
    let info = with_xing(20, mp3_header(9), b"Info", 30);
    assert_eq!(mp3_bound(&info).expect("a bound").frames, 30 * 1152);
    // A claim below the frames found: the frames count.
    assert_eq!(mp3_bound(&with_xing(20, mp3_header(9), b"Xing", 3)).expect("a bound").frames, 20 * 1152);
}

#[test]
fn free_format_streams_are_refused() {
    // Bit rate index 0: each frame is as long as the distance to the next header, here 4 bytes.
    let free = [0xFF, 0xFD, 0x08, 0xC4].repeat(1_000);
    assert!(mp3_bound(&free).expect_err("refused").contains("free-format"));
}

#[test]
fn flac_is_found_where_its_decoder_would_find_it() {
    assert!(is_flac(b"fLaC\0\0\0\x22"));
    assert!(is_flac(b"ID3\x04\x00\x00\x00\x00\x00\x02hifLaC"));
    assert!(is_flac(b"ID3\x04\x00\x00\x00\x00\x00\x00ID3\x04\x00\x00\x00\x00\x00\x00OggS"));
    assert!(!is_flac(&mp3(2)));
}
