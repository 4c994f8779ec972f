//! `relay_rss_peak_mib`: the peak resident memory (`VmHWM`) of the real `outbox`
//! binary draining a large backlog.

use std::time::Duration;

use anyhow::Context as _;

use crate::bench::Bench;

impl Bench {
    /// Peak RSS of the real relay binary draining a backlog.
    pub(crate) async fn relay_rss(&mut self, relay_bin: &str, n: i64) -> anyhow::Result<f64> {
        let schema = self.fresh_schema("bench_memory").await?;
        self.backlog(&schema, n, None).await?;
        let dir = std::env::temp_dir().join("outbox-bench");
        std::fs::create_dir_all(&dir)?;
        let cfg = dir.join("relay.toml");
        std::fs::write(
            &cfg,
            format!(
                "[adapters]\nstore = \"postgres\"\npublisher = \"rabbitmq\"\nlock = \"memory\"\nsweep_state = \"memory\"\n\
                 [postgres]\nurl = \"{}\"\nschema = \"{}\"\n[rabbitmq]\nurl = \"{}\"\n[dispatch]\nbatch_size = 1000\n[http]\nenabled = false\n",
                self.pg_url, schema, self.amqp_url
            ),
        )?;
        let mut child = tokio::process::Command::new(relay_bin)
            .args(["run", "--config"])
            .arg(&cfg)
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!("starting {relay_bin} (build it with cargo build --release -p outbox-cli)")
            })?;
        let pid = child.id().context("relay pid")?;
        let mut peak_kib = 0_u64;
        while self.count(&schema, "sent").await? < n {
            if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status"))
                && let Some(kib) = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak_kib = peak_kib.max(kib);
            }
            // Drain the queue meanwhile, so the broker's own memory does not decide.
            self.purge().await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let _ = tokio::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
        let _ = child.wait().await;
        self.purge().await?;
        Ok(peak_kib as f64 / 1024.0)
    }
}
