//! Catching a handler's panic so it becomes a failed attempt (SPEC E2), and keeping its
//! report for the runtime's log: the backtrace is logged once per message (SPEC G2), not
//! printed by the panic hook on every attempt.

use std::any::Any;
use std::backtrace::{Backtrace, BacktraceStatus};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Once;
use std::task::{Context, Poll};

thread_local! {
    /// True while this thread runs handler code (the runtime catches its panics).
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
    /// What the hook saw of the last handler panic on this thread.
    static LAST: RefCell<Option<Box<Report>>> = const { RefCell::new(None) };
}

/// Where a handler panicked, and the backtrace when `RUST_BACKTRACE` asks for one.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) location: String,
    pub(crate) backtrace: Option<Backtrace>,
}

/// A caught panic.
#[derive(Debug)]
pub(crate) struct Caught {
    pub(crate) message: String,
    /// Boxed: it travels with every completion, and is there only after a panic.
    pub(crate) report: Option<Box<Report>>,
}

/// Installs, once per process, a panic hook that keeps quiet about panics inside
/// handlers (the runtime logs them) and hands every other panic to the hook that was
/// there before.
pub(crate) fn quiet_handler_panics() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_HANDLER.with(Cell::get) {
                let backtrace = Backtrace::capture();
                let report = Report {
                    location: info
                        .location()
                        .map_or_else(|| "unknown".to_owned(), ToString::to_string),
                    backtrace: (backtrace.status() == BacktraceStatus::Captured)
                        .then_some(backtrace),
                };
                LAST.with(|last| *last.borrow_mut() = Some(Box::new(report)));
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs `f` as handler code: a panic in it is caught and reported.
fn in_handler<T>(f: impl FnOnce() -> T) -> Result<T, Caught> {
    let outer = IN_HANDLER.with(|flag| flag.replace(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    IN_HANDLER.with(|flag| flag.set(outer));
    result.map_err(|payload| Caught {
        message: panic_message(payload.as_ref()),
        report: LAST.with(|last| last.borrow_mut().take()),
    })
}

/// Polls `F` (pinned by the caller) as handler code, turning a panic during a poll into
/// `Err`. `F` itself is polled, not a `Pin` of it: one forwarding call less between the
/// catch and the handler, which the compiler then inlines more readily.
pub(crate) struct CatchUnwind<'f, F>(pub(crate) Pin<&'f mut F>);

impl<F: Future> Future for CatchUnwind<'_, F> {
    type Output = Result<F::Output, Caught>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.0.as_mut();
        // The future is dropped right after a panic and never polled again, so no
        // broken invariant inside it can be observed.
        match in_handler(|| inner.poll(cx)) {
            Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(caught) => Poll::Ready(Err(caught)),
        }
    }
}

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
