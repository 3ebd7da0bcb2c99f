//! Handlers: plain async functions whose arguments are extractors.

mod outcome;

use std::future::Future;
use std::marker::PhantomData;

pub use outcome::IntoOutcome;

use crate::extract::{FromDelivery, Incoming};
use crate::middleware::{Completion, Service};
use crate::state::StateMap;

/// An async function usable as a handler: every argument implements [`FromDelivery`],
/// and it returns a [`HandlerOutcome`](crate::HandlerOutcome) or
/// `Result<HandlerOutcome, E>` with `E` an error type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a ruststream handler",
    label = "not a handler",
    note = "a handler is an `async fn` with up to 8 arguments that implement `FromDelivery` (Message<T>, Payload, Headers, Meta, State<T>, Publisher...), returning `HandlerOutcome` or `Result<HandlerOutcome, E>` with `E` an error type, whose future is `Send` (nothing like an `Rc` or a `std::sync::MutexGuard` held across an `.await`)",
    note = "put `#[ruststream::handler]` on the function to see which argument, type or `.await` is at fault"
)]
pub trait Handler<Args>: Send + Sync + 'static {
    /// Extracts the arguments from `incoming` and runs the function.
    fn call<'a>(&'a self, incoming: &'a Incoming) -> impl Future<Output = Completion> + Send + 'a;

    /// What the arguments need from the app (for example a `State<T>` that was never
    /// provided), checked at startup; one string per missing piece.
    fn requirements(state: &StateMap) -> Vec<String>;
}

macro_rules! impl_handler {
    ($($arg:ident),*) => {
        impl<F, Fut, R, $($arg,)*> Handler<($($arg,)*)> for F
        where
            F: Fn($($arg),*) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = R> + Send,
            R: IntoOutcome,
            $($arg: FromDelivery,)*
        {
            #[allow(non_snake_case, unused_variables, clippy::redundant_closure_call)]
            fn call<'a>(&'a self, incoming: &'a Incoming) -> impl Future<Output = Completion> + Send + 'a {
                let args = (|| Ok::<_, crate::extract::Rejection>(($($arg::from_delivery(incoming)?,)*)))();
                async move {
                    match args {
                        Ok(($($arg,)*)) => (self)($($arg),*).await.into_completion(),
                        Err(rejection) => Completion::Rejected(rejection),
                    }
                }
            }

            #[allow(unused_mut, unused_variables)]
            fn requirements(state: &StateMap) -> Vec<String> {
                let mut missing = Vec::new();
                $(missing.extend($arg::requirement(state));)*
                missing
            }
        }
    };
}

impl_handler!();
impl_handler!(T1);
impl_handler!(T1, T2);
impl_handler!(T1, T2, T3);
impl_handler!(T1, T2, T3, T4);
impl_handler!(T1, T2, T3, T4, T5);
impl_handler!(T1, T2, T3, T4, T5, T6);
impl_handler!(T1, T2, T3, T4, T5, T6, T7);
impl_handler!(T1, T2, T3, T4, T5, T6, T7, T8);

/// A [`Handler`] as a [`Service`], the innermost layer of a registration (what
/// [`on`](crate::on) makes; a service never names it).
#[doc(hidden)]
pub struct HandlerService<H, Args> {
    handler: H,
    _args: PhantomData<fn(Args)>,
}

impl<H, Args> HandlerService<H, Args> {
    pub(crate) fn new(handler: H) -> Self {
        Self {
            handler,
            _args: PhantomData,
        }
    }
}

impl<H: Handler<Args>, Args: 'static> Service for HandlerService<H, Args> {
    fn call<'a>(&'a self, incoming: &'a Incoming) -> impl Future<Output = Completion> + Send + 'a {
        self.handler.call(incoming)
    }
}
