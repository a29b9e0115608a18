//! What makes a saved state valid for this engine: the model file (and a draft model's), the
//! llama.cpp build, the context parameters that shape the state, and the chat template. A disk
//! file is used only where all of them match; the first that differs is the reason it is
//! refused.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

/// Bytes hashed at each end of a model file: the GGUF header and metadata lie in the first,
/// the last tensors' data in the last.
const HASHED_END_BYTES: u64 = 1 << 20;

/// One model file, identified without reading it whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ModelIdentity {
    /// `general.architecture`.
    pub(crate) architecture: String,
    /// File size in bytes.
    pub(crate) file_size: u64,
    /// Modification time, nanoseconds since the Unix epoch.
    pub(crate) modified_ns: u64,
    /// XXH3-64 of its first and last MiB, hex.
    pub(crate) head_tail_hash: String,
}

impl ModelIdentity {
    /// The identity of the model file at `path`.
    ///
    /// # Errors
    /// The file cannot be read.
    pub(crate) fn of(path: &Path, architecture: &str) -> std::io::Result<Self> {
        let mut file = File::open(path)?;
        let metadata = file.metadata()?;
        let file_size = metadata.len();
        let modified_ns =
            metadata.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos() as u64);
        let mut hasher = Xxh3::new();
        let mut buffer = vec![0u8; HASHED_END_BYTES.min(file_size) as usize];
        file.read_exact(&mut buffer)?;
        hasher.update(&buffer);
        file.seek(SeekFrom::Start(file_size - buffer.len() as u64))?;
        file.read_exact(&mut buffer)?;
        hasher.update(&buffer);
        Ok(Self {
            architecture: architecture.to_string(),
            file_size,
            modified_ns,
            head_tail_hash: format!("{:016x}", hasher.digest()),
        })
    }

    /// What differs from `other`, in words.
    fn difference(&self, other: &Self) -> Option<String> {
        if self.architecture != other.architecture {
            Some(format!("architecture {}, now {}", self.architecture, other.architecture))
        } else if self.file_size != other.file_size {
            Some(format!("file size {}, now {}", self.file_size, other.file_size))
        } else if self.head_tail_hash != other.head_tail_hash {
            Some("file contents differ".into())
        } else if self.modified_ns != other.modified_ns {
            Some("file modified since".into())
        } else {
            None
        }
    }
}

/// The context parameters that shape a sequence's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ContextShape {
    /// Context size in tokens.
    pub(crate) n_ctx: u32,
    /// KV cache element types (K, V).
    pub(crate) kv_types: String,
    /// Full-size KV cache for sliding-window layers.
    pub(crate) swa_full: bool,
    /// Flash attention as the context computes it: `on` or `off` (what llama.cpp chose for an
    /// `auto` policy; the policy decides whether V is stored transposed, the choice how every
    /// later position's keys and values are computed).
    pub(crate) flash_attention: String,
    /// Sequences per context.
    pub(crate) n_seq_max: u32,
    /// Recurrent-state snapshots per sequence.
    pub(crate) n_rs_seq: u32,
    /// What drafts: `none`, `mtp` or `model` (its state is saved with the target's).
    pub(crate) drafter: String,
    /// The projector (`--mmproj`) whose embeddings a media's positions hold: `none`, or its
    /// size and hash ([`ContextShape::projector_of`]).
    #[serde(default = "no_projector")]
    pub(crate) projector: String,
}

/// What files written before projectors existed hold.
fn no_projector() -> String {
    "none".into()
}

impl ContextShape {
    /// The [`ContextShape::projector`] of the projector file at `path` (`none` without one).
    ///
    /// # Errors
    /// The file cannot be read.
    pub(crate) fn projector_of(path: Option<&Path>) -> std::io::Result<String> {
        match path {
            None => Ok(no_projector()),
            Some(path) => {
                let identity = ModelIdentity::of(path, "mmproj")?;
                Ok(format!("{} bytes, {}", identity.file_size, identity.head_tail_hash))
            }
        }
    }

    /// The first parameter that differs from `other`, in words.
    fn difference(&self, other: &Self) -> Option<String> {
        let fields = [
            ("context size", self.n_ctx.to_string(), other.n_ctx.to_string()),
            ("KV cache types", self.kv_types.clone(), other.kv_types.clone()),
            ("full SWA cache", self.swa_full.to_string(), other.swa_full.to_string()),
            ("flash attention", self.flash_attention.clone(), other.flash_attention.clone()),
            ("sequences", self.n_seq_max.to_string(), other.n_seq_max.to_string()),
            ("recurrent snapshots", self.n_rs_seq.to_string(), other.n_rs_seq.to_string()),
            ("drafter", self.drafter.clone(), other.drafter.clone()),
            ("projector", self.projector.clone(), other.projector.clone()),
        ];
        fields.into_iter().find(|(_, was, now)| was != now).map(|(name, was, now)| format!("{name} {was}, now {now}"))
    }
}

/// Everything a saved state depends on besides its tokens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Fingerprint {
    /// The model.
    pub(crate) model: ModelIdentity,
    /// The draft model, when one drafts.
    pub(crate) draft_model: Option<ModelIdentity>,
    /// The llama.cpp build.
    pub(crate) llama_cpp: String,
    /// The context parameters.
    pub(crate) context: ContextShape,
    /// XXH3-64 of the chat template's source, hex.
    pub(crate) template_hash: String,
}

impl Mismatch {
    /// Whether the file is of this very model and build, written by an instance with other
    /// parameters, draft model or template: usable by that instance, so kept. A file of another
    /// model file or build is never usable again.
    pub(crate) fn is_another_instance(&self) -> bool {
        matches!(self, Self::DraftModel | Self::Parameters(_) | Self::Template)
    }
}

impl Fingerprint {
    /// A short hash of the whole fingerprint, for file names: instances of one model with other
    /// parameters or templates never write over each other's files.
    pub(crate) fn short_hash(&self) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        format!("{:08x}", xxhash_rust::xxh3::xxh3_64(text.as_bytes()) >> 32)
    }
}

/// Why a file's fingerprint does not match this engine's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Mismatch {
    /// Written for another model file.
    #[error("written for another model ({0})")]
    Model(String),
    /// Written with another draft model, or with none.
    #[error("written with another draft model")]
    DraftModel,
    /// Written by another llama.cpp build.
    #[error("written by another llama.cpp build ({0})")]
    Build(String),
    /// Written with other context parameters.
    #[error("written with other context parameters ({0})")]
    Parameters(String),
    /// Written with another chat template.
    #[error("written with another chat template")]
    Template,
}

impl Fingerprint {
    /// The hash a template's source is identified by.
    pub(crate) fn template_hash(template: &str) -> String {
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(template.as_bytes()))
    }

    /// The first thing that differs between a file's fingerprint (`self`) and the engine's.
    pub(crate) fn check(&self, engine: &Self) -> Result<(), Mismatch> {
        if let Some(difference) = self.model.difference(&engine.model) {
            return Err(Mismatch::Model(difference));
        }
        let drafts_differ = match (&self.draft_model, &engine.draft_model) {
            (Some(file), Some(now)) => file.difference(now).is_some(),
            (file, now) => file.is_some() != now.is_some(),
        };
        if drafts_differ {
            return Err(Mismatch::DraftModel);
        }
        if self.llama_cpp != engine.llama_cpp {
            return Err(Mismatch::Build(self.llama_cpp.clone()));
        }
        if let Some(difference) = self.context.difference(&engine.context) {
            return Err(Mismatch::Parameters(difference));
        }
        if self.template_hash != engine.template_hash {
            return Err(Mismatch::Template);
        }
        Ok(())
    }
}

/// A fingerprint for unit tests (no model file behind it).
#[cfg(test)]
pub(crate) fn test_fingerprint() -> Fingerprint {
    Fingerprint {
        model: ModelIdentity {
            architecture: "llama".into(),
            file_size: 10,
            modified_ns: 5,
            head_tail_hash: "ab".into(),
        },
        draft_model: None,
        llama_cpp: "b1".into(),
        context: ContextShape {
            n_ctx: 4096,
            kv_types: "f16/f16".into(),
            swa_full: true,
            flash_attention: "on".into(),
            n_seq_max: 1,
            n_rs_seq: 0,
            drafter: "none".into(),
            projector: "none".into(),
        },
        template_hash: Fingerprint::template_hash("{{ messages }}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fingerprint() -> Fingerprint {
        test_fingerprint()
    }

    #[test]
    fn the_first_difference_is_the_reason() {
        let engine = fingerprint();
        assert_eq!(engine.check(&engine), Ok(()));
        let mut file = fingerprint();
        file.context.n_ctx = 2048;
        assert_eq!(file.check(&engine), Err(Mismatch::Parameters("context size 2048, now 4096".into())));
        assert!(file.check(&engine).expect_err("mismatch").is_another_instance());
        assert_ne!(file.short_hash(), engine.short_hash(), "another instance's files get other names");
        file.template_hash = Fingerprint::template_hash("other");
        file.model.modified_ns = 6;
        assert_eq!(file.check(&engine), Err(Mismatch::Model("file modified since".into())));
        assert!(!file.check(&engine).expect_err("mismatch").is_another_instance(), "a replaced model's files go");
        let mut file = fingerprint();
        file.template_hash = Fingerprint::template_hash("other");
        assert_eq!(file.check(&engine), Err(Mismatch::Template));
        let mut file = fingerprint();
        file.llama_cpp = "b2".into();
        assert_eq!(file.check(&engine), Err(Mismatch::Build("b2".into())));
        let mut file = fingerprint();
        file.draft_model = Some(file.model.clone());
        assert_eq!(file.check(&engine), Err(Mismatch::DraftModel));
    }

    #[test]
    fn a_model_file_is_identified_by_its_ends_size_and_time() {
        let dir = std::env::temp_dir().join(format!("firstword-identity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("model.gguf");
        std::fs::write(&path, vec![7u8; 3 << 20]).expect("write");
        let first = ModelIdentity::of(&path, "llama").expect("identity");
        assert_eq!(first, ModelIdentity::of(&path, "llama").expect("identity"));
        assert_eq!(first.file_size, 3 << 20);
        let mut bytes = vec![7u8; 3 << 20];
        bytes[(3 << 20) - 1] = 8;
        std::fs::write(&path, bytes).expect("write");
        let changed = ModelIdentity::of(&path, "llama").expect("identity");
        assert_ne!(first.head_tail_hash, changed.head_tail_hash);
        // Tiny files are hashed whole.
        std::fs::write(&path, b"gguf").expect("write");
        assert_eq!(ModelIdentity::of(&path, "llama").expect("identity").file_size, 4);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
