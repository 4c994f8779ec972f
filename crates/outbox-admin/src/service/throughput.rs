//! Each exchange's and consumer's chart over the last hour, day or week, from the
//! per-name totals the relays and workers add to the throughput log.

use outbox_ports::{BucketCount, ChartWindow, PauseKind, ThroughputKind, ThroughputLog};

use super::AdminService;
use crate::AdminError;
use crate::model::{
    ConsumerBucket, ConsumerThroughput, ConsumerTotal, ExchangeBucket, ExchangeThroughput,
    ExchangeTotal, ThroughputTotals,
};
use crate::params::format_time;

/// Two series of one name over one window, bucket by bucket: `(start, completed,
/// failed)`.
type Paired = Vec<(String, u64, u64)>;

impl AdminService {
    fn throughput_log(&self) -> Result<&dyn ThroughputLog, AdminError> {
        self.throughput.as_deref().ok_or(AdminError::NotRecorded)
    }

    /// The `completed` and `failed` series of `name`, paired by bucket.
    async fn paired(
        &self,
        completed: ThroughputKind,
        failed: ThroughputKind,
        name: &str,
        window: ChartWindow,
    ) -> Result<Paired, AdminError> {
        let log = self.throughput_log()?;
        // Each read takes the store's now: read again when a bucket turned between
        // the two (rare; the buckets would not pair up).
        let mut tries = 0;
        let (done, failed) = loop {
            let done = log.named_series(completed, name, window).await?;
            let failed = log.named_series(failed, name, window).await?;
            tries += 1;
            let first = |s: &[BucketCount]| s.first().map(|b| b.start);
            if first(&done) == first(&failed) || tries == 3 {
                break (done, failed);
            }
        };
        let failed_at = |b: &BucketCount| {
            failed
                .iter()
                .find(|f| f.start == b.start)
                .map_or(0, |f| f.count)
        };
        Ok(done
            .iter()
            .map(|b| (format_time(b.start), b.count, failed_at(b)))
            .collect())
    }

    /// Exchange `exchange`'s publishes and failed attempts over `window`.
    ///
    /// # Errors
    /// `BadRequest` for a name no exchange can have; [`AdminError::NotRecorded`]
    /// without a throughput log; what the log says.
    pub async fn exchange_throughput(
        &self,
        exchange: &str,
        window: ChartWindow,
    ) -> Result<ExchangeThroughput, AdminError> {
        read_name(PauseKind::Exchange, exchange)?;
        let paired = self
            .paired(
                ThroughputKind::Published,
                ThroughputKind::PublishFailed,
                exchange,
                window,
            )
            .await?;
        Ok(ExchangeThroughput {
            exchange: exchange.to_owned(),
            window: window.as_str().to_owned(),
            bucket_seconds: window.bucket_seconds().unsigned_abs(),
            published: paired.iter().map(|p| p.1).sum(),
            failed: paired.iter().map(|p| p.2).sum(),
            buckets: paired
                .into_iter()
                .map(|(start, published, failed)| ExchangeBucket {
                    start,
                    published,
                    failed,
                })
                .collect(),
        })
    }

    /// Consumer `consumer`'s completed deliveries and failed handler attempts over
    /// `window`.
    ///
    /// # Errors
    /// `BadRequest` for a name no consumer can have; [`AdminError::NotRecorded`]
    /// without a throughput log; what the log says.
    pub async fn consumer_throughput(
        &self,
        consumer: &str,
        window: ChartWindow,
    ) -> Result<ConsumerThroughput, AdminError> {
        read_name(PauseKind::Consumer, consumer)?;
        let paired = self
            .paired(
                ThroughputKind::Consumed,
                ThroughputKind::ConsumeFailed,
                consumer,
                window,
            )
            .await?;
        Ok(ConsumerThroughput {
            consumer: consumer.to_owned(),
            window: window.as_str().to_owned(),
            bucket_seconds: window.bucket_seconds().unsigned_abs(),
            consumed: paired.iter().map(|p| p.1).sum(),
            failed: paired.iter().map(|p| p.2).sum(),
            buckets: paired
                .into_iter()
                .map(|(start, consumed, failed)| ConsumerBucket {
                    start,
                    consumed,
                    failed,
                })
                .collect(),
        })
    }

    /// Every exchange and consumer with something counted over `window`.
    ///
    /// # Errors
    /// [`AdminError::NotRecorded`] without a throughput log; what the log says.
    pub async fn throughput_totals(
        &self,
        window: ChartWindow,
    ) -> Result<ThroughputTotals, AdminError> {
        let log = self.throughput_log()?;
        let joined = async |done, failed| -> Result<Paired, AdminError> {
            let mut by_name: std::collections::BTreeMap<String, (u64, u64)> =
                std::collections::BTreeMap::new();
            for (name, n) in log.named_totals(done, window).await? {
                by_name.entry(name).or_default().0 += n;
            }
            for (name, n) in log.named_totals(failed, window).await? {
                by_name.entry(name).or_default().1 += n;
            }
            Ok(by_name.into_iter().map(|(n, (d, f))| (n, d, f)).collect())
        };
        let exchanges = joined(ThroughputKind::Published, ThroughputKind::PublishFailed).await?;
        let consumers = joined(ThroughputKind::Consumed, ThroughputKind::ConsumeFailed).await?;
        Ok(ThroughputTotals {
            window: window.as_str().to_owned(),
            exchanges: exchanges
                .into_iter()
                .map(|(exchange, published, failed)| ExchangeTotal {
                    exchange,
                    published,
                    failed,
                })
                .collect(),
            consumers: consumers
                .into_iter()
                .map(|(consumer, consumed, failed)| ConsumerTotal {
                    consumer,
                    consumed,
                    failed,
                })
                .collect(),
        })
    }
}

/// A name a chart is read for: 1 to 255 characters. Any other character is
/// allowed (a name no exchange or consumer has reads as an empty chart), unlike
/// a pause's name, which is written and so refuses control characters.
fn read_name(kind: PauseKind, name: &str) -> Result<(), AdminError> {
    let chars = name.chars().count();
    if chars == 0 || chars > outbox_ports::MAX_PAUSE_NAME_CHARS {
        return Err(AdminError::bad(
            "bad_name",
            format!("the {kind} name must be 1 to 255 characters (got {chars})"),
        ));
    }
    Ok(())
}
