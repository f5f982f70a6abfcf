//! Checking `train.bin` and `val.bin` against the sha256 meta.json records, before training
//! spends anything on them. A file is hashed once per version: its size, inode and status-change
//! time after a good check go to `.verified.json` in the data dir, and a file that still matches
//! them is not read again (a resume after a preemption does not re-read 20 GB of tokens).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::meta::Meta;

/// What the last good check of each file saw, by file name.
pub const VERIFIED: &str = ".verified.json";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Checked {
    sha256: String,
    bytes: u64,
    /// The file's inode and its status-change time: unlike the modification time, no copy
    /// (`cp -p`, `rsync -t`) carries the ctime over, so a replaced or rewritten file is read.
    inode: u64,
    changed_ns: i64,
}

/// Checks every file meta.json lists against its sha256; `hashing(name, bytes)` is told before
/// a file is read whole. Files whose size, inode and status-change time match their last good
/// check are skipped. A data dir lab cannot write to is checked every time.
pub fn verify_files(dir: &Path, meta: &Meta, hashing: &mut dyn FnMut(&str, u64)) -> Result<()> {
    let record = dir.join(VERIFIED);
    let mut checked: BTreeMap<String, Checked> = fs::read_to_string(&record)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let mut changed = false;
    for (name, info) in &meta.files {
        let path = dir.join(name);
        let stat = fs::metadata(&path).with_context(|| {
            format!(
                "cannot open {}; re-run `lab data prepare` for this data dir",
                path.display()
            )
        })?;
        let now = Checked {
            sha256: info.sha256.clone(),
            bytes: stat.len(),
            inode: stat.ino(),
            changed_ns: stat.ctime() * 1_000_000_000 + stat.ctime_nsec(),
        };
        if checked.get(name) == Some(&now) {
            continue;
        }
        hashing(name, now.bytes);
        let sha = lab_fsio::sha256_file(&path)?;
        if sha != info.sha256 {
            bail!(
                "{}: sha256 {} is not the {} meta.json records: the file is corrupt or was changed after preparing; re-run `lab data prepare` (or copy the data again)",
                path.display(),
                lab_fsio::short_sha256(&sha),
                lab_fsio::short_sha256(&info.sha256)
            );
        }
        checked.insert(name.clone(), now);
        changed = true;
    }
    if changed {
        // Only a shortcut for the next check: a read-only data dir goes without it.
        let text = serde_json::to_string_pretty(&checked)?;
        let _ = lab_fsio::write_atomic(&record, text.as_bytes());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared() -> (tempfile::TempDir, Meta) {
        let dir = tempfile::tempdir().unwrap();
        crate::gpt2::ensure_tinyshakespeare(dir.path()).unwrap();
        let meta = Meta::load(dir.path()).unwrap();
        (dir, meta)
    }

    /// Each file is read on the first check, not on the next; a byte changed in place (same
    /// length, so the size check passes) is refused in one line naming the file and the fix.
    #[test]
    fn a_changed_byte_is_found_and_good_files_are_read_once() {
        let (dir, meta) = prepared();
        let mut read = Vec::new();
        verify_files(dir.path(), &meta, &mut |name, _| {
            read.push(name.to_string())
        })
        .unwrap();
        assert_eq!(read, ["train.bin", "val.bin"]);
        read.clear();
        verify_files(dir.path(), &meta, &mut |name, _| {
            read.push(name.to_string())
        })
        .unwrap();
        assert!(read.is_empty(), "{read:?}");

        let val = dir.path().join("val.bin");
        // The kernel stamps ctime from a clock that ticks every few milliseconds: a rewrite in
        // the same tick as the last check would look unchanged (as it would to any make).
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut bytes = fs::read(&val).unwrap();
        bytes[1000] ^= 0x01;
        fs::write(&val, &bytes).unwrap();
        let e = verify_files(dir.path(), &meta, &mut |name, _| {
            read.push(name.to_string())
        })
        .unwrap_err()
        .to_string();
        assert_eq!(read, ["val.bin"]);
        assert!(
            e.contains("val.bin: sha256") && e.contains("lab data prepare"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }

    /// A garbled record is ignored: every file is read again.
    #[test]
    fn a_garbled_record_means_checking_again() {
        let (dir, meta) = prepared();
        fs::write(dir.path().join(VERIFIED), "not json").unwrap();
        let mut read = 0;
        verify_files(dir.path(), &meta, &mut |_, _| read += 1).unwrap();
        assert_eq!(read, 2);
    }
}
