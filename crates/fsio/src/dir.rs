//! A folder replaced in one step: an export, or a Hugging Face folder, is written whole under a
//! temporary name and then put in place, so a reader or a crash finds the old folder or the new
//! one, never a mix and never neither.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Puts the finished folder `stage` at `out`. A folder already at `out` is exchanged with it in
/// one rename and then removed (after a crash, the next writer's cleanup of `stage`'s
/// temporary name removes it). Where the file system cannot exchange, the old folder is moved
/// aside first, under a name [`recover_replaced_dir`] puts back if the new one never arrived.
pub fn replace_dir(stage: &Path, out: &Path) -> Result<()> {
    let old = if !out.exists() {
        rename_into(stage, out)?;
        None
    } else if exchange(stage, out)? {
        Some(stage.to_path_buf())
    } else {
        Some(move_aside_then_rename(stage, out)?)
    };
    crate::sync_parent(out)?;
    if let Some(old) = old {
        // The new folder is in place: an old one left here is the next writer's to remove.
        if let Err(e) = fs::remove_dir_all(&old) {
            eprintln!("warning: cannot remove {}: {e}", old.display());
        }
    }
    Ok(())
}

/// Holds `out`'s writers apart: one export to a folder at a time, from its cleanup of what a
/// killed one left to [`replace_dir`]. The lock is `.NAME.lock` beside `out`, released when
/// the returned file is dropped.
pub fn lock_dir_writers(out: &Path) -> Result<fs::File> {
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    crate::lock_exclusive(&out.with_file_name(format!(".{name}.lock"))).with_context(|| {
        format!(
            "another process is writing {}; wait for it to end",
            out.display()
        )
    })
}

/// Before writing `out` again, what killed writers left beside it: an old folder that
/// [`replace_dir`] had moved aside is put back when the new one never arrived (a kill between
/// its two renames) and removed otherwise; temporary folders (`.NAME.tmp-…`, from
/// [`crate::temp_sibling`]) of other processes are removed.
pub fn recover_replaced_dir(out: &Path) -> Result<()> {
    let (Some(parent), Some(name)) = (out.parent(), out.file_name()) else {
        return Ok(());
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let name = name.to_string_lossy();
    let (aside_prefix, temp_prefix) = (format!(".{name}.old-"), format!(".{name}.tmp-"));
    let ours = format!(".tmp-{}-", std::process::id());
    for entry in fs::read_dir(parent).into_iter().flatten().flatten() {
        let entry_name = entry.file_name().to_string_lossy().into_owned();
        if entry_name.starts_with(&temp_prefix) && !entry_name.contains(&ours) {
            let _ = fs::remove_dir_all(entry.path());
            continue;
        }
        // `.NAME.old-PID` only (another folder's temporary name may start the same way).
        let pid = entry_name.strip_prefix(&aside_prefix).unwrap_or_default();
        if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let aside = entry.path();
        if out.exists() {
            fs::remove_dir_all(&aside)
                .with_context(|| format!("cannot remove {}", aside.display()))?;
        } else {
            fs::rename(&aside, out).with_context(|| {
                format!("cannot put {} back at {}", aside.display(), out.display())
            })?;
        }
    }
    Ok(())
}

/// Where the file system cannot exchange: the old folder aside, the new one in; returns
/// where the old one went.
fn move_aside_then_rename(stage: &Path, out: &Path) -> Result<PathBuf> {
    let aside = set_aside_name(out);
    fs::rename(out, &aside).with_context(|| format!("cannot move aside {}", out.display()))?;
    rename_into(stage, out)?;
    Ok(aside)
}

fn rename_into(stage: &Path, out: &Path) -> Result<()> {
    fs::rename(stage, out)
        .with_context(|| format!("cannot rename {} into {}", stage.display(), out.display()))
}

/// `.NAME.old-PID` beside `out`: what [`recover_replaced_dir`] looks for.
fn set_aside_name(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    out.with_file_name(format!(".{name}.old-{}", std::process::id()))
}

/// Exchanges the entries at `a` and `b` in one step (Linux's `renameat2` with
/// `RENAME_EXCHANGE`); false, with nothing moved, where the kernel or the file system cannot.
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes());
    let (ca, cb) = (c_path(a)?, c_path(b)?);
    // SAFETY: both are NUL-terminated paths that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => Ok(false),
        _ => Err(err)
            .with_context(|| format!("cannot exchange {} with {}", a.display(), b.display())),
    }
}

#[cfg(not(target_os = "linux"))]
fn exchange(_: &Path, _: &Path) -> Result<bool> {
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder_with(path: &Path, text: &str) {
        fs::create_dir_all(path).unwrap();
        fs::write(path.join("manifest.json"), text).unwrap();
    }

    fn text_in(path: &Path) -> String {
        fs::read_to_string(path.join("manifest.json")).unwrap()
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn exchange_swaps_two_folders_in_one_step() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        folder_with(&a, "new");
        folder_with(&b, "old");
        assert!(exchange(&a, &b).unwrap(), "tmpfs and ext4 exchange");
        assert_eq!((text_in(&a), text_in(&b)), ("old".into(), "new".into()));
    }

    #[test]
    fn a_replaced_folder_holds_the_new_files_and_nothing_else_is_left() {
        let tmp = tempfile::tempdir().unwrap();
        let (stage, out) = (tmp.path().join(".out.tmp-1-0"), tmp.path().join("out"));
        folder_with(&out, "old");
        fs::write(out.join("only-in-old.txt"), "x").unwrap();
        folder_with(&stage, "new");
        replace_dir(&stage, &out).unwrap();
        assert_eq!(text_in(&out), "new");
        assert_eq!(names_in(&out), ["manifest.json"]);
        assert_eq!(names_in(tmp.path()), ["out"]);
        // And where there was none.
        let fresh = tmp.path().join("fresh");
        folder_with(&stage, "first");
        replace_dir(&stage, &fresh).unwrap();
        assert_eq!(text_in(&fresh), "first");
        assert_eq!(names_in(tmp.path()), ["fresh", "out"]);
    }

    #[test]
    fn one_writer_of_a_folder_at_a_time() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("new").join("out");
        let held = lock_dir_writers(&out).unwrap();
        let e = format!("{:#}", lock_dir_writers(&out).unwrap_err());
        assert!(e.contains("another process is writing"), "{e}");
        drop(held);
        lock_dir_writers(&out).unwrap();
    }

    #[test]
    fn only_a_folder_set_aside_is_put_back() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        // The temporary folder of an export named `out.old-x`, not one `out`'s writer set aside.
        folder_with(&tmp.path().join(".out.old-x.tmp-1-0"), "other");
        recover_replaced_dir(&out).unwrap();
        assert!(!out.exists());
    }

    #[test]
    fn an_old_folder_moved_aside_comes_back_when_the_new_one_never_arrived() {
        let tmp = tempfile::tempdir().unwrap();
        let (stage, out) = (tmp.path().join(".out.tmp-1-0"), tmp.path().join("out"));
        folder_with(&out, "old");
        folder_with(&stage, "new");
        // A kill after both renames of the fallback: the new one is in place, the old one
        // aside goes.
        let aside = move_aside_then_rename(&stage, &out).unwrap();
        assert_eq!(
            (text_in(&out), text_in(&aside)),
            ("new".into(), "old".into())
        );
        recover_replaced_dir(&out).unwrap();
        assert_eq!(text_in(&out), "new");
        assert_eq!(names_in(tmp.path()), ["out"]);
        // A kill between them: `out` gone, the old one aside, which comes back.
        fs::rename(&out, &aside).unwrap();
        recover_replaced_dir(&out).unwrap();
        assert_eq!(text_in(&out), "new");
        assert_eq!(names_in(tmp.path()), ["out"]);
    }
}
