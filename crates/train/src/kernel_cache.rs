//! Where cubecl keeps the kernels it compiled and the autotune results it measured, so that a
//! second launch on the same GPU host skips the work.
//!
//! cubecl compiles every kernel at run time (NVRTC on CUDA), about a second each. On an H100
//! the first x1-50m steps waited about 100 s for some 400 kernels; the tiny config's first
//! step and its checkpoint, close to 5 minutes. A restart after a preemption would pay that
//! again. cubecl can keep compiled PTX and autotune results on disk, but its compilation cache
//! is off unless a `cubecl.toml` turns it on, and its autotune cache sits in a `target/`
//! folder next to the nearest `Cargo.toml`.
//!
//! lab turns both on, in one folder: `LAB_KERNEL_CACHE`, else `$XDG_CACHE_HOME/lab/kernels`,
//! else `~/.cache/lab/kernels`. A `cubecl.toml` in the working folder or above it wins: whoever
//! wrote one chose their own settings.

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

/// The `cubecl.toml` (or `CubeCL.toml`) cubecl would read from `cwd`: it looks in the folder
/// and then in each parent.
pub fn cubecl_toml(cwd: &Path, exists: &dyn Fn(&Path) -> bool) -> Option<PathBuf> {
    cwd.ancestors()
        .flat_map(|dir| ["cubecl.toml", "CubeCL.toml"].map(|name| dir.join(name)))
        .find(|file| exists(file))
}

/// Points cubecl's compilation and autotune caches at the kernel cache folder, unless a
/// `cubecl.toml` applies or cubecl's settings were already read. Call before the first kernel.
#[cfg(feature = "cuda")]
pub fn use_kernel_cache() {
    use burn::cubecl::config::{cache::CacheConfig, CubeClRuntimeConfig, RuntimeConfig};

    let cwd = std::env::current_dir().unwrap_or_default();
    if cubecl_toml(&cwd, &|p| p.exists()).is_some() {
        return;
    }
    let Some(dir) = kernel_cache_dir(&|name| std::env::var(name).ok()) else {
        return;
    };
    let mut config = CubeClRuntimeConfig::default();
    config.compilation.cache = Some(CacheConfig::File(dir.clone()));
    config.autotune.cache = CacheConfig::File(dir);
    // `RuntimeConfig::set` panics once the settings were read; setting the slot only while it
    // is empty keeps a second backend dispatch in the same process (lab run) harmless.
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
            cubecl_toml(cwd, &on_disk(&["/work/other/cubecl.toml"])),
            None
        );
    }
}
