//! Nothing to call: the dependencies of this crate, with the features the
//! test build resolves for them, make the release build resolve the same,
//! so that the two share every compiled dependency (see its `Cargo.toml`).
