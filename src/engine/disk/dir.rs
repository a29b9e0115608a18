//! The cache directory's safety: private to the user, never one another user could plant
//! states in.

use std::path::Path;

/// Creates `dir` (and its parents) if missing, readable by the user alone (its files hold
/// conversations' tokens), and refuses a directory another user could have planted states
/// in: one owned by another user, or writable by its group or others.
///
/// # Errors
/// It cannot be created or read, or it is not private (the message names it and the fix).
pub(super) fn private_dir(dir: &Path) -> std::io::Result<()> {
    if !dir.is_dir() {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(dir)?;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let metadata = std::fs::metadata(dir)?;
        let user = rustix::process::geteuid().as_raw();
        if let Some(problem) = ownership_problem(metadata.uid(), metadata.mode(), user) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("{} {problem}", dir.display()),
            ));
        }
    }
    Ok(())
}

/// What makes a directory owned by `owner` with `mode` unsafe for `user`'s cache files, with
/// the fix; `None` when it is the user's and only the user's to write.
fn ownership_problem(owner: u32, mode: u32, user: u32) -> Option<String> {
    if owner != user {
        return Some(format!(
            "belongs to user {owner}, not to this process's user {user}: another user could plant states \
             there; use a directory of your own (--cache-dir)"
        ));
    }
    if mode & 0o022 != 0 {
        return Some(format!(
            "is writable by other users (mode {:o}): they could plant states there; run `chmod go-w` on it \
             (or `chmod 700`)",
            mode & 0o7777
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{ownership_problem, private_dir};

    #[test]
    fn only_a_directory_of_the_user_s_own_that_others_cannot_write_is_used() {
        assert_eq!(ownership_problem(1000, 0o40700, 1000), None);
        assert_eq!(ownership_problem(1000, 0o40755, 1000), None, "others may read, not write");
        let other_owner = ownership_problem(0, 0o40700, 1000).expect("refused");
        assert!(other_owner.contains("belongs to user 0") && other_owner.contains("--cache-dir"), "{other_owner}");
        let group = ownership_problem(1000, 0o40770, 1000).expect("refused");
        assert!(group.contains("mode 770") && group.contains("chmod"), "{group}");
        assert!(ownership_problem(1000, 0o41777, 1000).is_some(), "sticky or not, others can plant files");
    }

    #[cfg(unix)]
    #[test]
    fn a_directory_others_can_write_to_is_refused_by_name() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("firstword-private-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        private_dir(&dir.join("created")).expect("created for the user alone");
        let mode = std::fs::metadata(dir.join("created")).expect("metadata").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let refused = private_dir(&dir).expect_err("writable by others");
        assert!(refused.to_string().starts_with(&dir.display().to_string()), "{refused}");
        assert_eq!(refused.kind(), std::io::ErrorKind::PermissionDenied);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        private_dir(&dir).expect("the fix");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
