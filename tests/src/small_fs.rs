//! A small real file system for disk-full tests: an ext4 image, loop-mounted
//! (ext4 rather than tmpfs because its partial writes, block allocation and
//! journal are what a broker's data disk does). Needs root; a test that uses
//! it fails, with a message saying so, when not run as root.
//!
//! [`SmallFs`] unmounts and deletes everything on drop, also when the test
//! panics. Drop whatever uses the mount (the broker process) first.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

pub struct SmallFs {
    dir: TempDir,
    mounted: bool,
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl SmallFs {
    /// Creates and mounts an ext4 file system of `megabytes` MiB, with no
    /// blocks reserved for root (the broker runs as root in CI, and the
    /// reserve would let it write past "full").
    pub fn ext4(megabytes: u64) -> SmallFs {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test mounts a small ext4 file system (loop device) and needs root; run it as root (CI does)"
        );
        let dir = tempfile::Builder::new()
            .prefix("samsa-smallfs-")
            .tempdir()
            .expect("create temp dir");
        let image = dir.path().join("fs.img");
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).expect("create mount point");
        let mut fs = SmallFs {
            dir,
            mounted: false,
        };
        run(Command::new("truncate")
            .arg("-s")
            .arg(format!("{megabytes}M"))
            .arg(&image))
        .unwrap();
        run(Command::new("mkfs.ext4")
            .args(["-q", "-m", "0"])
            .arg(&image))
        .unwrap();
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mount))
        .unwrap();
        fs.mounted = true;
        fs
    }

    /// The root of the mounted file system.
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    fn filler_path(&self) -> PathBuf {
        self.path().join("filler")
    }

    /// Bytes available to writers.
    pub fn available(&self) -> u64 {
        let stat = nix::sys::statvfs::statvfs(&self.path()).expect("statvfs");
        stat.blocks_available() * stat.fragment_size()
    }

    /// Writes a filler file until the file system is full, then cuts it by
    /// `leave` bytes so that about that much room is left. Returns the
    /// filler's size.
    pub fn fill(&self, leave: u64) -> u64 {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.filler_path())
            .expect("create filler");
        let chunk = vec![0x5a_u8; 64 * 1024];
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
                Err(e) => panic!("writing the filler: {e}"),
            }
        }
        // What ENOSPC left: partial blocks.
        while let Ok(n) = file.write(&chunk[..4096]) {
            if n == 0 {
                break;
            }
        }
        file.sync_all().expect("fsync filler");
        let len = file.metadata().expect("filler metadata").len();
        let len = len.saturating_sub(leave);
        file.set_len(len).expect("cut filler");
        file.sync_all().expect("fsync filler");
        len
    }

    /// Deletes the filler: the room it took is free again.
    pub fn free(&self) {
        std::fs::remove_file(self.filler_path()).expect("remove filler");
    }

    fn image(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        if !self.mounted {
            return;
        }
        let mount = self.path();
        // A process that just died may hold the mount for a moment.
        let mut unmounted = false;
        for _ in 0..50 {
            if run(Command::new("umount").arg(&mount)).is_ok() {
                unmounted = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if !unmounted {
            eprintln!(
                "small fs at {} is busy; detaching it lazily",
                mount.display()
            );
            let _ = run(Command::new("umount").arg("-l").arg(&mount));
        }
        // `mount -o loop` sets autoclear; detach explicitly if it did not.
        let image = self.image().join("fs.img");
        if let Ok(out) = Command::new("losetup").arg("-j").arg(&image).output() {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some(device) = line.split(':').next() {
                    let _ = run(Command::new("losetup").arg("-d").arg(device));
                }
            }
        }
    }
}
