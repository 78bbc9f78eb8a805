//! `notify-api` binary: the allocator, then [`notify_api::main`].

// Small, short-lived allocations (HTTP/2 frames, requests, replies) are most
// of what a call allocates; mimalloc serves them with less work than glibc's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    notify_api::main()
}
