//! Validating AsyncAPI documents with the AsyncAPI project's own parser
//! (`scripts/asyncapi/validate.cjs` over `@asyncapi/parser`, installed by the test
//! command, which exports `RUSTSTREAM_ASYNCAPI_NODE_PATH`).

use std::path::PathBuf;
use std::process::Command;

/// What the parser says of `document` (written to a file ending in `.{extension}`):
/// every diagnostic line, and whether it has an error or a warning. Panics when the
/// parser is not installed: run the tests through `scripts/test`.
pub fn validate(document: &str, extension: &str) -> Validated {
    let node_path = std::env::var("RUSTSTREAM_ASYNCAPI_NODE_PATH").expect(
        "RUSTSTREAM_ASYNCAPI_NODE_PATH is not set: the AsyncAPI parser is installed by \
         scripts/test (scripts/asyncapi/install.sh); run the tests through it",
    );
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let file = std::env::temp_dir().join(format!(
        "ruststream-asyncapi-{}-{}.{extension}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::write(&file, document).expect("write the document");
    let output = Command::new("node")
        .arg(root.join("scripts/asyncapi/validate.cjs"))
        .arg(&file)
        .env("NODE_PATH", node_path)
        .output()
        .expect("run node");
    let _ = std::fs::remove_file(&file);
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.code().is_some_and(|c| c < 2),
        "the validator failed to run: {}{}",
        text,
        String::from_utf8_lossy(&output.stderr)
    );
    Validated {
        clean: output.status.success(),
        report: text,
    }
}

static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The parser's verdict on one document.
#[derive(Debug)]
pub struct Validated {
    /// Parsed with no error and no warning.
    pub clean: bool,
    /// Every diagnostic, one per line.
    pub report: String,
}
