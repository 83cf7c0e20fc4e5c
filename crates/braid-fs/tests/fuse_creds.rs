//! Permissions through a FUSE mount: a non-root user meets the same refusals (EACCES,
//! EPERM), sticky and set-group-id rules and group permissions on a braid mount as in a
//! local directory of the same machine, with the client kernel's checks and without them
//! (the server's alone), and a permission the client's kernel still has cached does not let
//! a request through.

mod common;

use std::fs;
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::Loopback;

/// The acting user, a user the tree belongs to partly, and a group of the acting user.
const USER: u32 = 65533;
const OTHER: u32 = 65532;
const GROUP: u32 = 65531;

fn mode(p: &Path, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
}

fn file(p: &Path, m: u32, uid: u32, gid: u32) {
    fs::write(p, b"data\n").unwrap();
    chown(p, Some(uid), Some(gid)).unwrap();
    mode(p, m);
}

fn dir(p: &Path, m: u32, uid: u32, gid: u32) {
    fs::create_dir(p).unwrap();
    chown(p, Some(uid), Some(gid)).unwrap();
    mode(p, m);
}

/// The tree the user acts in, made by root under `base`.
fn populate(base: &Path) {
    mode(base, 0o755);
    file(&base.join("private"), 0o600, 0, 0);
    file(&base.join("public"), 0o644, 0, 0);
    file(&base.join("world"), 0o666, 0, 0);
    file(&base.join("grp"), 0o640, 0, GROUP);
    file(&base.join("grp_no"), 0o640, 0, OTHER);
    file(&base.join("others"), 0o644, OTHER, OTHER);
    dir(&base.join("sticky"), 0o1777, 0, 0);
    file(&base.join("sticky/others"), 0o666, OTHER, OTHER);
    dir(&base.join("sgid"), 0o2777, 0, GROUP);
    dir(&base.join("closed"), 0o700, OTHER, OTHER);
    file(&base.join("closed/f"), 0o644, OTHER, OTHER);
    dir(&base.join("home"), 0o755, USER, USER);
}

/// Each line: a name, the exit status, and the error (what follows the last ": ").
const SCRIPT: &str = r#"
cd "$1" || exit 99
t() { name=$1; shift; err=$("$@" 2>&1 >/dev/null); echo "$name $? ${err##*: }"; }
s() { echo "$1 $(stat -c '%u %g %a %F' "$1" 2>&1)"; }
t read_private cat private
t read_public cat public
t write_public sh -c 'echo x >> public'
t read_group cat grp
t read_group_no cat grp_no
t chmod_others chmod 777 world
t chown_others chown 65533 world
t utime_others touch -d @1 world
t utime_now_writable touch world
t truncate_public truncate -s 0 public
t truncate_world truncate -s 1 world
t make_in_root touch new
t mkdir_in_root mkdir newdir
t make_mine touch home/mine
t write_read_mine sh -c 'echo hello > home/data && cat home/data && test "$(cat home/data)" = hello'
s home/data
t chmod_mine chmod 4755 home/mine
s home/mine
t chown_mine_away chown 65532 home/mine
t chgrp_mine chgrp 65531 home/mine
t chgrp_mine_no chgrp 65532 home/mine
s home/mine
t unlink_sticky_others rm -f sticky/others
t rename_sticky_others mv sticky/others sticky/x
t make_sticky touch sticky/mine
t replace_sticky_others mv sticky/mine sticky/others
t unlink_sticky_mine rm sticky/mine
t fifo_sticky mkfifo sticky/fifo
s sticky/fifo
t symlink_sticky ln -s target sticky/sl
t link_others ln others home/linked
t lookup_closed stat closed/f
t list_closed ls closed
t mkdir_sgid mkdir sgid/sub
s sgid/sub
t make_sgid touch sgid/f
s sgid/f
t rmdir_others_dir rmdir closed
"#;

/// Runs the script as USER (with GROUP) in `base`; its output.
fn act(base: &Path) -> String {
    let out = Command::new("setpriv")
        .args(["--reuid", &USER.to_string(), "--regid", &USER.to_string()])
        .args(["--groups", &GROUP.to_string(), "sh", "-c", SCRIPT, "sh"])
        .arg(base)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn setpriv_missing() -> bool {
    let missing = Command::new("setpriv").arg("--version").output().is_err();
    if missing {
        eprintln!("SKIPPED: setpriv (util-linux) is missing");
    }
    missing
}

#[test]
fn a_non_root_user_meets_the_same_refusals_as_on_a_local_directory() {
    require_fuse!();
    if setpriv_missing() {
        return;
    }
    let local = tempfile::tempdir().unwrap();
    populate(local.path());
    let expected = act(local.path());
    // Not a script that failed the same way everywhere: the refusals are there.
    for line in [
        "read_private 1 Permission denied",
        "read_group 0 ",
        "write_read_mine 0 ",
        "home/data 65533 65533 644 regular file",
        "read_group_no 1 Permission denied",
        "chmod_others 1 Operation not permitted",
        "unlink_sticky_others 1 Operation not permitted",
        "sgid/sub 65533 65531 2755 directory",
    ] {
        assert!(expected.contains(line), "{line:?} not in\n{expected}");
    }

    // With the client kernel's checks, and with the server's alone.
    for kernel_checks in [true, false] {
        // Set-user-id bits as on ext4 (the export's default is nosuid).
        let lb = Loopback::with_config(1, |c| c.policy.allow_setuid = true);
        mode(lb.dir.path(), 0o755);
        let m = lb.mount("mnt", |c| {
            c.allow_other = true;
            c.default_permissions = kernel_checks;
        });
        if kernel_checks {
            populate(m.mountpoint());
        } else {
            // Made behind the client's back: a name the client's kernel has cached is
            // walked without the search permission check when the kernel does not check
            // (as an NFS file handle is used without one); the server checks lookups.
            populate(&lb.export());
        }
        let got = act(m.mountpoint());
        assert_eq!(
            got, expected,
            "braid mount (left, default_permissions {kernel_checks}) and local directory (right)"
        );
    }
}

/// With the client kernel's cached attributes still saying 0644, a read by another user is
/// let through by the kernel's check (default_permissions) and refused by the server.
#[test]
fn the_server_refuses_what_a_stale_client_cache_allows() {
    require_fuse!();
    if setpriv_missing() {
        return;
    }
    let lb = Loopback::new(1);
    mode(lb.dir.path(), 0o755);
    let m = lb.mount("mnt", |c| {
        c.allow_other = true;
        c.attr_timeout = Duration::from_secs(60);
        c.entry_timeout = Duration::from_secs(60);
    });
    let root = m.mountpoint();
    mode(root, 0o755);
    file(&root.join("f"), 0o644, 0, 0);
    let cat = || {
        Command::new("setpriv")
            .args(["--reuid", &USER.to_string(), "--regid", &USER.to_string()])
            .args(["--clear-groups", "cat"])
            .arg(root.join("f"))
            .output()
            .unwrap()
    };
    let first = cat();
    assert!(first.status.success(), "{first:?}");
    // Behind the client's back.
    mode(&lb.export().join("f"), 0o600);
    let second = cat();
    assert!(
        !second.status.success(),
        "read through a stale 0644: {second:?}"
    );
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("Permission denied"),
        "{second:?}"
    );
}
