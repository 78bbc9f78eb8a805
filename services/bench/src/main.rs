//! `notify-bench`: benchmarks run by hand (not part of the test suite).

fn main() {
    eprintln!("notify-bench: not built yet");
}
