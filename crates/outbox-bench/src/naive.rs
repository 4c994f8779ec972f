//! `naive`: claim one row, publish it, mark it sent, one at a time; what the
//! relay's batches are compared with.

use std::time::{Duration, Instant};

use outbox_adapters_postgres::PgOutboxStore;
use outbox_ports::Lease;
use outbox_ports::prelude::*;

use crate::bench::Bench;

impl Bench {
    pub(crate) async fn naive(&mut self, n: i64) -> anyhow::Result<f64> {
        let schema = self.fresh_schema("bench_naive").await?;
        self.backlog(&schema, n, None).await?;
        let store = PgOutboxStore::new(self.pool.clone(), schema);
        let publisher = self.publisher();
        let started = Instant::now();
        for i in 0.. {
            let lease = Lease::new(format!("naive#{i}"), Duration::from_secs(60));
            let claimed = store.claim_pending(&lease, 1).await?;
            let Some(c) = claimed.into_iter().next() else {
                break;
            };
            let outcome = publisher.publish(std::slice::from_ref(&c.message)).await;
            anyhow::ensure!(
                outcome.iter().all(|o| o.is_confirmed()),
                "naive publish failed"
            );
            store.mark_sent(&lease, &[c.message.id]).await?;
        }
        let rate = n as f64 / started.elapsed().as_secs_f64();
        self.purge().await?;
        Ok(rate)
    }
}
