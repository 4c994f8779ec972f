//! What the bench reports: each figure printed as a row of the table when it is
//! measured, and every figure written to `summary.json` at the end.

use crate::bench::Bench;
use crate::cpu;

impl Bench {
    pub(crate) fn record(&mut self, name: &str, value: f64, unit: &'static str) {
        println!("{name:<28} {value:>12.2} {unit}");
        self.results.push((name.to_owned(), value, unit));
    }

    /// `<phase>_cpu_us` (the whole machine's busy CPU per message) and the parties'
    /// shares: `_self` (this process), `_postgres`, `_rabbitmq`.
    pub(crate) fn record_cpu(&mut self, phase: &str, cpu: cpu::CpuPerMessage) {
        self.record(&format!("{phase}_cpu_us"), cpu.machine, "us/msg");
        self.record(&format!("{phase}_cpu_us_self"), cpu.this_process, "us/msg");
        self.record(&format!("{phase}_cpu_us_postgres"), cpu.postgres, "us/msg");
        self.record(&format!("{phase}_cpu_us_rabbitmq"), cpu.rabbitmq, "us/msg");
    }
}

pub(crate) fn write_summary(b: &Bench, quick: bool, out: &str) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let summary = serde_json::json!({
        "cores": cores,
        "quick": quick,
        "results": b.results.iter().map(|(n, v, u)| serde_json::json!({"name": n, "value": v, "unit": u})).collect::<Vec<_>>(),
    });
    if let Some(dir) = std::path::Path::new(out).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, serde_json::to_string_pretty(&summary)?)?;
    println!("written {out}");
    Ok(())
}
