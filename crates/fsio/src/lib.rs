//! Crash-safe file output shared by every crate: write to a temporary name beside the target,
//! fsync, rename, fsync the directory. A reader sees the old file or the new one, never half.

pub mod console;
mod dir;

pub use dir::{lock_dir_writers, recover_replaced_dir, replace_dir};

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

/// A temporary sibling name that no other writer (another process, another thread) uses.
pub fn temp_sibling(path: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}-{n}", std::process::id()))
}

/// Writes `bytes` to `path` atomically (temp name, fsync, rename, fsync dir).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_sibling(path);
    let written = File::create(&tmp).and_then(|mut f| f.write_all(bytes));
    match written {
        Ok(()) => persist(&tmp, path),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e).with_context(|| format!("cannot write {}", path.display()))
        }
    }
}

/// Streams a file to `path` atomically (temp name, fsync, rename, fsync dir): `write` gets a
/// buffered writer that hashes what passes through it. Returns the file's sha256 (hex), so a
/// large file need not be read back to be hashed. Nothing is left behind if `write` fails.
pub fn write_atomic_streamed(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> Result<()>,
) -> Result<String> {
    let tmp = temp_sibling(path);
    let result = (|| -> Result<String> {
        let file = File::create(&tmp)?;
        let mut w = HashingWriter::new(file);
        write(&mut w)?;
        w.finish()
    })();
    match result {
        Ok(sha) => persist(&tmp, path).map(|()| sha),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e.context(format!("cannot write {}", path.display())))
        }
    }
}

/// Buffers writes into 8 MiB blocks; each full block is written to the file here while a
/// second thread hashes it, so hashing (about as slow as the disk) overlaps the writing.
struct HashingWriter {
    file: File,
    block: Vec<u8>,
    to_hasher: Option<std::sync::mpsc::SyncSender<std::sync::Arc<Vec<u8>>>>,
    hasher: Option<std::thread::JoinHandle<String>>,
}

const BLOCK: usize = 8 << 20;

impl HashingWriter {
    fn new(file: File) -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel::<std::sync::Arc<Vec<u8>>>(2);
        let hasher = std::thread::spawn(move || {
            let mut h = Sha256::new();
            for block in rx {
                h.update(&block[..]);
            }
            hex::encode(h.finalize())
        });
        Self {
            file,
            block: Vec::with_capacity(BLOCK),
            to_hasher: Some(tx),
            hasher: Some(hasher),
        }
    }

    fn flush_block(&mut self) -> std::io::Result<()> {
        if self.block.is_empty() {
            return Ok(());
        }
        let block = std::sync::Arc::new(std::mem::replace(
            &mut self.block,
            Vec::with_capacity(BLOCK),
        ));
        let sent = self.to_hasher.as_ref().map(|tx| tx.send(block.clone()));
        if !matches!(sent, Some(Ok(()))) {
            return Err(std::io::Error::other("the hashing thread stopped"));
        }
        self.file.write_all(&block)
    }

    /// Writes what is left and returns the sha256 of everything written.
    fn finish(mut self) -> Result<String> {
        self.flush_block()?;
        drop(self.to_hasher.take());
        let hasher = self.hasher.take().expect("joined once");
        hasher
            .join()
            .map_err(|_| anyhow::anyhow!("the hashing thread panicked"))
    }
}

impl Write for HashingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(BLOCK - self.block.len());
        self.block.extend_from_slice(&buf[..n]);
        if self.block.len() == BLOCK {
            self.flush_block()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(()) // blocks go out when full and in `finish`, so every block is hashed in order
    }
}

/// Makes a finished temporary file `tmp` (written by a library that wants a path, say) the
/// file at `path`: fsync, rename, fsync dir. The temporary file is removed if that fails.
pub fn persist(tmp: &Path, path: &Path) -> Result<()> {
    let result = (|| {
        File::open(tmp)?.sync_all()?;
        fs::rename(tmp, path)?;
        sync_parent(path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(tmp);
    }
    result.with_context(|| format!("cannot write {}", path.display()))
}

/// fsyncs the directory holding `path`, so a rename into it survives a power cut.
pub fn sync_parent(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// Takes an exclusive advisory lock on `path` (created if missing) without waiting. The lock
/// lasts as long as the returned file stays open, and the kernel drops it if the process dies.
pub fn lock_exclusive(path: &Path) -> Result<File> {
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("cannot open lock file {}", path.display()))?;
    if file.try_lock().is_err() {
        anyhow::bail!("{} is locked", path.display());
    }
    Ok(file)
}

/// sha256 (hex) of a file's contents, streamed.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// sha256 (hex) of bytes in memory.
pub fn sha256_bytes(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The first 12 hex digits of a sha256, as messages quote it.
pub fn short_sha256(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_whole_file_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.json");
        write_atomic(&p, b"old").unwrap();
        write_atomic(&p, b"new contents").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"new contents");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        assert_eq!(sha256_file(&p).unwrap(), sha256_bytes(b"new contents"));
    }

    /// Writes of uneven sizes across several hashing blocks: the file holds exactly the
    /// bytes, and the sha256 returned is the file's.
    #[test]
    fn a_streamed_write_hashes_what_it_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.bin");
        let bytes: Vec<u8> = (0..2 * BLOCK + 12_345)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let sha = write_atomic_streamed(&p, |w| {
            for piece in bytes.chunks(1_000_003) {
                w.write_all(piece)?;
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(fs::read(&p).unwrap(), bytes);
        assert_eq!(sha, sha256_bytes(&bytes));
        let failed = write_atomic_streamed(&dir.path().join("no.bin"), |w| {
            w.write_all(&bytes)?;
            anyhow::bail!("the source broke")
        });
        assert!(failed.is_err());
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "nothing left of the failed write"
        );
    }

    #[test]
    fn a_second_lock_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(".lock");
        let first = lock_exclusive(&p).unwrap();
        assert!(lock_exclusive(&p).is_err());
        drop(first);
        assert!(lock_exclusive(&p).is_ok());
    }

    #[test]
    fn failed_write_names_the_path() {
        let e = write_atomic(Path::new("/nonexistent-dir/x.json"), b"x").unwrap_err();
        assert!(format!("{e:#}").contains("/nonexistent-dir/x.json"));
    }
}
