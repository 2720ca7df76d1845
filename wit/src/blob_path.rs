//! The path rules of a sink's blob store, the same for the host's stores and
//! the SDK's native runner: relative, `/`-separated, no empty, `.` or `..`
//! segment, no backslash or NUL; and, in a local folder, a symbolic link is
//! followed only where it resolves inside the granted root.

use std::path::{Path, PathBuf};

/// Why a path is refused, as a phrase that follows the path in a message.
pub fn check(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("is empty");
    }
    if path.starts_with('/') {
        return Err("is absolute; paths are relative to the granted root");
    }
    if path.contains('\\') || path.contains('\0') {
        return Err("contains a backslash or NUL");
    }
    for segment in path.split('/') {
        match segment {
            "" => return Err("has an empty segment"),
            "." | ".." => return Err("has a `.` or `..` segment"),
            _ => {}
        }
    }
    Ok(())
}

/// Refuses a path (already accepted by [`check`]) that passes through a
/// symbolic link leading out of the local folder `root`: someone else may
/// plant a link inside a granted folder, and following it would hand the
/// sink files it was never granted. Links that resolve inside the root are
/// followed; so are missing segments (a put creates them). The phrase
/// follows the path in a message, like [`check`]'s.
pub fn check_links(root: &Path, path: &str) -> Result<(), &'static str> {
    // Compare against the root's resolved form: the root itself may be
    // reached through a link (a temporary folder often is).
    let root = canonical_root(root);
    let mut current = root.clone();
    for segment in path.split('/') {
        current.push(segment);
        match std::fs::symlink_metadata(&current) {
            // Does not exist yet: there is no link further down to follow.
            Err(_) => return Ok(()),
            Ok(meta) if meta.file_type().is_symlink() => {
                // A dangling link cannot be resolved, so it is not known to
                // stay inside.
                let inside = current
                    .canonicalize()
                    .is_ok_and(|target| target.starts_with(&root));
                if !inside {
                    return Err("follows a link out of the granted root");
                }
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

fn canonical_root(root: &Path) -> PathBuf {
    root.canonicalize().unwrap_or_else(|_| root.to_path_buf())
}

/// Names the temporary files a durable local put writes before moving them
/// into place; listings never show them.
pub const TEMP_MARKER: &str = ".weir-tmp-";

/// Whether the last segment of `path` is a temporary file of a local put.
pub fn is_temporary(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|name| name.starts_with(TEMP_MARKER))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_escapes() {
        for bad in [
            "",
            "/etc/passwd",
            "a/../b",
            "./a",
            "a//b",
            "a\\b",
            "a\0b",
            "a/",
        ] {
            assert!(check(bad).is_err(), "{bad:?} should be refused");
        }
        for good in ["a", "a/b.parquet", "x/.hidden", "deep/er/path"] {
            assert_eq!(check(good), Ok(()), "{good:?}");
        }
        assert!(is_temporary("a/.weir-tmp-1-2"));
        assert!(!is_temporary("a/b"));
    }

    #[cfg(unix)]
    #[test]
    fn links_are_followed_only_inside_the_root() {
        let base = std::env::temp_dir().join(format!("weir-contract-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("root");
        std::fs::create_dir_all(root.join("real")).unwrap();
        std::fs::write(base.join("secret"), b"x").unwrap();
        std::os::unix::fs::symlink(&base, root.join("out")).unwrap();
        std::os::unix::fs::symlink(base.join("secret"), root.join("file-link")).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("alias")).unwrap();
        std::os::unix::fs::symlink(base.join("gone"), root.join("dangling")).unwrap();

        assert!(check_links(&root, "out/secret").is_err());
        assert!(check_links(&root, "out/new").is_err());
        assert!(check_links(&root, "file-link").is_err());
        assert!(check_links(&root, "dangling").is_err());
        assert_eq!(check_links(&root, "alias/new"), Ok(()));
        assert_eq!(check_links(&root, "real/new/deeper"), Ok(()));
        assert_eq!(check_links(&root, "missing"), Ok(()));
        let _ = std::fs::remove_dir_all(&base);
    }
}
