use proptest::prelude::*;

use super::*;

fn image(bytes: &[u8]) -> MediaInput {
    MediaInput::new(MediaKind::Image, bytes.to_vec(), "messages[0].content[0]")
}

#[test]
fn markers_split_the_text_around_the_media_they_name() {
    let a = image(b"first picture");
    let b = image(b"second picture");
    let text = format!("<|user|>{}look{}\n", a.marker(), b.marker());
    assert_eq!(
        split_at_markers(&text),
        vec![Piece::Text("<|user|>"), Piece::Media(a.id), Piece::Text("look"), Piece::Media(b.id), Piece::Text("\n")]
    );
}

#[test]
fn what_is_not_a_whole_marker_stays_text() {
    let a = image(b"x");
    let broken = [
        "<__media_".to_string(),
        "<__media_0123__>".to_string(),
        format!("<__media_{}", a.id.hex()),
        format!("<__media_{}__", a.id.hex()),
        format!("<__media_{}__>", a.id.hex().to_uppercase()),
        "<__media__>".to_string(),
    ];
    for text in &broken {
        assert_eq!(split_at_markers(text), vec![Piece::Text(text)], "{text}");
    }
    // A broken marker right before a whole one does not hide it.
    let text = format!("<__media_zz{}", a.marker());
    assert_eq!(split_at_markers(&text), vec![Piece::Text("<__media_zz"), Piece::Media(a.id)]);
}

#[test]
fn identities_differ_by_bytes_and_by_kind() {
    let bytes = b"the same bytes";
    assert_eq!(MediaId::of(MediaKind::Image, bytes), MediaId::of(MediaKind::Image, bytes));
    assert_ne!(MediaId::of(MediaKind::Image, bytes), MediaId::of(MediaKind::Audio, bytes));
    assert_ne!(MediaId::of(MediaKind::Image, bytes), MediaId::of(MediaKind::Image, b"other bytes"));
    assert_eq!(
        MediaId::from_hex(&MediaId::of(MediaKind::Image, bytes).hex()),
        Some(MediaId::of(MediaKind::Image, bytes))
    );
}

#[test]
fn support_names_what_is_missing() {
    let none = MediaSupport::default();
    assert!(none.check(MediaKind::Image).expect_err("refused").contains("--mmproj"));
    let vision = MediaSupport { projector: Some("v.gguf".into()), image: true, ..MediaSupport::default() };
    assert!(vision.check(MediaKind::Image).is_ok());
    assert!(vision.check(MediaKind::Audio).expect_err("refused").contains("v.gguf"));
    let refused = MediaSupport { refused: Some("v.gguf maps every input to one output".into()), ..vision };
    assert!(refused.check(MediaKind::Image).expect_err("refused").contains("v.gguf maps"));
}

#[test]
fn a_prefix_never_ends_inside_a_media() {
    let spans = [(3, 10), (12, 20)];
    assert_eq!(whole_media_prefix(&spans, 2), 2);
    assert_eq!(whole_media_prefix(&spans, 3), 3);
    assert_eq!(whole_media_prefix(&spans, 4), 3);
    assert_eq!(whole_media_prefix(&spans, 9), 3);
    assert_eq!(whole_media_prefix(&spans, 10), 10);
    assert_eq!(whole_media_prefix(&spans, 11), 11);
    assert_eq!(whole_media_prefix(&spans, 15), 12);
    assert_eq!(whole_media_prefix(&spans, 20), 20);
}

proptest! {
    #[test]
    fn placeholders_are_negative_stable_and_differ_between_media(a in any::<[u8; 8]>(), b in any::<[u8; 8]>(), n in 1usize..64) {
        let first = MediaId::of(MediaKind::Image, &a);
        let second = MediaId::of(MediaKind::Image, &b);
        let tokens = placeholder_tokens(first, 0, n);
        prop_assert_eq!(tokens.len(), n);
        prop_assert!(tokens.iter().all(|&t| is_placeholder(t) && t.0 != -1));
        prop_assert_eq!(&tokens, &placeholder_tokens(first, 0, n));
        if a != b {
            // Differ at the first position: a prompt with another picture diverges where it starts.
            prop_assert_ne!(tokens[0], placeholder_tokens(second, 0, n)[0]);
        }
        prop_assert_ne!(tokens[0], placeholder_tokens(first, 1, n)[0]);
    }

    #[test]
    fn splitting_keeps_every_byte_of_text(prefix in "[a-z<_>]{0,20}", suffix in "[a-z<_>]{0,20}", bytes in any::<[u8; 4]>()) {
        let media = image(&bytes);
        let text = format!("{prefix}{}{suffix}", media.marker());
        let mut joined = String::new();
        for piece in split_at_markers(&text) {
            match piece {
                Piece::Text(t) => joined.push_str(t),
                Piece::Media(id) => {
                    prop_assert_eq!(id, media.id);
                    joined.push_str(&media.marker());
                }
            }
        }
        prop_assert_eq!(joined, text);
    }
}
