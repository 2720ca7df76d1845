//! Walking a local blob root ourselves rather than through `object_store`:
//! its local lister follows every link, so a link planted to lead out of
//! the root shows foreign names, and a link back to an ancestor fails the
//! whole listing ("File system loop found"). Here a link is followed only
//! where it resolves inside the root and not onto a folder the walk is
//! already inside, and the walk stops at a budget of entries.

use std::path::{Path, PathBuf};

use weir_contract::blob_path;

/// An object found by `list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// Relative to the root.
    pub path: String,
    /// In bytes.
    pub size: u64,
}

/// Why a walk stopped early.
#[derive(Debug)]
pub enum WalkError {
    /// More entries (files and folders) than the budget.
    TooMany,
    /// The file system failed.
    Io(std::io::Error),
}

/// Every file under `root/folder` whose path (relative to `root`, `/`
/// separated) starts with `prefix`, following links that stay inside the
/// canonical `root`; at most `budget` files and folders are visited.
pub fn list(
    root: &Path,
    folder: &str,
    prefix: &str,
    budget: usize,
) -> Result<Vec<ObjectMeta>, WalkError> {
    let start = if folder.is_empty() {
        root.to_path_buf()
    } else {
        root.join(folder)
    };
    let canonical = match start.canonicalize() {
        Ok(path) => path,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(WalkError::Io(e)),
    };
    let mut walk = Walk {
        root,
        prefix,
        budget,
        found: Vec::new(),
        inside: vec![canonical],
    };
    walk.folder(&start, folder)?;
    Ok(walk.found)
}

/// The bytes of every file physically under `root`, links not followed:
/// what the root holds, for the sink's quota.
///
/// Others may write under the root while it is counted: the other hosts
/// of a cluster share a tenant's root, and a commit writes a temporary
/// file, links it into place and removes it. A file or folder gone between
/// the listing and the look at it counts nothing, rather than failing the
/// count (and with it a host's start or a sink's first write).
pub fn stored_bytes(root: &Path) -> std::io::Result<u64> {
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let mut total = 0u64;
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let entries = match std::fs::read_dir(&folder) {
            Ok(entries) => entries,
            Err(e) if gone(&e) && folder != root => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let meta = match entry.metadata() {
                Ok(meta) => meta,
                Err(e) if gone(&e) => continue,
                Err(e) => return Err(e),
            };
            if meta.is_dir() {
                folders.push(entry.path());
            } else if meta.is_file() {
                total = total.saturating_add(meta.len());
            }
        }
    }
    Ok(total)
}

struct Walk<'a> {
    root: &'a Path,
    prefix: &'a str,
    budget: usize,
    found: Vec<ObjectMeta>,
    /// The canonical folders the walk is inside, outermost first: a link
    /// onto one of them (or an ancestor) would loop.
    inside: Vec<PathBuf>,
}

impl Walk<'_> {
    fn folder(&mut self, folder: &Path, logical: &str) -> Result<(), WalkError> {
        let entries = match std::fs::read_dir(folder) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(WalkError::Io(e)),
        };
        for entry in entries {
            let entry = entry.map_err(WalkError::Io)?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let path = match logical {
                "" => name,
                _ => format!("{logical}/{name}"),
            };
            if blob_path::check(&path).is_err() || blob_path::is_temporary(&path) {
                continue;
            }
            self.budget = self.budget.checked_sub(1).ok_or(WalkError::TooMany)?;
            let kind = entry.file_type().map_err(WalkError::Io)?;
            if kind.is_symlink() {
                self.link(&entry.path(), path)?;
            } else if kind.is_dir() {
                if self.may_enter(&path) {
                    let canonical = entry.path().canonicalize().map_err(WalkError::Io)?;
                    self.enter(&entry.path(), &path, canonical)?;
                }
            } else if kind.is_file() && path.starts_with(self.prefix) {
                // Removed since the listing (by another writer of the
                // root): not there any more, so not listed.
                let size = match entry.metadata() {
                    Ok(meta) => meta.len(),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(WalkError::Io(e)),
                };
                self.found.push(ObjectMeta { path, size });
            }
        }
        Ok(())
    }

    /// Follows a link only where it resolves inside the root and not onto
    /// a folder the walk is already inside; a dangling link is left out.
    fn link(&mut self, at: &Path, path: String) -> Result<(), WalkError> {
        let Ok(target) = at.canonicalize() else {
            return Ok(());
        };
        if !target.starts_with(self.root) {
            return Ok(());
        }
        let Ok(meta) = std::fs::metadata(&target) else {
            return Ok(());
        };
        if meta.is_dir() {
            let loops = self.inside.iter().any(|open| open.starts_with(&target));
            if !loops && self.may_enter(&path) {
                self.enter(at, &path, target)?;
            }
        } else if meta.is_file() && path.starts_with(self.prefix) {
            self.found.push(ObjectMeta {
                path,
                size: meta.len(),
            });
        }
        Ok(())
    }

    fn enter(&mut self, at: &Path, path: &str, canonical: PathBuf) -> Result<(), WalkError> {
        self.inside.push(canonical);
        let walked = self.folder(at, path);
        self.inside.pop();
        walked
    }

    /// Whether anything under folder `path` can match the prefix.
    fn may_enter(&self, path: &str) -> bool {
        let folder = format!("{path}/");
        folder.starts_with(self.prefix) || self.prefix.starts_with(&folder)
    }
}
