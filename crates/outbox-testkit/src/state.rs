//! The sweep-state store contract.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{SweepReport, Timestamp};
use outbox_ports::{StateWrite, SweepStateStore};

use crate::{LONG_TTL, unique_key};

fn report(completed_secs: i64, retried: u64) -> SweepReport {
    let at = Timestamp::from_unix_timestamp(1_700_000_000 + completed_secs).expect("valid");
    SweepReport {
        started_at: at,
        completed_at: at,
        publish_retried: retried,
        publish_failed: 1,
        consume_retried: 2,
        consume_failed: 3,
    }
}

/// Nothing until written; then exactly what was written.
pub async fn absent_until_written(state: Arc<dyn SweepStateStore>) {
    let key = unique_key("state");
    assert_eq!(state.get(&key).await.expect("get"), None);
    let r = report(0, 7);
    assert_eq!(
        state.set(&key, &r, LONG_TTL, 1).await.expect("set"),
        StateWrite::Written
    );
    assert_eq!(state.get(&key).await.expect("get"), Some(r));
}

/// A writer with an older fencing token cannot overwrite a newer one's report.
pub async fn older_tokens_are_fenced(state: Arc<dyn SweepStateStore>) {
    let key = unique_key("state");
    let newer = report(10, 1);
    assert_eq!(
        state.set(&key, &newer, LONG_TTL, 5).await.expect("set"),
        StateWrite::Written
    );
    assert_eq!(
        state
            .set(&key, &report(20, 2), LONG_TTL, 4)
            .await
            .expect("set"),
        StateWrite::Fenced
    );
    assert_eq!(state.get(&key).await.expect("get"), Some(newer));
    let newest = report(30, 3);
    assert_eq!(
        state.set(&key, &newest, LONG_TTL, 6).await.expect("set"),
        StateWrite::Written
    );
    assert_eq!(state.get(&key).await.expect("get"), Some(newest));
}

/// A report is gone after its time to live.
pub async fn reports_expire(state: Arc<dyn SweepStateStore>) {
    let key = unique_key("state");
    state
        .set(&key, &report(0, 1), Duration::from_millis(300), 1)
        .await
        .expect("set");
    assert!(state.get(&key).await.expect("get").is_some());
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(state.get(&key).await.expect("get"), None);
}
