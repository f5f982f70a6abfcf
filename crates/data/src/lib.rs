//! Token data in nanoGPT's format: flat little-endian `train.bin` / `val.bin` (uint16, or
//! uint32 above 65,535 token ids) plus `meta.json`, read through memmap, and the
//! deterministic order in which training samples are drawn from them (uniformly, or to the
//! weights of a data mixture).

pub mod gpt2;
pub mod meta;
pub mod mixture;
pub mod sampler;
pub mod token_file;
pub mod verify;

pub use meta::{FileInfo, Meta, Span, TokenDtype};
pub use mixture::{MixtureSampler, MixtureStage};
pub use sampler::{Batch, Sampler};
pub use token_file::{TokenFile, TokenWriter};

/// The bundled tinyshakespeare corpus (public domain; see corpora/README.md).
pub const TINYSHAKESPEARE: &str = include_str!("../corpora/tinyshakespeare.txt");
