//! Opening a file that must be a regular file (the region file, a node file) without opening
//! whatever else stands at its path first. Opening is not free of effects on other kinds of
//! file: a FIFO's open wakes a writer blocked on it, a terminal opened without `O_NOCTTY` can
//! become the controlling one, and some devices act on open (a watchdog arms). So the path is
//! first opened `O_PATH` (no effect on anything), checked, then reopened through
//! `/proc/self/fd`, which reaches that very inode; where `/proc` is missing it is opened by name
//! and must turn out to be the same file.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::{AsRawFd, FromRawFd, RawFd};

/// Why a regular file could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// The path is a symbolic link (never followed).
    Symlink,
    /// The path is a FIFO, device, socket or directory (never opened).
    NotRegular,
    /// The path kept changing under us.
    Unsteady,
    /// Anything else, `ENOENT` included (absent and not to be created).
    Io(io::Error),
}

/// Open `name` (relative to the directory `dir`, or to the working directory when `None`) for
/// `access` (`O_RDONLY` or `O_RDWR`), only if it is a regular file; create it exclusively with
/// `mode` (before the umask) when absent and `create` is set. Returns the file and whether it
/// was created.
pub fn open(dir: Option<RawFd>, name: &CStr, access: libc::c_int, create: bool, mode: libc::mode_t) -> Result<(File, bool), OpenError> {
    open_via("/proc/self/fd", dir, name, access, create, mode)
}

/// [`open`], reopening through `fd_dir`'s magic links (a directory that is not there stands for
/// a machine without `/proc`).
fn open_via(fd_dir: &str, dir: Option<RawFd>, name: &CStr, access: libc::c_int, create: bool, mode: libc::mode_t) -> Result<(File, bool), OpenError> {
    let at = dir.unwrap_or(libc::AT_FDCWD);
    let flags = access | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK;
    for _ in 0..4 {
        // SAFETY: valid C string; the descriptor is owned by `probe` below.
        let pfd = unsafe { libc::openat(at, name.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
        if pfd < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOENT) || !create {
                return Err(OpenError::Io(e));
            }
            // Creating makes a new regular file; it never opens one that is there.
            // SAFETY: as above.
            let fd = unsafe { libc::openat(at, name.as_ptr(), flags | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW, mode as libc::c_uint) };
            if fd >= 0 {
                // SAFETY: fd is ours.
                return Ok((unsafe { File::from_raw_fd(fd) }, true));
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EEXIST) => continue,
                Some(libc::ELOOP) => return Err(OpenError::Symlink), // a dangling link
                _ => return Err(OpenError::Io(e)),
            }
        }
        // SAFETY: pfd is ours.
        let probe = unsafe { File::from_raw_fd(pfd) };
        let meta = probe.metadata().map_err(OpenError::Io)?;
        if meta.file_type().is_symlink() {
            return Err(OpenError::Symlink);
        }
        if !meta.file_type().is_file() {
            return Err(OpenError::NotRegular);
        }
        let via_proc = CString::new(format!("{fd_dir}/{}", probe.as_raw_fd())).expect("no NUL");
        // SAFETY: valid C string.
        let fd = match unsafe { libc::open(via_proc.as_ptr(), flags) } {
            fd if fd >= 0 => fd,
            _ if io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) => {
                // No /proc: by name, then make sure it is the file checked.
                // SAFETY: as above.
                let fd = unsafe { libc::openat(at, name.as_ptr(), flags | libc::O_NOFOLLOW) };
                if fd < 0 {
                    let e = io::Error::last_os_error();
                    match e.raw_os_error() {
                        Some(libc::ENOENT) | Some(libc::ELOOP) => continue,
                        _ => return Err(OpenError::Io(e)),
                    }
                }
                fd
            }
            _ => return Err(OpenError::Io(io::Error::last_os_error())),
        };
        // SAFETY: fd is ours.
        let file = unsafe { File::from_raw_fd(fd) };
        match file.metadata() {
            Ok(m) if (m.dev(), m.ino()) == (meta.dev(), meta.ino()) => return Ok((file, false)),
            Ok(_) => continue,
            Err(e) => return Err(OpenError::Io(e)),
        }
    }
    Err(OpenError::Unsteady)
}

/// Give `file` real blocks for its first `len` bytes (growing it to `len` if shorter), so a
/// full filesystem is an error now rather than at a later write (`ENOSPC`) or at the first
/// touch of a mapped hole (`SIGBUS`). Bytes already there are never changed.
pub fn allocate(file: &File, len: u64) -> io::Result<()> {
    // SAFETY: valid descriptor; posix_fallocate never shrinks a file or changes its bytes.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) } {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// A FIFO with a writer blocked opening it, to show that a path was never opened: any open of
/// the FIFO, for reading or writing, lets the writer through.
#[cfg(test)]
pub mod testing {
    use std::ffi::CString;
    use std::path::Path;
    use std::sync::mpsc;
    use std::time::Duration;

    pub struct BlockedWriter {
        path: CString,
        done: mpsc::Receiver<()>,
    }

    impl BlockedWriter {
        /// Make a FIFO at `path` and block a writer on it.
        pub fn at(path: &Path) -> BlockedWriter {
            use std::os::unix::ffi::OsStrExt;
            let path = CString::new(path.as_os_str().as_bytes()).unwrap();
            // SAFETY: valid C string.
            assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o666) }, 0, "mkfifo");
            let (tx, done) = mpsc::channel();
            let p = path.clone();
            std::thread::spawn(move || {
                // SAFETY: valid C string; blocks until someone opens the FIFO.
                let fd = unsafe { libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
                if fd >= 0 {
                    // SAFETY: ours.
                    unsafe { libc::close(fd) };
                }
                let _ = tx.send(());
            });
            std::thread::sleep(Duration::from_millis(100)); // the writer is in its open by now
            BlockedWriter { path, done }
        }

        /// Whether the writer is still waiting: nobody opened the FIFO.
        pub fn still_blocked(&self) -> bool {
            self.done.recv_timeout(Duration::from_millis(50)).is_err()
        }
    }

    impl Drop for BlockedWriter {
        fn drop(&mut self) {
            // Let the writer through so its thread ends.
            // SAFETY: valid C string.
            let fd = unsafe { libc::open(self.path.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC) };
            let _ = self.done.recv_timeout(Duration::from_secs(1));
            if fd >= 0 {
                // SAFETY: ours.
                unsafe { libc::close(fd) };
            }
            // SAFETY: valid C string.
            unsafe { libc::unlink(self.path.as_ptr()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::BlockedWriter;
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    fn tmp(tag: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("vgpu-regular-{tag}-{}", std::process::id()))
    }

    fn c(p: &std::path::Path) -> CString {
        CString::new(p.as_os_str().as_bytes()).unwrap()
    }

    #[test]
    fn a_fifo_is_refused_without_being_opened() {
        let p = tmp("fifo");
        let w = BlockedWriter::at(&p);
        for (access, create) in [(libc::O_RDWR, true), (libc::O_RDONLY, false)] {
            assert!(matches!(open(None, &c(&p), access, create, 0o666), Err(OpenError::NotRegular)));
        }
        assert!(w.still_blocked(), "the FIFO was opened");
    }

    #[test]
    fn regular_files_open_links_do_not_and_absent_ones_are_created_once() {
        let p = tmp("file");
        let _ = std::fs::remove_file(&p);
        assert!(matches!(open(None, &c(&p), libc::O_RDWR, false, 0o666), Err(OpenError::Io(e)) if e.raw_os_error() == Some(libc::ENOENT)));
        let (f, created) = open(None, &c(&p), libc::O_RDWR, true, 0o600).unwrap();
        assert!(created);
        std::os::unix::fs::FileExt::write_all_at(&f, b"x", 0).unwrap();
        let (g, created) = open(None, &c(&p), libc::O_RDONLY, true, 0o600).unwrap();
        assert!(!created);
        let mut b = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&g, &mut b, 0).unwrap();
        assert_eq!(&b, b"x");
        let l = tmp("link");
        let _ = std::fs::remove_file(&l);
        std::os::unix::fs::symlink(&p, &l).unwrap();
        assert!(matches!(open(None, &c(&l), libc::O_RDWR, true, 0o600), Err(OpenError::Symlink)));
        std::fs::remove_file(&p).unwrap();
        assert!(matches!(open(None, &c(&l), libc::O_RDWR, true, 0o600), Err(OpenError::Symlink)), "dangling");
        assert!(!p.exists(), "created through a dangling link");
        let _ = std::fs::remove_file(&l);
    }

    #[test]
    fn without_proc_the_file_is_opened_by_name_and_a_fifo_still_is_not() {
        let p = tmp("noproc");
        let _ = std::fs::remove_file(&p);
        std::fs::write(&p, b"y").unwrap();
        let (f, created) = open_via("/nonexistent-proc/self/fd", None, &c(&p), libc::O_RDWR, true, 0o600).unwrap();
        assert!(!created);
        assert_eq!(f.metadata().unwrap().ino(), std::fs::metadata(&p).unwrap().ino());
        std::fs::remove_file(&p).unwrap();
        let w = BlockedWriter::at(&p);
        assert!(matches!(open_via("/nonexistent-proc/self/fd", None, &c(&p), libc::O_RDWR, true, 0o600), Err(OpenError::NotRegular)));
        assert!(w.still_blocked(), "the FIFO was opened");
    }

    #[test]
    fn a_directory_is_not_a_regular_file() {
        let d = std::env::temp_dir();
        assert!(matches!(open(None, &c(&d), libc::O_RDONLY, false, 0), Err(OpenError::NotRegular)));
    }
}
