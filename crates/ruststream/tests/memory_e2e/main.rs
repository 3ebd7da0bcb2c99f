//! End-to-end behaviour on the memory broker, through the production runtime.
//!
//! The tests are in modules in this directory, by topic; `support` holds what they share.

mod support;

mod decoding;
mod handler_failures;
mod handling;
mod refusals;
mod retries;

// Here, not in `refusals`: its test reads this type's path, `memory_e2e::Missing`, in the
// refusal's text.
struct Missing;
