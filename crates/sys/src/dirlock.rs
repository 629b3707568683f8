//! One process at a time in a data directory: an exclusive `flock` on `DIR/hongbao.lock`,
//! held for as long as the process holds the `DirLock`, with who holds it written inside.
//!
//! Two servers on one ledger would both append to it (the second's events colliding with
//! the first's sequence numbers); a restore under a running server would swap its file
//! away. The kernel releases the lock when its holder exits, however it exits, so a crash
//! leaves nothing to clean up: the file stays, the lock does not. The file's text (the
//! pid, the command, since when) is only what a refused process shows its user.
//!
//! The directory itself is made readable by its owner only: it holds the ledger (every
//! user's money, the admin keys' hashes and the admin log) and the first operator key.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The lock's file in a data directory.
pub const LOCK_FILE: &str = "hongbao.lock";

/// An exclusive hold on a data directory, released when dropped (or when the process
/// ends).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    path: PathBuf,
}

/// Why a directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it: what it wrote of itself.
    #[error("{dir} is in use by {holder}: stop that first, or give another data directory")]
    Held { dir: PathBuf, holder: String },
    #[error("locking {dir}: {source}")]
    Io {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl DirLock {
    /// Makes `dir` (mode 0700) if it is missing, narrows it to its owner if it is open to
    /// others, and takes its lock for `what` (`hongbao serve`, `hongbao restore`), or says
    /// who holds it.
    pub fn acquire(dir: &Path, what: &str) -> Result<DirLock, LockError> {
        let io = |source| LockError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        make_private_dir(dir).map_err(io)?;
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io(e));
            }
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            let holder = match text.trim() {
                "" => "another process".to_string(),
                held => held.to_string(),
            };
            return Err(LockError::Held {
                dir: dir.to_path_buf(),
                holder,
            });
        }
        write_holder(&mut file, what).map_err(io)?;
        Ok(DirLock { _file: file, path })
    }

    /// The lock's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The lock's descriptor, to hand to the process taking the directory over (an
    /// upgrade): a flock belongs to the open file, so the receiver holds the same lock,
    /// and it stays held when this process exits.
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self._file.as_fd()
    }

    /// The lock of `dir` handed over by the process that held it (`as_fd`), with `what`
    /// written in as its holder now. Refused unless the descriptor is that directory's
    /// lock file and holds its lock.
    pub fn adopt(dir: &Path, fd: std::os::fd::OwnedFd, what: &str) -> Result<DirLock, LockError> {
        use std::os::unix::fs::MetadataExt;
        let io = |source| LockError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        let path = dir.join(LOCK_FILE);
        let mut file = File::from(fd);
        let (theirs, ours) = (
            file.metadata().map_err(io)?,
            std::fs::metadata(&path).map_err(io)?,
        );
        if (theirs.dev(), theirs.ino()) != (ours.dev(), ours.ino()) {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the descriptor handed over is not this directory's lock",
            )));
        }
        // Taking it again on the same open file succeeds only where it is held (ours now).
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(io(std::io::Error::last_os_error()));
        }
        write_holder(&mut file, what).map_err(io)?;
        Ok(DirLock { _file: file, path })
    }
}

fn write_holder(file: &mut File, what: &str) -> std::io::Result<()> {
    let now = crate::clock::unix_ms() / 1000;
    let me = format!(
        "{what} (pid {}, since Unix time {now})\n",
        std::process::id()
    );
    file.set_len(0)?;
    file.rewind()?;
    file.write_all(me.as_bytes())
}

/// `dir`, made with mode 0700 if missing; one open to its group or others is narrowed to
/// its owner (said in the log).
pub fn make_private_dir(dir: &Path) -> std::io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o700))?;
        tracing::info!(
            dir = %dir.display(),
            was = format!("{:o}", mode & 0o777),
            "the data directory was open to others: now its owner's only (0700)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_named_and_a_drop_frees_it() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        let first = DirLock::acquire(&dir, "hongbao serve").unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        // A second open file description of the same file, as another process has.
        let second = DirLock::acquire(&dir, "hongbao restore").unwrap_err();
        let text = second.to_string();
        assert!(text.contains("hongbao serve (pid"), "{text}");
        assert!(text.contains(&std::process::id().to_string()), "{text}");
        drop(first);
        let again = DirLock::acquire(&dir, "hongbao restore").unwrap();
        let held = std::fs::read_to_string(again.path()).unwrap();
        assert!(held.starts_with("hongbao restore (pid"), "{held}");
    }

    #[test]
    fn a_lock_handed_over_stays_held_after_its_first_holder_lets_go() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        let first = DirLock::acquire(&dir, "hongbao serve").unwrap();
        let fd = first.as_fd().try_clone_to_owned().unwrap();
        let second = DirLock::adopt(&dir, fd, "hongbao serve --upgrade").unwrap();
        drop(first);
        let refused = DirLock::acquire(&dir, "hongbao restore").unwrap_err();
        assert!(
            refused.to_string().contains("hongbao serve --upgrade (pid"),
            "{refused}"
        );
        drop(second);
        DirLock::acquire(&dir, "hongbao restore").unwrap();
        // Another file is no lock of this directory.
        let other = std::fs::File::create(root.path().join("other")).unwrap();
        assert!(DirLock::adopt(&dir, other.into(), "x").is_err());
    }

    #[test]
    fn a_directory_open_to_others_is_narrowed() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        make_private_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
