//! CPU spent per message during a phase, from `/proc`: the whole machine's busy time
//! (`/proc/stat`) and each party's (`/proc/<pid>/stat`: this process, the PostgreSQL
//! backends, the RabbitMQ node). Steadier than rates on a shared machine, and they
//! say where a gap to the raw limit goes. Linux only; elsewhere every figure is 0
//! and the bench says so.
//!
//! A party's time is summed per process: each process's ticks after less its own
//! before (a process that started inside the phase counts whole). A process that
//! ends inside the phase (a backend whose connection closed: the retention vacuum
//! takes one out of the pool and closes it) takes its phase time with it, which is
//! missed; summing the party's totals instead let such a process's whole lifetime
//! be subtracted, and the consumer phases' PostgreSQL time read 0.

use std::collections::BTreeMap;
use std::time::Duration;

/// Cumulative clock ticks at one moment, per process for the servers.
#[derive(Debug, Clone, Default)]
pub(crate) struct CpuSample {
    machine_busy: u64,
    this_process: u64,
    postgres: BTreeMap<u32, u64>,
    rabbitmq: BTreeMap<u32, u64>,
}

/// Microseconds of CPU per message over a phase.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuPerMessage {
    /// Every core's busy time (all processes, kernel included).
    pub(crate) machine: f64,
    /// The bench process (the in-process relay or consumer, and its client).
    pub(crate) this_process: f64,
    /// The PostgreSQL server processes.
    pub(crate) postgres: f64,
    /// The RabbitMQ node (`beam.smp`).
    pub(crate) rabbitmq: f64,
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// utime + stime of a process, in ticks (fields 14 and 15 of `/proc/<pid>/stat`,
/// counted after the parenthesised command name, which may hold spaces).
fn process_ticks(pid: &str) -> u64 {
    let Some(stat) = read(&format!("/proc/{pid}/stat")) else {
        return 0;
    };
    let Some(after_name) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return 0;
    };
    // After the name: state is field 3, so utime (14) is the 12th and stime the 13th.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// Ticks of every process whose command name is `name`, by pid.
fn ticks_named(name: &str) -> BTreeMap<u32, u64> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return BTreeMap::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|pid| pid.parse::<u32>().ok())
        .filter(|pid| read(&format!("/proc/{pid}/comm")).is_some_and(|c| c.trim() == name))
        .map(|pid| (pid, process_ticks(&pid.to_string())))
        .collect()
}

/// Ticks the processes of `after` spent since `before`: each one's own difference
/// (a process absent from `before` started since, and counts whole).
fn spent(before: &BTreeMap<u32, u64>, after: &BTreeMap<u32, u64>) -> u64 {
    after
        .iter()
        .map(|(pid, t)| t.saturating_sub(before.get(pid).copied().unwrap_or(0)))
        .sum()
}

/// Busy ticks of all cores: the `cpu` line of `/proc/stat` less idle and iowait.
fn machine_busy() -> u64 {
    let Some(stat) = read("/proc/stat") else {
        return 0;
    };
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0;
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let total: u64 = v.iter().take(8).sum();
    total.saturating_sub(v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0))
}

/// Samples the counters now.
#[must_use]
pub(crate) fn sample() -> CpuSample {
    CpuSample {
        machine_busy: machine_busy(),
        this_process: process_ticks("self"),
        postgres: ticks_named("postgres"),
        rabbitmq: ticks_named("beam.smp"),
    }
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on every Linux this runs on).
fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// CPU per message between two samples, over `messages` messages.
#[must_use]
pub(crate) fn per_message(before: CpuSample, after: CpuSample, messages: u64) -> CpuPerMessage {
    let us_per_tick = Duration::from_secs(1).as_micros() as f64 / ticks_per_second();
    let n = messages.max(1) as f64;
    let us = |ticks: u64| ticks as f64 * us_per_tick / n;
    CpuPerMessage {
        machine: us(after.machine_busy.saturating_sub(before.machine_busy)),
        this_process: us(after.this_process.saturating_sub(before.this_process)),
        postgres: us(spent(&before.postgres, &after.postgres)),
        rabbitmq: us(spent(&before.rabbitmq, &after.rabbitmq)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend that ends inside the phase must not cancel what the others did:
    /// summed totals (1,010 before, 110 after) read 0 ticks spent.
    #[test]
    fn a_process_that_ends_during_the_phase_does_not_hide_the_others() {
        let before = BTreeMap::from([(1, 1_000), (2, 10)]);
        let after = BTreeMap::from([(2, 110), (3, 5)]);
        assert_eq!(spent(&before, &after), 100 + 5);
    }

    #[test]
    fn busy_work_in_this_process_is_counted() {
        let before = sample();
        let started = std::time::Instant::now();
        let mut x = 0_u64;
        while started.elapsed() < Duration::from_millis(300) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let cpu = per_message(before, sample(), 1);
        // 300 ms of spinning is at least 200,000 µs of this process's CPU, and the
        // machine was at least as busy as this process.
        assert!(cpu.this_process >= 200_000.0, "{cpu:?}");
        assert!(cpu.machine >= cpu.this_process * 0.9, "{cpu:?}");
    }
}
