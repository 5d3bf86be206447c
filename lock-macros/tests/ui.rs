//! Compile-time rules of `#[cache_lock]`: each misuse is an error spanned on the
//! offending token (pinned by the `.stderr` files), and every argument together compiles.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass_every_argument.rs");
    t.compile_fail("tests/ui/fail_*.rs");
}
