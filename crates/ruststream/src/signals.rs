//! SIGINT and SIGTERM, listened to from the moment a [`Signals`] is made. Until a process
//! listens, either signal ends it at once, without a drain: [`App::run`](crate::App::run)
//! listens before it starts anything, so a signal that comes while the app starts, or
//! just after, still drains and settles (SPEC E3).

#[cfg(unix)]
use tokio::signal::unix::{Signal, SignalKind, signal};

pub(crate) struct Signals {
    #[cfg(unix)]
    term: Option<Signal>,
    #[cfg(unix)]
    int: Option<Signal>,
}

impl Signals {
    /// Starts listening (within the async runtime).
    pub(crate) fn listen() -> Self {
        #[cfg(unix)]
        {
            let listen = |kind: SignalKind, name: &str| match signal(kind) {
                Ok(signal) => Some(signal),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for {name}; it ends the process without a drain");
                    None
                }
            };
            Self {
                term: listen(SignalKind::terminate(), "SIGTERM"),
                int: listen(SignalKind::interrupt(), "SIGINT"),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// The next SIGINT or SIGTERM (one that came since the listening began counts).
    pub(crate) async fn recv(&mut self) {
        #[cfg(unix)]
        {
            async fn next(signal: &mut Option<Signal>) {
                let received = match signal {
                    Some(signal) => signal.recv().await,
                    None => None,
                };
                if received.is_none() {
                    // Not listened to, or no more to come.
                    std::future::pending::<()>().await;
                }
            }
            tokio::select! {
                () = next(&mut self.term) => {}
                () = next(&mut self.int) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
