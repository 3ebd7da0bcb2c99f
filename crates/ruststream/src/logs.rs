//! What a service logs when its program set no `tracing` subscriber: `App::cli` and
//! `App::run` (a program's main loop) install one that writes INFO and above, or what
//! `RUST_LOG` says, to standard error. A program that sets its own first keeps it.

use tracing_subscriber::EnvFilter;

/// Installs the default subscriber unless one is set already.
pub(crate) fn init_default() {
    if tracing::dispatcher::has_been_set() {
        return;
    }
    let (filter, refused) = match EnvFilter::try_from_default_env() {
        Ok(filter) => (filter, None),
        Err(e) => (
            EnvFilter::new("info"),
            std::env::var("RUST_LOG").ok().map(|given| (given, e)),
        ),
    };
    let installed = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init()
        .is_ok();
    if installed && let Some((given, error)) = refused {
        tracing::warn!(rust_log = %given, %error, "RUST_LOG not understood; logging at info");
    }
}
