//! `notify-worker` binary: [`notify_worker::main`].

fn main() -> anyhow::Result<()> {
    notify_worker::main()
}
