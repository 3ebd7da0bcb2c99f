//! `#[ruststream::handler]` reports each handler mistake at its cause, once. The
//! expected compiler output sits beside each case in `tests/ui` (regenerate with
//! `TRYBUILD=overwrite` after a deliberate change of wording or of the compiler).

#[test]
fn handler_mistakes_name_their_cause() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/well_formed.rs");
    // A return type that is no outcome: named, at the return type.
    cases.compile_fail("tests/ui/returns_bool.rs");
    // An argument that is no extractor: named, at the argument.
    cases.compile_fail("tests/ui/plain_argument.rs");
    // A future that is not Send: the value and the `.await` it is held across.
    cases.compile_fail("tests/ui/rc_across_await.rs");
    // Registered without the attribute: one error, at `on`, whose note names the
    // attribute (the app's `register` adds none).
    cases.compile_fail("tests/ui/registered_without_attribute.rs");
    // Registered with it: the cause, then the one at `on`.
    cases.compile_fail("tests/ui/registered_with_a_mistake.rs");
}
