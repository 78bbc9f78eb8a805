//! `notify-edge` binary: the allocator, then [`notify_edge::main`].

// Many small, short-lived allocations (requests, JSON, event frames) beside
// many long-lived connections; mimalloc returns freed pages to the system.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    notify_edge::main()
}
