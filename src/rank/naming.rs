//! The names a process's outputs take: placeholders filled in, the rank carried.
//!
//! - `{rank}`, `{local_rank}`, `{pid}` and `{host}` anywhere in a path are replaced by this
//!   process's rank, local rank, process id and host name (without a launcher, a process is
//!   rank 0 of a world of one, and its local rank is its rank).
//! - With a rank known and no placeholder, the file name carries the rank before its last
//!   extension: `out/highwater-profile.json` → `out/highwater-profile.rank3.json`,
//!   `run.alloc` → `run.rank3.alloc`.
//! - A path that names something other than a regular file (`/dev/null`, `/dev/stdout`, a
//!   FIFO, a symbolic link) is kept as it is, placeholders apart: it is written through, or
//!   names what the user linked it to.
//!
//! Paths are bytes (`OsStr`), so a non-UTF-8 name keeps its bytes.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// What names are made of.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NameContext<'a> {
    /// The rank, when one is known.
    pub(crate) rank: Option<u32>,
    /// The local rank, when known.
    pub(crate) local_rank: Option<u32>,
    /// This process's id.
    pub(crate) pid: u32,
    /// This host's name.
    pub(crate) host: &'a str,
}

/// The placeholders a path may hold.
const PLACEHOLDERS: [&str; 4] = ["{rank}", "{local_rank}", "{pid}", "{host}"];

/// The name `path` takes for this process, as the [module docs](self) say.
///
/// # Errors
///
/// A sentence naming the placeholder when the path holds `{word}` that is not one of
/// `{rank}`, `{local_rank}`, `{pid}`, `{host}` (a misspelt placeholder would otherwise leave
/// every rank writing the same file).
pub(crate) fn name_output(path: &Path, context: &NameContext<'_>) -> Result<PathBuf, String> {
    let bytes = path.as_os_str().as_bytes();
    let (expanded, any) = expand(bytes, context)?;
    let expanded = PathBuf::from(OsString::from_vec(expanded));
    if any || context.rank.is_none() || !is_regular_or_absent(&expanded) {
        return Ok(expanded);
    }
    Ok(with_tag(
        &expanded,
        &format!("rank{}", context.rank.unwrap_or(0)),
    ))
}

/// `path` with `.tag` inserted before its file name's last extension (`p.json` → `p.TAG.json`,
/// `p` → `p.TAG`, `.p` → `.p.TAG`).
pub(crate) fn with_tag(path: &Path, tag: &str) -> PathBuf {
    let Some(name) = path.file_name() else {
        return path.to_path_buf();
    };
    let name = name.as_bytes();
    let dot = name.iter().rposition(|&b| b == b'.').filter(|&at| at > 0);
    let mut tagged = Vec::with_capacity(name.len() + tag.len() + 1);
    match dot {
        Some(at) => {
            tagged.extend_from_slice(&name[..at]);
            tagged.push(b'.');
            tagged.extend_from_slice(tag.as_bytes());
            tagged.extend_from_slice(&name[at..]);
        }
        None => {
            tagged.extend_from_slice(name);
            tagged.push(b'.');
            tagged.extend_from_slice(tag.as_bytes());
        }
    }
    path.with_file_name(OsString::from_vec(tagged))
}

/// Whether `path` is a regular file or names nothing yet (a link is neither: `/dev/stdout`
/// leads to whatever standard output is, a regular file when it is redirected to one).
fn is_regular_or_absent(path: &Path) -> bool {
    std::fs::symlink_metadata(path).map_or(true, |meta| meta.is_file())
}

/// `bytes` with the placeholders replaced, and whether there were any.
fn expand(bytes: &[u8], context: &NameContext<'_>) -> Result<(Vec<u8>, bool), String> {
    let rank = context.rank.unwrap_or(0);
    let values = [
        rank.to_string(),
        context.local_rank.unwrap_or(rank).to_string(),
        context.pid.to_string(),
        // A host name never holds `/`; if one did, it must not make a directory.
        context.host.replace('/', "_"),
    ];
    let mut out = Vec::with_capacity(bytes.len());
    let mut any = false;
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'{' {
            if let Some(k) = PLACEHOLDERS
                .iter()
                .position(|p| bytes[at..].starts_with(p.as_bytes()))
            {
                out.extend_from_slice(values[k].as_bytes());
                at += PLACEHOLDERS[k].len();
                any = true;
                continue;
            }
            let word = bytes[at + 1..]
                .iter()
                .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
                .count();
            if word > 0 && bytes.get(at + 1 + word) == Some(&b'}') {
                return Err(format!(
                    "unknown placeholder {} in {}; the placeholders are {}",
                    String::from_utf8_lossy(&bytes[at..at + word + 2]),
                    String::from_utf8_lossy(bytes),
                    PLACEHOLDERS.join(", ")
                ));
            }
        }
        out.push(bytes[at]);
        at += 1;
    }
    Ok((out, any))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANK3: NameContext<'static> = NameContext {
        rank: Some(3),
        local_rank: Some(1),
        pid: 4242,
        host: "node7",
    };
    const ALONE: NameContext<'static> = NameContext {
        rank: None,
        local_rank: None,
        pid: 99,
        host: "box",
    };

    fn name(path: &str, context: &NameContext<'_>) -> String {
        name_output(Path::new(path), context)
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_known_rank_goes_into_the_name_before_the_extension() {
        assert_eq!(
            name("highwater-profile.json", &RANK3),
            "highwater-profile.rank3.json"
        );
        assert_eq!(name("out/run.v2.json", &RANK3), "out/run.v2.rank3.json");
        assert_eq!(name("run.alloc", &RANK3), "run.rank3.alloc");
        assert_eq!(name("out.d/profile", &RANK3), "out.d/profile.rank3");
        assert_eq!(name(".hidden", &RANK3), ".hidden.rank3");
    }

    #[test]
    fn without_a_rank_names_are_kept() {
        assert_eq!(
            name("highwater-profile.json", &ALONE),
            "highwater-profile.json"
        );
    }

    #[test]
    fn placeholders_are_filled_in_and_then_the_name_is_the_users() {
        assert_eq!(
            name("runs/{host}/p.{rank}-of-{local_rank}.{pid}.json", &RANK3),
            "runs/node7/p.3-of-1.4242.json"
        );
        // Alone: rank 0 of a world of one.
        assert_eq!(name("p.{rank}.{local_rank}.json", &ALONE), "p.0.0.json");
        assert_eq!(name("p.{pid}.json", &ALONE), "p.99.json");
        // Not a placeholder: braces that are not `{word}` stay.
        assert_eq!(name("a{b.json", &ALONE), "a{b.json");
        assert_eq!(name("a{}.json", &ALONE), "a{}.json");
    }

    #[test]
    fn an_unknown_placeholder_is_refused_naming_it() {
        let error = name_output(Path::new("p.{ranks}.json"), &RANK3).unwrap_err();
        assert!(
            error.contains("{ranks}") && error.contains("{rank}"),
            "{error}"
        );
    }

    #[test]
    fn special_files_and_links_keep_their_names() {
        assert_eq!(name("/dev/null", &RANK3), "/dev/null");
        // Whatever standard output is (a regular file when redirected, as under `cargo test`).
        assert_eq!(name("/dev/stdout", &RANK3), "/dev/stdout");
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("run.json");
        std::fs::write(&target, "{}").unwrap();
        let link = dir.path().join("latest.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(name_output(&link, &RANK3).unwrap(), link);
        assert_eq!(
            name_output(&target, &RANK3).unwrap(),
            dir.path().join("run.rank3.json")
        );
    }

    #[test]
    fn non_utf8_names_keep_their_bytes() {
        let path = PathBuf::from(OsString::from_vec(b"p-\xff.json".to_vec()));
        let named = name_output(&path, &RANK3).unwrap();
        assert_eq!(named.as_os_str().as_bytes(), b"p-\xff.rank3.json");
    }
}
