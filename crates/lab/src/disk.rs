//! A small disk to fill on purpose (the `disk-full` faults): a tmpfs mounted on a
//! server's data directory for a run (root) and unmounted at its end, and the filler
//! that fills it until ENOSPC for a while.
//!
//! Why a tmpfs of its own: filling the disk the data usually sits on would fill it for
//! everything else on the machine too, and take a while; a tmpfs sized for the run fills
//! in a moment and holds nothing but the data. `fill` checks that the directory it fills
//! is on a tmpfs before it writes a byte.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};

/// What the filler is called, in the directory filled.
const FILLER: &str = "disk-full.filler";

/// A tmpfs mounted on a directory for a run; unmounted when dropped (lazily: a server
/// still holding its files lets go of them as it dies).
pub struct SmallDisk {
    dir: PathBuf,
    pub bytes: u64,
    mounted: bool,
}

impl SmallDisk {
    /// Mounts a tmpfs of `bytes` on `dir` (created if missing).
    pub fn mount(dir: &Path, bytes: u64) -> Result<SmallDisk> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let (fs, target) = (c_string("tmpfs")?, c_string(dir.as_os_str().as_bytes())?);
        let data = c_string(format!("size={bytes},mode=0755"))?;
        // SAFETY: every pointer is to a NUL-terminated string that outlives the call.
        let rc = unsafe {
            libc::mount(
                fs.as_ptr(),
                target.as_ptr(),
                fs.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                data.as_ptr().cast(),
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            return Err(Error::io(
                format!(
                    "mounting a {} MiB tmpfs on {} (needs root)",
                    bytes >> 20,
                    dir.display()
                ),
                e,
            ));
        }
        Ok(SmallDisk {
            dir: dir.to_path_buf(),
            bytes,
            mounted: true,
        })
    }

    /// Unmounts the tmpfs, keeping its files (not the filler): copied aside first and put
    /// back in the directory, on the disk under it. Whatever wrote them must have stopped.
    pub fn unmount_keeping(mut self) -> Result<()> {
        let kept = self.dir.with_extension("kept");
        let at = |doing: &str, path: &Path| format!("{doing} {}", path.display());
        if kept.exists() {
            std::fs::remove_dir_all(&kept).map_err(|e| Error::io(at("removing", &kept), e))?;
        }
        std::fs::create_dir_all(&kept).map_err(|e| Error::io(at("creating", &kept), e))?;
        let reading = |e| Error::io(at("reading", &self.dir), e);
        for entry in std::fs::read_dir(&self.dir).map_err(reading)? {
            let entry = entry.map_err(reading)?;
            let is_file = entry.file_type().map_err(reading)?.is_file();
            if is_file && entry.file_name() != FILLER {
                std::fs::copy(entry.path(), kept.join(entry.file_name()))
                    .map_err(|e| Error::io(at("keeping", &entry.path()), e))?;
            }
        }
        self.mounted = false;
        unmount(&self.dir)?;
        std::fs::remove_dir(&self.dir).map_err(|e| Error::io(at("removing", &self.dir), e))?;
        std::fs::rename(&kept, &self.dir).map_err(|e| {
            Error::io(
                format!("moving {} to {}", kept.display(), self.dir.display()),
                e,
            )
        })?;
        Ok(())
    }

    /// Unmounts a tmpfs an earlier run left on `dir` (one that was killed), so the
    /// directory can be cleared.
    pub fn clear_stale(dir: &Path) {
        if is_tmpfs(dir) {
            let _ = unmount(dir);
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        if self.mounted {
            if let Err(e) = unmount(&self.dir) {
                tracing::warn!(dir = %self.dir.display(), error = format!("{e:#}"), "unmounting a tmpfs failed");
            }
        }
    }
}

fn unmount(dir: &Path) -> Result<()> {
    let target = c_string(dir.as_os_str().as_bytes())?;
    // SAFETY: a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::io(format!("unmounting {}", dir.display()), e));
    }
    Ok(())
}

/// A path or an option for a system call; one with a NUL byte in it is refused.
fn c_string(s: impl Into<Vec<u8>>) -> Result<CString> {
    CString::new(s).map_err(|e| Error::Refused(e.to_string()))
}

/// Whether `dir` is on a tmpfs.
pub fn is_tmpfs(dir: &Path) -> bool {
    let Ok(path) = c_string(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs(2) writes into the zeroed struct we own; the path is NUL-terminated.
    unsafe {
        let mut fs: libc::statfs = std::mem::zeroed();
        libc::statfs(path.as_ptr(), &mut fs) == 0 && fs.f_type == libc::TMPFS_MAGIC
    }
}

/// What filling the disk did.
pub struct Filled {
    /// Bytes the filler took before the disk said ENOSPC.
    pub bytes: u64,
}

/// Fills the tmpfs of `dir` with a filler file until ENOSPC, holds it full for `hold`,
/// then deletes the filler. Refuses a directory that is not on a tmpfs.
pub fn fill(dir: &Path, hold: Duration) -> Result<Filled> {
    if !is_tmpfs(dir) {
        return Err(Error::Refused(format!(
            "{} is not on a tmpfs: only a small disk mounted for the purpose is filled",
            dir.display()
        )));
    }
    let path = dir.join(FILLER);
    let mut bytes = 0u64;
    let full = {
        let mut file = std::fs::File::create(&path)
            .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
        let chunk = vec![0u8; 1 << 20];
        loop {
            match file.write(&chunk) {
                Ok(0) => break None,
                Ok(n) => bytes += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Some(e),
            }
        }
        // The file is closed here: its room comes back as soon as it is deleted.
    };
    let result = match full {
        Some(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
            std::thread::sleep(hold);
            Ok(Filled { bytes })
        }
        other => Err(Error::Failed(format!(
            "writing {} stopped without ENOSPC after {bytes} bytes: {other:?}",
            path.display()
        ))),
    };
    std::fs::remove_file(&path)
        .map_err(|e| Error::io(format!("deleting {}", path.display()), e))?;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_tmpfs_is_filled() {
        let dir = std::env::temp_dir().join(format!("hongbao-disk-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        if !is_tmpfs(&dir) {
            let e = fill(&dir, Duration::ZERO).err().expect("refused");
            assert!(e.to_string().contains("not on a tmpfs"), "{e}");
            assert!(!dir.join(FILLER).exists());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
