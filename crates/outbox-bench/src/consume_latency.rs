//! `consume_latency_*`: publish to committed effect through the inbox worker at a
//! steady 200 deliveries a second, the handler inserting a row of its own.
//!
//! One message is published (and confirmed) every 5 ms; a sampler reads the worker's
//! `consumed` counter, which counts a delivery after its inbox transaction committed,
//! every millisecond and notes when it first reached each count. At this rate the
//! deliveries finish in the order they were published (a delivery takes a few
//! milliseconds, the next arrives 5 ms later), so delivery `i`'s latency is the time
//! the counter reached `i + 1` less the time its publish began; a delivery finishing
//! out of order swaps two neighbours' figures, which moves no percentile by more than
//! the gap between them. Resolution: the sampler's millisecond.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use outbox_consumer::CancellationToken;
use outbox_core::NewMessage;
use outbox_ports::prelude::*;

use crate::bench::{Bench, EXCHANGE, time_now};
use crate::consume::{Effect, Shape};

/// Publish-to-commit latency through the inbox worker, and the rate achieved.
pub(crate) struct ConsumeLatency {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
    pub(crate) achieved_rate: f64,
}

impl Bench {
    /// See the module's text; `for_how_long` of publishing at 200/s.
    pub(crate) async fn consume_latency(
        &mut self,
        for_how_long: Duration,
    ) -> anyhow::Result<ConsumeLatency> {
        let schema = self.fresh_schema("bench_consume_latency").await?;
        self.purge().await?;
        let (worker, _inbox) = self
            .bench_worker(&schema, Shape::default(), Effect::InsertRow)
            .await?;
        let counters = worker.counters();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(worker.run(cancel.clone()));
        // The worker subscribed and idle before the first message.
        tokio::time::sleep(Duration::from_millis(500)).await;

        let origin = Instant::now();
        let sampling = CancellationToken::new();
        let sampler = {
            let (counters, sampling) = (Arc::clone(&counters), sampling.clone());
            tokio::spawn(async move {
                // reached[k]: when the counter first read k + 1, since `origin`.
                let mut reached: Vec<Duration> = Vec::new();
                let mut tick = tokio::time::interval(Duration::from_millis(1));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                while !sampling.is_cancelled() {
                    tick.tick().await;
                    let now = origin.elapsed();
                    let n = counters.consumed.load(Ordering::Relaxed) as usize;
                    while reached.len() < n {
                        reached.push(now);
                    }
                }
                reached
            })
        };

        let publisher = self.publisher();
        let mut published: Vec<Duration> = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while origin.elapsed() < for_how_long {
            tick.tick().await;
            let m = NewMessage::new(EXCHANGE, "k", vec![b'x'; 1024])
                .with_type("bench")
                .into_message(
                    outbox_core::MessageId::from_uuid(uuid::Uuid::now_v7()),
                    time_now(),
                );
            let at = origin.elapsed();
            anyhow::ensure!(
                publisher
                    .publish(std::slice::from_ref(&m))
                    .await
                    .iter()
                    .all(|o| o.is_confirmed()),
                "latency publish failed"
            );
            published.push(at);
        }
        let achieved_rate = published.len() as f64 / origin.elapsed().as_secs_f64();
        let deadline = Instant::now() + Duration::from_secs(30);
        while (counters.consumed.load(Ordering::Relaxed) as usize) < published.len() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the worker consumed {} of {} within 30 s",
                counters.consumed.load(Ordering::Relaxed),
                published.len()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // A last sample after the last count.
        tokio::time::sleep(Duration::from_millis(5)).await;
        sampling.cancel();
        let reached = sampler.await?;
        cancel.cancel();
        task.await?;
        anyhow::ensure!(
            reached.len() >= published.len(),
            "the sampler saw {} of {} deliveries",
            reached.len(),
            published.len()
        );
        let mut ms: Vec<f64> = published
            .iter()
            .zip(&reached)
            .map(|(p, r)| r.saturating_sub(*p).as_secs_f64() * 1000.0)
            .collect();
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
        Ok(ConsumeLatency {
            p50: at(0.5),
            p99: at(0.99),
            max: ms.last().copied().unwrap_or(0.0),
            achieved_rate,
        })
    }
}
