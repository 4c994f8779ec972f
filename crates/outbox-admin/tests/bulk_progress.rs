//! Bulk actions tell their progress once per batch (for the CLI's progress bar),
//! over the memory adapters with a batch small enough to need several.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use outbox_admin::model::BulkProgress;
use outbox_admin::{AdminPorts, AdminService};
use outbox_ports::MessageFilter;
use support::{Harness, harness, message};

fn service(h: &Harness, batch: u64) -> AdminService {
    AdminService::new(AdminPorts {
        outbox: h.outbox.clone(),
        inbox: h.inbox.clone(),
        audit: h.audit.clone(),
        outbox_store: h.outbox.clone(),
        pauses: std::sync::Arc::new(h.outbox.pauses()),
    })
    .with_bulk_batch(batch)
}

fn changed(seen: &[BulkProgress]) -> Vec<u64> {
    seen.iter().map(|p| p.changed).collect()
}

fn assert_told_per_batch(seen: &[BulkProgress], matched: u64) {
    for (i, p) in seen.iter().enumerate() {
        assert_eq!(p.batches, i as u64 + 1, "{seen:?}");
        assert_eq!(p.matched, matched, "{seen:?}");
    }
}

#[tokio::test]
async fn requeue_tells_each_batch_and_ends_on_the_changed_count() {
    let h = harness();
    for i in 0..10 {
        h.dead(message("orders", &format!("k{i}"), b"{}")).await;
    }
    h.pending(message("orders", "p", b"{}")).await;
    let s = service(&h, 3);
    let mut seen = Vec::new();
    let answer = s
        .requeue_matching_with_progress(
            "t",
            &MessageFilter::default(),
            "{}".into(),
            false,
            10_000,
            &mut |p| seen.push(p),
        )
        .await
        .unwrap();
    assert_eq!((answer.matched, answer.changed), (11, 10));
    assert_eq!(changed(&seen), [3, 6, 9, 10]);
    assert_told_per_batch(&seen, 11);
    assert_eq!(seen.last().unwrap().changed, answer.changed);
    let (_, page) = h.get("/messages?status=dead").await;
    assert!(page["items"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn max_caps_the_last_batch_and_a_dry_run_tells_nothing() {
    let h = harness();
    for _ in 0..10 {
        h.dead(message("orders", "a", b"{}")).await;
    }
    let s = service(&h, 3);
    let mut seen = Vec::new();
    let answer = s
        .requeue_matching_with_progress(
            "t",
            &MessageFilter::default(),
            "{}".into(),
            true,
            4,
            &mut |p| seen.push(p),
        )
        .await
        .unwrap();
    // The count is exact whatever max: ten match.
    assert_eq!((answer.matched, answer.changed), (10, 0));
    assert!(seen.is_empty());
    let answer = s
        .delete_matching_with_progress(
            "t",
            &MessageFilter::default(),
            "{}".into(),
            false,
            4,
            false,
            &mut |p| seen.push(p),
        )
        .await
        .unwrap();
    assert_eq!((answer.matched, answer.changed), (10, 4));
    assert_eq!(changed(&seen), [3, 4]);
    assert_told_per_batch(&seen, 4);
    let entries = h.audit_entries().await;
    assert_eq!(entries[0]["action"], "delete_matching");
    assert_eq!(entries[0]["count"], 4);
}

#[tokio::test]
async fn reconsume_tells_each_batch_and_the_plain_method_matches_it() {
    let h = harness();
    for _ in 0..5 {
        h.delivered("billing", &message("orders", "a", b"{}"), false)
            .await;
    }
    h.delivered("billing", &message("orders", "a", b"{}"), true)
        .await;
    let s = service(&h, 2);
    let mut seen = Vec::new();
    let answer = s
        .reconsume_matching_with_progress(
            "t",
            "billing",
            &MessageFilter::default(),
            "{}".into(),
            false,
            10_000,
            &mut |p| seen.push(p),
        )
        .await
        .unwrap();
    assert_eq!(
        (answer.matched, answer.changed),
        (6, 5),
        "consumed ones stay"
    );
    assert_eq!(changed(&seen), [2, 4, 5]);
    assert_told_per_batch(&seen, 6);
    // The signature without a callback does the same.
    for _ in 0..3 {
        h.delivered("shipping", &message("orders", "a", b"{}"), false)
            .await;
    }
    let answer = s
        .reconsume_matching(
            "t",
            "shipping",
            &MessageFilter::default(),
            "{}".into(),
            false,
            10_000,
        )
        .await
        .unwrap();
    assert_eq!((answer.matched, answer.changed), (3, 3));
}
