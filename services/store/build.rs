//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!`
//! embeds `migrations/` at compile time, and cargo does not watch it by
//! itself (as `sqlx migrate build-script` writes it).

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
