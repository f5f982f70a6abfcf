//! Where cubecl keeps the kernels it compiled and the autotune results it measured, so that a
//! second launch on the same GPU host skips the work.
//!
//! cubecl compiles every kernel at run time (NVRTC on CUDA), about a second each. On an H100
//! the tiny config's first step and its checkpoint took 286 s, 293 kernels; x1-50m's first
//! five steps took 103 s with part of its kernels already compiled. A restart after a
//! preemption would pay that again. cubecl can keep compiled PTX and autotune results on disk,
//! but its compilation cache is off unless a `cubecl.toml` turns it on, and its autotune cache
//! sits in a `target/` folder next to the nearest `Cargo.toml`.
//!
//! lab turns both on, in one folder: `LAB_KERNEL_CACHE`, else `$XDG_CACHE_HOME/lab/kernels`,
//! else `~/.cache/lab/kernels`, in a subfolder per build of lab and GPU architecture. cubecl
//! finds a compiled kernel by its Rust type, launch settings and cubecl's version: a kernel
//! edited since, or compiled for another GPU on a shared home folder, would otherwise be served
//! from the cache. A `cubecl.toml` (or a `burn.toml`, which may hold a `[cubecl]` section) in
//! the working folder or above it wins: whoever wrote one chose their own settings. cubecl's
//! variables (`CUBECL_AUTOTUNE_LEVEL`, `CUBECL_DEBUG_LOG`, …) apply either way.

use std::path::{Path, PathBuf};

/// The cache folder the environment names (`var` reads a variable), or `None` when it names
/// none (no `LAB_KERNEL_CACHE`, `XDG_CACHE_HOME` or `HOME`).
pub fn kernel_cache_dir(var: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |name| var(name).filter(|v| !v.is_empty());
    if let Some(dir) = set("LAB_KERNEL_CACHE") {
        return Some(PathBuf::from(dir));
    }
    let cache_home = set("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| set("HOME").map(|home| Path::new(&home).join(".cache")))?;
    Some(cache_home.join("lab").join("kernels"))
}

/// The settings file cubecl would read from `cwd` (`cubecl.toml`, or a `burn.toml` for its
/// `[cubecl]` section): it looks in the folder and then in each parent.
pub fn cubecl_toml(cwd: &Path, exists: &dyn Fn(&Path) -> bool) -> Option<PathBuf> {
    const NAMES: [&str; 4] = ["cubecl.toml", "CubeCL.toml", "burn.toml", "Burn.toml"];
    cwd.ancestors()
        .flat_map(|dir| NAMES.map(|name| dir.join(name)))
        .find(|file| exists(file))
}

/// The subfolder of `root` for kernels this build of lab compiles for one GPU architecture
/// (CUDA's compute capability, when it could be read).
pub fn build_folder(root: &Path, build: &str, arch: Option<(i32, i32)>) -> PathBuf {
    match arch {
        Some((major, minor)) => root.join(format!("{build}-sm{major}{minor}")),
        None => root.join(build),
    }
}

/// This build of lab, as its executable's size and modification time: a rebuild gets a new
/// one. (A hash of the whole binary would cost ~0.5 s per launch.)
pub fn build_id() -> String {
    use std::hash::{Hash, Hasher};
    let meta = std::env::current_exe().and_then(std::fs::metadata);
    let Ok(meta) = meta else {
        return "unknown-build".into();
    };
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (meta.len(), meta.modified().ok()).hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// Points cubecl's compilation and autotune caches at the kernel cache folder for this build
/// and GPU `gpu`, unless a settings file applies or cubecl's settings were already read. Call
/// before the first kernel.
#[cfg(feature = "cuda")]
pub fn use_kernel_cache(gpu: usize) {
    use burn::cubecl::config::{cache::CacheConfig, CubeClRuntimeConfig, RuntimeConfig};

    // A later dispatch in the same process (lab run: train, then evaluate) finds the settings
    // in place and skips the file lookups and the CUDA context below.
    if CubeClRuntimeConfig::storage().lock().is_some() {
        return;
    }
    let cwd = std::env::current_dir().unwrap_or_default();
    if cubecl_toml(&cwd, &|p| p.exists()).is_some() {
        return;
    }
    let Some(root) = kernel_cache_dir(&|name| std::env::var(name).ok()) else {
        return;
    };
    let arch = cudarc::driver::CudaContext::new(gpu)
        .and_then(|ctx| ctx.compute_capability())
        .ok();
    let dir = build_folder(&root, &build_id(), arch);
    let mut config = CubeClRuntimeConfig::default();
    config.compilation.cache = Some(CacheConfig::File(dir.clone()));
    config.autotune.cache = CacheConfig::File(dir);
    // What cubecl itself does after reading its file: the environment has the last word.
    let config = config.override_from_env();
    // `RuntimeConfig::set` panics once the settings were read; fill the slot only if still empty.
    let mut slot = CubeClRuntimeConfig::storage().lock();
    if slot.is_none() {
        *slot = Some(std::sync::Arc::new(config));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_cache_folder_is_lab_kernel_cache_then_xdg_then_home() {
        let all = [
            ("LAB_KERNEL_CACHE", "/scratch/k"),
            ("XDG_CACHE_HOME", "/xdg"),
            ("HOME", "/home/u"),
        ];
        assert_eq!(kernel_cache_dir(&env(&all)), Some("/scratch/k".into()));
        assert_eq!(
            kernel_cache_dir(&env(&all[1..])),
            Some("/xdg/lab/kernels".into())
        );
        assert_eq!(
            kernel_cache_dir(&env(&all[2..])),
            Some("/home/u/.cache/lab/kernels".into())
        );
        // An empty variable counts as unset, as XDG asks.
        let empty = [
            ("LAB_KERNEL_CACHE", ""),
            ("XDG_CACHE_HOME", ""),
            ("HOME", "/h"),
        ];
        assert_eq!(
            kernel_cache_dir(&env(&empty)),
            Some("/h/.cache/lab/kernels".into())
        );
        assert_eq!(kernel_cache_dir(&env(&[])), None);
    }

    #[test]
    fn each_build_and_gpu_architecture_has_its_own_folder() {
        let root = Path::new("/c");
        assert_eq!(
            build_folder(root, "b1", Some((9, 0))),
            Path::new("/c/b1-sm90")
        );
        assert_ne!(
            build_folder(root, "b1", Some((8, 0))),
            build_folder(root, "b1", Some((9, 0)))
        );
        assert_ne!(
            build_folder(root, "b1", None),
            build_folder(root, "b2", None)
        );
        // The same binary names the same build every time.
        assert_eq!(build_id(), build_id());
        assert_ne!(build_id(), "unknown-build");
    }

    #[test]
    fn a_cubecl_toml_in_the_folder_or_above_is_found() {
        let on_disk = |files: &'static [&'static str]| {
            move |p: &Path| files.iter().any(|f| p == Path::new(f))
        };
        let cwd = Path::new("/work/repo/sub");
        assert_eq!(
            cubecl_toml(cwd, &on_disk(&["/work/repo/cubecl.toml"])),
            Some("/work/repo/cubecl.toml".into())
        );
        assert_eq!(
            cubecl_toml(cwd, &on_disk(&["/work/repo/sub/CubeCL.toml"])),
            Some("/work/repo/sub/CubeCL.toml".into())
        );
        assert_eq!(
            cubecl_toml(cwd, &on_disk(&["/work/burn.toml"])),
            Some("/work/burn.toml".into())
        );
        assert_eq!(
            cubecl_toml(cwd, &on_disk(&["/work/other/cubecl.toml"])),
            None
        );
    }
}
