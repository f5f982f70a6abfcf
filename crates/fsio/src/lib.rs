//! Crash-safe file output shared by every crate: write to a temporary name beside the target,
//! fsync, rename, fsync the directory. A reader sees the old file or the new one, never half.

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
