//! Compile-time rules of `#[cache_lock]`: each misuse is an error spanned on the
//! offending token (pinned by the `.stderr` files). What compiles is in
//! `every_argument.rs`, an ordinary test: with no `pass` case here, trybuild only
//! checks, and builds no dependency to link.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail_*.rs");
}
