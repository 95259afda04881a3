//! Reading a file a person names in a configuration (a certificate, a CA, a key, a BMC
//! password) without hanging on something that is not a file.
//!
//! Opening a FIFO for reading waits for a writer, and reading a character device such as
//! `/dev/zero` never ends: pointed at one by mistake, a daemon's start or a `check` would hang
//! with no word. [`read_regular`] opens with `O_NONBLOCK`, which makes the open of a FIFO
//! return at once and changes nothing for a regular file, then asks the open descriptor (not
//! the path, which could be swapped between a look and the open) what it is, and refuses
//! anything but a regular file. A symlink to a regular file is followed as before.
//!
//! This module reads bytes; what they mean (PEM, a password) is the caller's business, and
//! so is naming the setting in the error (the error names the kind of file only).

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use rustix::fs::{Mode, OFlags};

/// Reads the whole of `path`, which must be a regular file (or a symlink to one).
///
/// Anything else (a FIFO, a socket, a device, a directory) fails at once with
/// [`io::ErrorKind::InvalidInput`] and a message saying what it is.
pub fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut file = File::from(fd);
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "a FIFO (named pipe)"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else if kind.is_dir() {
            "a directory"
        } else {
            "not a file"
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("it is {what}, not a regular file: name the file itself"),
        ));
    }
    let mut out = Vec::new();
    file.read_to_end(&mut out)?;
    Ok(out)
}

/// [`read_regular`] as UTF-8 text.
pub fn read_regular_to_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read_regular(path)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "it is not UTF-8 text"))
}

/// The pid holding a `flock` on the file `dev`/`ino`, from the text of `/proc/locks`
/// (`1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF`, the device's major and minor in hex):
/// who holds a lock file, for the refusal of a second coordinator on one database or a second
/// gateway on one state directory, and for the `check`s that take no lock.
pub fn flock_holder(proc_locks: &str, dev: u64, ino: u64) -> Option<u32> {
    let want = format!(
        "{:02x}:{:02x}:{ino}",
        rustix::fs::major(dev),
        rustix::fs::minor(dev)
    );
    proc_locks.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&want.as_str()))
            .then(|| f.get(4)?.parse().ok())
            .flatten()
    })
}

/// [`flock_holder`] on the machine's `/proc/locks`, read again up to three times while the
/// lock is not in it. The kernel writes that file in page-sized pieces, and a lock taken or
/// dropped elsewhere between two pieces shifts the list, so one read can miss a line (SQLite's
/// own POSIX locks come and go with every transaction). `None` when no read shows the lock,
/// or `/proc/locks` cannot be read.
pub fn flock_holder_now(dev: u64, ino: u64) -> Option<u32> {
    (0..3).find_map(|_| {
        let locks = std::fs::read_to_string("/proc/locks").ok()?;
        flock_holder(&locks, dev, ino)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Runs `f` on a thread and fails the test instead of hanging when it does not return.
    fn within_a_second<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(1))
            .expect("the read hung: a FIFO must be refused at once")
    }

    #[test]
    fn a_fifo_is_refused_at_once_saying_what_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("ca.pem");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let e = within_a_second(move || read_regular(&fifo).unwrap_err());
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(
            e.to_string()
                .contains("a FIFO (named pipe), not a regular file"),
            "{e}"
        );
    }

    #[test]
    fn devices_and_directories_are_refused_and_files_and_symlinks_read() {
        let e = within_a_second(|| read_regular(Path::new("/dev/zero")).unwrap_err());
        assert!(e.to_string().contains("a character device"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let e = read_regular(dir.path()).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
        let file = dir.path().join("pw");
        std::fs::write(&file, "secret\n").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_regular_to_string(&link).unwrap(), "secret\n");
        let missing = read_regular(&dir.path().join("nope")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn flock_holders_are_read_from_proc_locks_by_device_and_inode() {
        let locks = "1: POSIX  ADVISORY  WRITE 11 fd:01:99 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 77 08:02:1234 0 EOF\n";
        let dev = rustix::fs::makedev(0xfd, 0x01);
        assert_eq!(flock_holder(locks, dev, 1234), Some(4242));
        assert_eq!(
            flock_holder(locks, dev, 99),
            None,
            "a POSIX lock is not a flock"
        );
        assert_eq!(
            flock_holder(locks, rustix::fs::makedev(8, 2), 1234),
            Some(77)
        );
        assert_eq!(flock_holder(locks, dev, 5), None);
    }
}
