//! Every link in the README, the other top-level pages, the guide (`docs/`), the crates'
//! docs and the examples points at something inside the repository that exists: a user
//! reading any of them never lands outside it (a path like `../shared/SPEC.md` that only
//! the authors' machines have). Web links (`https://...`) and rustdoc's links to items
//! (`crate::Foo`) are not files and are left alone.

use std::path::{Component, Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

/// The files whose links are checked.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["README.md", "BENCHMARKS.md", "RELIABILITY.md"]
        .iter()
        .map(|f| root.join(f))
        .collect();
    walk(&root.join("docs"), "md", &mut files);
    // The crates' docs: their sources (tests hold no user-facing docs).
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|e| e.expect("entry").path())
        .collect();
    crates.sort();
    for krate in crates {
        walk(&krate.join("src"), "rs", &mut files);
    }
    walk(&root.join("examples"), "rs", &mut files);
    files
}

fn walk(dir: &Path, extension: &str, into: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.map(|e| e.expect("entry").path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            if !path.ends_with("target") {
                walk(&path, extension, into);
            }
        } else if path.extension().is_some_and(|e| e == extension) {
            into.push(path);
        }
    }
}

/// The targets of the Markdown links `[text](target)` on `line`.
fn link_targets(line: &str) -> Vec<&str> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else {
            break;
        };
        targets.push(after[..end].trim());
        rest = &after[end..];
    }
    targets
}

/// Whether `target` names a file (rather than a web page, an anchor or a rustdoc item).
fn is_file_link(target: &str) -> bool {
    !(target.is_empty()
        || target.starts_with('#')
        || target.contains("://")
        || target.starts_with("mailto:")
        || target.contains("::")
        || !(target.contains('/') || target.contains('.')))
}

/// `path` with `.` and `..` resolved, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// What is wrong with `target`, linked from `file`, if anything.
fn problem(root: &Path, file: &Path, target: &str) -> Option<String> {
    let target = target.split('#').next().unwrap_or(target);
    let target = target.split_whitespace().next().unwrap_or(target); // `path "title"`
    let resolved = normalize(&file.parent().expect("a directory").join(target));
    if !resolved.starts_with(root) {
        return Some("points outside the repository".into());
    }
    if resolved.exists() {
        return None;
    }
    // Diagrams are rendered at build time from the `.dot` source beside them.
    if resolved.extension().is_some_and(|e| e == "svg") && resolved.with_extension("dot").exists() {
        return None;
    }
    Some("no such file".into())
}

#[test]
fn every_link_stays_inside_the_repository_and_resolves() {
    let root = root();
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in pages(&root) {
        let text = std::fs::read_to_string(&file).expect("readable");
        let shown = file
            .strip_prefix(&root)
            .expect("inside")
            .display()
            .to_string();
        for (number, line) in text.lines().enumerate() {
            if line.contains("../shared") {
                broken.push(format!(
                    "{shown}:{}: mentions ../shared, outside the repository",
                    number + 1
                ));
            }
            for target in link_targets(line) {
                if !is_file_link(target) {
                    continue;
                }
                checked += 1;
                if let Some(problem) = problem(&root, &file, target) {
                    broken.push(format!("{shown}:{}: `{target}` {problem}", number + 1));
                }
            }
        }
    }
    assert!(
        checked > 10,
        "only {checked} file links found: is the scan reading the pages?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn links_are_told_apart() {
    assert_eq!(
        link_targets("see [spec](docs/spec.md) and [x](#a)"),
        ["docs/spec.md", "#a"]
    );
    assert!(is_file_link("docs/spec.md"));
    assert!(is_file_link("../shared/SPEC.md"));
    assert!(!is_file_link("https://docs.rs/tokio"));
    assert!(!is_file_link("crate::Kafka::with_security"));
    assert!(!is_file_link("Self"));
    let root = root();
    let readme = root.join("README.md");
    assert!(problem(&root, &readme, "../shared/SPEC.md").is_some());
    assert!(problem(&root, &readme, "docs/spec.md").is_none());
}
