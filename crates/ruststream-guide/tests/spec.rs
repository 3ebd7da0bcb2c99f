//! `docs/spec.md` lists, under each statement, the tests that check it: every function
//! in the workspace whose name starts with the statement's id in lower case (`fn k3_...`).
//! The lists are generated; this test fails when they are stale, and rewrites them with
//! `RUSTSTREAM_BLESS=1`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `dir`, sorted, skipping build output.
fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

/// Statement id (upper case) → (test name, file relative to the root), in file order.
fn tests_by_statement() -> BTreeMap<String, Vec<(String, String)>> {
    let root = root();
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    let mut found: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("source");
        let relative = file
            .strip_prefix(&root)
            .expect("inside the root")
            .to_string_lossy()
            .replace('\\', "/");
        for line in text.lines() {
            let Some(name) = function_name(line) else {
                continue;
            };
            for id in statements_of(name) {
                let list = found.entry(id).or_default();
                if !list.iter().any(|(n, _)| n == name) {
                    list.push((name.to_owned(), relative.clone()));
                }
            }
        }
    }
    found
}

/// The name declared by a `fn` on this line, if any.
fn function_name(line: &str) -> Option<&str> {
    let at = line.find("fn ")?;
    let before = line[..at].trim();
    let qualifiers = [
        "",
        "pub",
        "async",
        "pub async",
        "pub(crate)",
        "pub(crate) async",
    ];
    if !qualifiers.contains(&before) {
        return None;
    }
    let rest = &line[at + 3..];
    let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
    Some(&rest[..end])
}

/// `k3_stored_position` → `[K3]`, `p2_p6_refusals` → `[P2, P6]`: the ids the name starts
/// with, each a letter of the spec, digits, then an underscore.
fn statements_of(name: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut rest = name;
    loop {
        let mut chars = rest.chars();
        let Some(letter) = chars.next().filter(|c| "knpegdrs".contains(*c)) else {
            break;
        };
        let digits: String = chars.take_while(char::is_ascii_digit).collect();
        let after = &rest[1 + digits.len()..];
        if digits.is_empty() || !after.starts_with('_') {
            break;
        }
        ids.push(format!("{}{digits}", letter.to_ascii_uppercase()));
        rest = &after[1..];
    }
    ids
}

/// Whether the test in `file` runs against a real broker process: a transport's own
/// tests, the fault tests, and the conformance scenarios (which every transport's suite
/// runs against its broker). Everything else runs on the memory broker or is a unit test.
fn on_a_real_broker(file: &str) -> bool {
    let transport_tests = ["nats", "kafka", "pulsar", "rabbitmq", "redis", "faults"]
        .iter()
        .any(|t| file.starts_with(&format!("crates/ruststream-{t}/tests/")));
    transport_tests || file.starts_with("crates/ruststream/src/conformance/")
}

/// The text between `<!-- tests ID -->` and `<!-- end -->`: the tests against a real
/// broker first, then those on the memory broker or in unit tests.
fn listing(tests: Option<&Vec<(String, String)>>) -> String {
    let Some(tests) = tests else {
        return "*Tested by:* nothing named after it yet.\n".to_owned();
    };
    let items = |real: bool| -> Vec<String> {
        tests
            .iter()
            .filter(|(_, file)| on_a_real_broker(file) == real)
            .map(|(name, file)| format!("`{name}` (`{file}`)"))
            .collect()
    };
    let (real, other) = (items(true), items(false));
    let mut parts = Vec::new();
    if !real.is_empty() {
        parts.push(format!("against a real broker: {}", real.join(", ")));
    }
    if !other.is_empty() {
        parts.push(format!(
            "on the memory broker or in unit tests: {}",
            other.join(", ")
        ));
    }
    let mut text = format!("*Tested by:* {}.\n", parts.join("; "));
    if real.is_empty() {
        text.push_str("*No test of it runs against a real broker yet.*\n");
    }
    text
}

/// `spec` with every listing regenerated, and the ids it has markers for.
fn regenerate(
    spec: &str,
    tests: &BTreeMap<String, Vec<(String, String)>>,
) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut ids = Vec::new();
    let mut skipping = false;
    for line in spec.lines() {
        if skipping {
            if line == "<!-- end -->" {
                out.push_str(line);
                out.push('\n');
                skipping = false;
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
        if let Some(id) = line
            .strip_prefix("<!-- tests ")
            .and_then(|l| l.strip_suffix(" -->"))
        {
            out.push_str(&listing(tests.get(id)));
            ids.push(id.to_owned());
            skipping = true;
        }
    }
    (out, ids)
}

#[test]
fn spec_lists_the_tests_of_every_statement() {
    let path = root().join("docs/spec.md");
    let spec = std::fs::read_to_string(&path).expect("docs/spec.md");
    let tests = tests_by_statement();
    let (fresh, ids) = regenerate(&spec, &tests);
    let unknown: Vec<&String> = tests.keys().filter(|id| !ids.contains(id)).collect();
    assert!(
        unknown.is_empty(),
        "tests are named after statements docs/spec.md does not have: {unknown:?}"
    );
    if fresh != spec {
        if std::env::var_os("RUSTSTREAM_BLESS").is_some() {
            std::fs::write(&path, fresh).expect("rewriting docs/spec.md");
        } else {
            panic!(
                "docs/spec.md's test lists are stale: run `RUSTSTREAM_BLESS=1 cargo test -p ruststream-guide --test spec` and commit the result"
            );
        }
    }
}

#[test]
fn a_statement_id_is_read_from_a_test_name() {
    assert_eq!(statements_of("k3_stored_position"), ["K3"]);
    assert_eq!(statements_of("g10_x"), ["G10"]);
    assert_eq!(statements_of("p2_p6_every_refusal"), ["P2", "P6"]);
    assert!(statements_of("kafka_x").is_empty());
    assert!(statements_of("n6").is_empty());
    assert_eq!(
        function_name("    async fn n1_drop_terminates() {"),
        Some("n1_drop_terminates")
    );
    assert_eq!(function_name("    let f = fn_x;"), None);
}
