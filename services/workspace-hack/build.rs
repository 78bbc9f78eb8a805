//! No build step: Cargo resolves a crate's build-dependencies (and so their
//! features, for the proc macros they serve) only when it has a build script.

fn main() {}
