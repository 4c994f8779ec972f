//! `admin_*`: the admin service's reads (pages of messages, stats) over the
//! million-row table the claim phase leaves, then the dashboard over the same
//! service (`crate::ui`).

use std::sync::Arc;
use std::time::Instant;

use outbox_adapters_postgres::{PgInboxStore, PgOutboxStore, PgSchema};

use crate::bench::Bench;
use crate::ui::ui_times;

/// Medians in ms of the admin service's reads over a million-row table.
pub(crate) struct AdminTimes {
    pub(crate) list_first: f64,
    pub(crate) list_deep: f64,
    pub(crate) list_sent: f64,
    pub(crate) stats: f64,
    /// `stats` counting the per-minute charts from the table's rows instead.
    pub(crate) stats_exact: f64,
    /// The dashboard's overview page, over HTTP on loopback.
    pub(crate) ui_overview: f64,
    /// The dashboard's messages page filtered by `status=sent`, over HTTP.
    pub(crate) ui_messages: f64,
}

impl Bench {
    /// The admin API's service over the table `claim_scale` left (`rows` sent
    /// through the relay's marks in the last minutes, 1,000 pending; vacuumed):
    /// median of 7 of
    /// the first page of messages (50, no filter), a page far down by cursor (the
    /// oldest end), the first page of `status = sent`, and `stats` (counts, per-minute
    /// charts over the last hour: here every sent row is in that hour).
    pub(crate) async fn admin_times(
        &self,
        schema: &PgSchema,
        rows: i64,
    ) -> anyhow::Result<AdminTimes> {
        use outbox_ports::{MessageFilter, PageCursor};
        let outbox = Arc::new(PgOutboxStore::new(self.pool.clone(), schema.clone()));
        let inbox = Arc::new(PgInboxStore::new(self.pool.clone(), schema));
        let exact = outbox_admin::AdminService::new(outbox_admin::AdminPorts {
            outbox: outbox.clone(),
            inbox: inbox.clone(),
            audit: Arc::new(outbox_adapters_postgres::PgAuditLog::new(
                self.pool.clone(),
                schema,
            )),
            pauses: Arc::new(outbox_adapters_postgres::PgPauses::new(
                self.pool.clone(),
                schema,
            )),
            outbox_store: outbox,
        });
        // As `outbox run` serves it: charts from the per-minute totals the relays and
        // consumers record (here a minute's worth, as a relay would have added).
        let log = Arc::new(outbox_adapters_postgres::PgThroughputLog::new(
            self.pool.clone(),
            schema,
        ));
        outbox_ports::ThroughputLog::add(&*log, outbox_ports::ThroughputKind::Published, 1_000)
            .await?;
        let service = exact.clone().with_throughput(log);
        let all = MessageFilter::default();
        let sent = MessageFilter {
            status: Some(outbox_core::OutboxStatus::Sent),
            ..MessageFilter::default()
        };
        let deep = Some(PageCursor(u64::try_from(rows / 100).unwrap_or(1_000)));
        let mut first = Vec::new();
        let mut far = Vec::new();
        let mut by_status = Vec::new();
        let mut stats = Vec::new();
        let mut stats_exact = Vec::new();
        for _ in 0..7 {
            let t = Instant::now();
            let page = service.list_messages(&all, None, 50).await?;
            first.push(t.elapsed().as_secs_f64() * 1000.0);
            anyhow::ensure!(page.items.len() == 50, "a first page of 50");
            let t = Instant::now();
            let page = service.list_messages(&all, deep, 50).await?;
            far.push(t.elapsed().as_secs_f64() * 1000.0);
            anyhow::ensure!(page.items.len() == 50, "a deep page of 50");
            let t = Instant::now();
            let page = service.list_messages(&sent, None, 50).await?;
            by_status.push(t.elapsed().as_secs_f64() * 1000.0);
            anyhow::ensure!(page.items.len() == 50, "a page of sent messages");
            let t = Instant::now();
            service.stats().await?;
            stats.push(t.elapsed().as_secs_f64() * 1000.0);
            let t = Instant::now();
            exact.stats().await?;
            stats_exact.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (ui_overview, ui_messages) = ui_times(service).await?;
        Ok(AdminTimes {
            list_first: median(first),
            list_deep: median(far),
            list_sent: median(by_status),
            stats: median(stats),
            stats_exact: median(stats_exact),
            ui_overview,
            ui_messages,
        })
    }
}
