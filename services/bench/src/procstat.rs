//! Linux `/proc` readings, through the `procfs` crate: memory of the
//! children (VmRSS, VmHWM), CPU time of the processes involved (children,
//! mariadbd, beam.smp, redis-server, this process) and of the whole
//! machine, for "where does the time go".

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use procfs::process::Process;
use procfs::{Current as _, CurrentSI as _};
use tokio::task::JoinHandle;

fn status(pid: u32) -> Option<procfs::process::Status> {
    Process::new(i32::try_from(pid).ok()?).ok()?.status().ok()
}

/// Resident memory (VmRSS) of a process, in kB.
pub fn rss_kb(pid: u32) -> Option<u64> {
    status(pid)?.vmrss
}

/// Peak resident memory (VmHWM) of a process, in kB.
pub fn hwm_kb(pid: u32) -> Option<u64> {
    status(pid)?.vmhwm
}

/// User + system CPU time of a process, in clock ticks.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = Process::new(i32::try_from(pid).ok()?).ok()?.stat().ok()?;
    Some(stat.utime + stat.stime)
}

/// Pids whose command name (`comm`) equals `name`.
pub fn find_pids(name: &str) -> Vec<u32> {
    let Ok(processes) = procfs::process::all_processes() else {
        return Vec::new();
    };
    processes
        .filter_map(|process| {
            let stat = process.ok()?.stat().ok()?;
            (stat.comm == name).then(|| u32::try_from(stat.pid).ok()).flatten()
        })
        .collect()
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
pub fn clock_ticks_per_sec() -> u64 {
    procfs::ticks_per_second()
}

/// Number of online CPUs.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The machine-wide counters of `/proc/stat` ("cpu" line), in ticks.
#[derive(Debug, Clone, Copy, Default)]
pub struct MachineCpu {
    busy: u64,
    iowait: u64,
    steal: u64,
    total: u64,
}

fn machine_cpu() -> MachineCpu {
    let Ok(stats) = procfs::KernelStats::current() else {
        return MachineCpu::default();
    };
    let cpu = stats.total;
    let busy = cpu.user + cpu.nice + cpu.system + cpu.irq.unwrap_or(0) + cpu.softirq.unwrap_or(0);
    let (iowait, steal) = (cpu.iowait.unwrap_or(0), cpu.steal.unwrap_or(0));
    MachineCpu { busy, iowait, steal, total: busy + iowait + steal + cpu.idle }
}

/// Processes whose CPU time is attributed per phase.
#[derive(Debug, Clone)]
pub struct Tracked {
    entries: Vec<(String, Vec<u32>)>,
    ticks_per_sec: f64,
    cpus: usize,
}

/// CPU counters at one instant.
#[derive(Debug, Clone)]
pub struct CpuSnap {
    at: Instant,
    ticks: Vec<u64>,
    machine: MachineCpu,
}

/// CPU use between two snapshots, in percent of one core.
#[derive(Debug, Clone)]
pub struct CpuUse {
    /// (name, % of one core) per tracked process.
    pub per_process: Vec<(String, f64)>,
    /// Whole machine busy, % of one core (max 100 x cpus).
    pub machine_busy: f64,
    /// Whole machine iowait, % of one core.
    pub machine_iowait: f64,
    /// Time the hypervisor gave the machine's CPUs to other guests, % of
    /// one core: the run had that much less CPU than it seems.
    pub machine_steal: f64,
    /// Busy time not explained by the tracked processes.
    pub other: f64,
}

impl Tracked {
    /// Tracks the given children, this process, and the local servers.
    pub fn new(children: &[(&str, u32)]) -> Self {
        let mut entries: Vec<(String, Vec<u32>)> = vec![("mariadbd".into(), find_pids("mariadbd"))];
        if entries[0].1.is_empty() {
            entries[0] = ("mysqld".into(), find_pids("mysqld"));
        }
        for (name, pid) in children {
            entries.push(((*name).to_owned(), vec![*pid]));
        }
        entries.push(("beam.smp".into(), find_pids("beam.smp")));
        entries.push(("redis".into(), find_pids("redis-server")));
        entries.push(("bench".into(), vec![std::process::id()]));
        Self { entries, ticks_per_sec: clock_ticks_per_sec() as f64, cpus: cpus() }
    }

    /// Reads every counter now.
    pub fn snap(&self) -> CpuSnap {
        CpuSnap {
            at: Instant::now(),
            ticks: self
                .entries
                .iter()
                .map(|(_, pids)| pids.iter().filter_map(|p| cpu_ticks(*p)).sum())
                .collect(),
            machine: machine_cpu(),
        }
    }

    /// CPU use between `a` and `b`.
    pub fn between(&self, a: &CpuSnap, b: &CpuSnap) -> CpuUse {
        let wall = b.at.duration_since(a.at).as_secs_f64().max(1e-9);
        let per_process: Vec<(String, f64)> = self
            .entries
            .iter()
            .zip(a.ticks.iter().zip(&b.ticks))
            .map(|((name, _), (x, y))| {
                (name.clone(), y.saturating_sub(*x) as f64 / self.ticks_per_sec / wall * 100.0)
            })
            .collect();
        let total = b.machine.total.saturating_sub(a.machine.total).max(1) as f64;
        let scale = self.cpus as f64 * 100.0 / total;
        let machine_busy = b.machine.busy.saturating_sub(a.machine.busy) as f64 * scale;
        let machine_iowait = b.machine.iowait.saturating_sub(a.machine.iowait) as f64 * scale;
        let machine_steal = b.machine.steal.saturating_sub(a.machine.steal) as f64 * scale;
        let tracked: f64 = per_process.iter().map(|(_, p)| p).sum();
        CpuUse {
            per_process,
            machine_busy,
            machine_iowait,
            machine_steal,
            other: (machine_busy - tracked).max(0.0),
        }
    }

    /// Maximum machine percentage (100 x cpus).
    pub fn machine_max(&self) -> usize {
        self.cpus * 100
    }
}

impl CpuUse {
    /// The mean of several measurements of the same processes, weighted by
    /// their lengths.
    pub fn mean(uses: &[CpuUse], weights: &[f64]) -> CpuUse {
        let total: f64 = weights.iter().sum::<f64>().max(1e-9);
        let weighted = |field: &dyn Fn(&CpuUse) -> f64| -> f64 {
            uses.iter().zip(weights).map(|(u, w)| field(u) * w).sum::<f64>() / total
        };
        let per_process = uses
            .first()
            .map(|first| {
                first
                    .per_process
                    .iter()
                    .enumerate()
                    .map(|(i, (name, _))| (name.clone(), weighted(&|u| u.per_process[i].1)))
                    .collect()
            })
            .unwrap_or_default();
        CpuUse {
            per_process,
            machine_busy: weighted(&|u| u.machine_busy),
            machine_iowait: weighted(&|u| u.machine_iowait),
            machine_steal: weighted(&|u| u.machine_steal),
            other: weighted(&|u| u.other),
        }
    }

    /// One line: `mariadbd 120% worker 40% ... | machine 190%/200% iowait 5% steal 0%`.
    pub fn line(&self, machine_max: usize) -> String {
        let mut parts: Vec<String> = self
            .per_process
            .iter()
            .filter(|(_, p)| *p >= 0.5)
            .map(|(name, p)| format!("{name} {p:.0}%"))
            .collect();
        if parts.is_empty() {
            parts.push("idle".into());
        }
        format!(
            "{} | other {:.0}% | machine busy {:.0}%/{machine_max}% iowait {:.0}% steal {:.0}%",
            parts.join(", "),
            self.other,
            self.machine_busy,
            self.machine_iowait,
            self.machine_steal
        )
    }
}

/// Samples VmRSS of a set of pids every 200 ms and keeps the maximum.
pub struct RssSampler {
    max_kb: Arc<Vec<AtomicU64>>,
    pids: Vec<u32>,
    task: JoinHandle<()>,
}

impl RssSampler {
    /// Starts sampling.
    pub fn start(pids: Vec<u32>) -> Self {
        let max_kb: Arc<Vec<AtomicU64>> =
            Arc::new(pids.iter().map(|_| AtomicU64::new(0)).collect());
        let task = {
            let max_kb = max_kb.clone();
            let pids = pids.clone();
            tokio::spawn(async move {
                loop {
                    for (slot, pid) in max_kb.iter().zip(&pids) {
                        if let Some(kb) = rss_kb(*pid) {
                            slot.fetch_max(kb, Ordering::Relaxed);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            })
        };
        Self { max_kb, pids, task }
    }

    /// Per pid: (max sampled VmRSS, kernel peak VmHWM), in kB. Call before
    /// the processes exit.
    pub fn peaks(&self) -> Vec<(u64, u64)> {
        self.pids
            .iter()
            .zip(self.max_kb.iter())
            .map(|(pid, max)| {
                let rss = rss_kb(*pid).unwrap_or(0);
                let max = max.fetch_max(rss, Ordering::Relaxed).max(rss);
                (max, hwm_kb(*pid).unwrap_or(0))
            })
            .collect()
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Load averages over one, five and fifteen minutes (`0.63 1.45 2.05`).
pub fn loadavg() -> String {
    procfs::LoadAverage::current()
        .map(|load| format!("{:.2} {:.2} {:.2}", load.one, load.five, load.fifteen))
        .unwrap_or_default()
}

/// What this machine charges for memory after a pause: the time to read
/// one byte of each 4 KiB page of 64 MiB that was just read, and the same
/// after the process slept `pause`. On a dedicated machine both are well
/// under a millisecond. On a shared virtual machine whose idle cores run
/// other work, the caches and the translations of the pages are gone after
/// the pause, and each page costs microseconds: a call that follows an
/// idle moment pays that on every page it touches, in each process it
/// passes through. Printed beside latencies so that a tail can be told
/// from the machine's.
pub async fn memory_after_pause(pause: Duration) -> (f64, f64) {
    const SIZE: usize = 64 << 20;
    const PAGE: usize = 4096;
    let memory = vec![1u8; SIZE];
    let touch = |memory: &[u8]| {
        let started = Instant::now();
        let sum: u64 =
            memory.iter().step_by(PAGE).map(|b| u64::from(std::hint::black_box(*b))).sum();
        std::hint::black_box(sum);
        started.elapsed().as_secs_f64() * 1000.0
    };
    touch(&memory);
    let warm = touch(&memory);
    tokio::time::sleep(pause).await;
    let paused = touch(&memory);
    (warm, paused)
}

/// [`memory_after_pause`] after a pause of one second, as a line.
pub async fn memory_line() -> String {
    let (warm, paused) = memory_after_pause(Duration::from_secs(1)).await;
    format!(
        "machine: reading 64 MiB page by page takes {warm:.2} ms right after it was read, \
         {paused:.1} ms after a 1 s pause (the cost of a pause on this machine)"
    )
}
