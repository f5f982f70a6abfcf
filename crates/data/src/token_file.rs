//! Memory-mapped reading and crash-safe streaming writing of flat token files.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use memmap2::Mmap;
use sha2::{Digest, Sha256};

use crate::meta::{FileInfo, Meta, TokenDtype};

/// A read-only, memory-mapped `train.bin` or `val.bin`.
pub struct TokenFile {
    path: PathBuf,
    mmap: Mmap,
    dtype: TokenDtype,
    vocab_size: usize,
}

impl TokenFile {
    /// Opens `dir/name` as listed in `meta`: its size must match the token count meta.json
    /// records (a truncated or foreign file is refused here, before any training).
    pub fn open(dir: &Path, name: &str, meta: &Meta) -> Result<Self> {
        let path = dir.join(name);
        let info = meta
            .file(name)
            .with_context(|| format!("{}", dir.join("meta.json").display()))?;
        let file = File::open(&path).with_context(|| {
            format!(
                "cannot open {}; re-run `lab data prepare` for this data dir",
                path.display()
            )
        })?;
        let len = file.metadata()?.len();
        let expected = info.tokens * meta.dtype.bytes() as u64;
        if len != expected {
            bail!(
                "{} is {len} bytes but meta.json says {} {:?} tokens ({expected} bytes): the file is truncated or from another run; re-run `lab data prepare`",
                path.display(),
                info.tokens,
                meta.dtype
            );
        }
        // Safety: the file is opened read-only and never written while mapped by lab.
        let mmap = unsafe { Mmap::map(&file) }
            .with_context(|| format!("cannot memory-map {}", path.display()))?;
        Ok(Self {
            path,
            mmap,
            dtype: meta.dtype,
            vocab_size: meta.vocab_size,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len(&self) -> usize {
        self.mmap.len() / self.dtype.bytes()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends tokens `[start, start + n)` to `out`, checking each id against the vocabulary
    /// (an out-of-range id would otherwise index past the embedding table).
    pub fn read_into(&self, start: usize, n: usize, out: &mut Vec<u32>) -> Result<()> {
        let b = self.dtype.bytes();
        let bytes = &self.mmap[start * b..(start + n) * b];
        for (i, chunk) in bytes.chunks_exact(b).enumerate() {
            let id = match self.dtype {
                TokenDtype::Uint16 => u16::from_le_bytes([chunk[0], chunk[1]]) as u32,
                TokenDtype::Uint32 => u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]),
            };
            if id as usize >= self.vocab_size {
                bail!(
                    "{}: token id {id} at position {} is >= vocab_size {}; the data was prepared with another tokenizer",
                    self.path.display(),
                    start + i,
                    self.vocab_size
                );
            }
            out.push(id);
        }
        Ok(())
    }
}

/// Streams tokens to `path` under a temporary name; `finish` fsyncs and renames, so a killed
/// writer never leaves a file that looks complete.
pub struct TokenWriter {
    path: PathBuf,
    tmp: PathBuf,
    out: BufWriter<File>,
    dtype: TokenDtype,
    hasher: Sha256,
    tokens: u64,
}

impl TokenWriter {
    pub fn create(path: &Path, dtype: TokenDtype) -> Result<Self> {
        let tmp = lab_fsio::temp_sibling(path);
        let file =
            File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            tmp,
            out: BufWriter::with_capacity(1 << 20, file),
            dtype,
            hasher: Sha256::new(),
            tokens: 0,
        })
    }

    pub fn write(&mut self, tokens: &[u32]) -> Result<()> {
        let mut buf = Vec::with_capacity(tokens.len() * self.dtype.bytes());
        for &t in tokens {
            match self.dtype {
                TokenDtype::Uint16 => {
                    let t = u16::try_from(t)
                        .with_context(|| format!("token id {t} does not fit uint16"))?;
                    buf.extend_from_slice(&t.to_le_bytes());
                }
                TokenDtype::Uint32 => buf.extend_from_slice(&t.to_le_bytes()),
            }
        }
        self.hasher.update(&buf);
        self.out.write_all(&buf)?;
        self.tokens += tokens.len() as u64;
        Ok(())
    }

    /// Tokens written so far.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    pub fn finish(mut self) -> Result<FileInfo> {
        // Flushed and synced in place: `self` implements Drop, so its fields cannot move out.
        self.out
            .flush()
            .with_context(|| format!("cannot write {}", self.tmp.display()))?;
        self.out.get_ref().sync_all()?;
        fs::rename(&self.tmp, &self.path)
            .with_context(|| format!("cannot rename into {}", self.path.display()))?;
        lab_fsio::sync_parent(&self.path)?;
        Ok(FileInfo {
            tokens: self.tokens,
            sha256: hex::encode(std::mem::take(&mut self.hasher).finalize()),
        })
    }
}

impl Drop for TokenWriter {
    fn drop(&mut self) {
        // After `finish` the temp file has been renamed and this is a no-op.
        let _ = fs::remove_file(&self.tmp);
    }
}
