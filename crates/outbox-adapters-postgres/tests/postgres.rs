//! Behaviour only PostgreSQL has: enqueue inside the caller's transaction, plain SQL
//! producers, claim races, handlers in the inbox's transaction, wake-ups, lock
//! renewal, retention, bad input.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_adapters_postgres::{
    ConsumeOutcome, PgInboxStore, PgLock, PgOutbox, PgOutboxStore, PgSchema, PgWakeup, Wake,
    connect, migrate,
};
use outbox_core::{Decision, InboxStatus, NewMessage, OutboxStatus};
use outbox_ports::prelude::*;
use outbox_ports::{DistributedLock, InboxStore, Lease, OutboxStore, PortError};

fn lease(name: &str) -> Lease {
    Lease::new(outbox_testkit::unique_key(name), Duration::from_secs(60))
}

#[tokio::test]
async fn enqueue_commits_and_rolls_back_with_the_business_transaction() {
    with_db!(|pool, schema| {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE {}.orders (id int PRIMARY KEY)",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("orders table");
        let outbox = PgOutbox::new(schema.clone());
        let store = PgOutboxStore::new(pool.clone(), schema.clone());

        let mut tx = pool.begin().await.expect("begin");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.orders VALUES (1)",
            schema.quoted()
        )))
        .execute(&mut *tx)
        .await
        .expect("order 1");
        let kept = outbox
            .enqueue(
                &mut tx,
                NewMessage::new("orders", "order.created", b"{\"id\":1}".to_vec()),
            )
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");

        let mut tx = pool.begin().await.expect("begin");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.orders VALUES (2)",
            schema.quoted()
        )))
        .execute(&mut *tx)
        .await
        .expect("order 2");
        let rolled_back = outbox
            .enqueue_batch(
                &mut tx,
                vec![
                    NewMessage::new("orders", "order.created", b"{\"id\":2}".to_vec()),
                    NewMessage::new("orders", "order.paid", b"{\"id\":2}".to_vec()),
                ],
            )
            .await
            .expect("enqueue batch");
        tx.rollback().await.expect("rollback");

        let claimed = store
            .claim_pending(&lease("relay"), 100)
            .await
            .expect("claim");
        let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
        assert_eq!(ids, [kept]);
        for id in rolled_back {
            assert!(
                store.get_message(id).await.expect("get").is_none(),
                "rolled back message exists"
            );
        }
    });
}

#[tokio::test]
async fn the_smallest_sql_insert_is_relayed_like_any_message() {
    with_db!(|pool, schema| {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {}.outbox_messages (exchange, routing_key, payload) \
             VALUES ('orders', 'order.created', convert_to('{{\"id\":7}}', 'UTF8'))",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("plain SQL insert");
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let claimed = store
            .claim_pending(&lease("relay"), 10)
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 1);
        let m = &claimed[0].message;
        assert_eq!(
            (m.exchange.as_str(), m.routing_key.as_str()),
            ("orders", "order.created")
        );
        assert_eq!(m.payload, b"{\"id\":7}");
        assert_eq!(m.content_type, "application/json");
        assert!(!m.id.as_uuid().is_nil());
        assert!(m.headers.is_empty());
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_claimers_over_ten_thousand_rows_take_each_once() {
    with_db!(|pool, schema| {
        let store = Arc::new(PgOutboxStore::new(pool.clone(), schema.clone()));
        let msgs = outbox_testkit::messages(10_000);
        for chunk in msgs.chunks(1000) {
            store.enqueue(chunk.to_vec()).await.expect("enqueue");
        }
        let mut tasks = Vec::new();
        for i in 0..4 {
            let store = Arc::clone(&store);
            tasks.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let l = lease(&format!("claimer{i}"));
                    let batch = store.claim_pending(&l, 100).await.expect("claim");
                    if batch.is_empty() {
                        return mine;
                    }
                    let ids: Vec<_> = batch.iter().map(|c| c.message.id).collect();
                    assert_eq!(
                        store.mark_sent(&l, &ids).await.expect("mark"),
                        ids.len() as u64
                    );
                    mine.extend(ids);
                }
            }));
        }
        let mut seen = Vec::new();
        for t in tasks {
            seen.extend(t.await.expect("claimer"));
        }
        let unique: HashSet<_> = seen.iter().copied().collect();
        assert_eq!(seen.len(), 10_000, "a row was claimed twice or never");
        assert_eq!(unique.len(), 10_000);
        assert_eq!(
            store.count(OutboxStatus::Sent).await.expect("count"),
            10_000
        );
    });
}

#[tokio::test]
async fn a_handler_in_the_inbox_transaction_takes_effect_exactly_once() {
    with_db!(|pool, schema| {
        let effects = format!("{}.effects", schema.quoted());
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE {effects} (message_id uuid, n int)"
        )))
        .execute(&pool)
        .await
        .expect("effects table");
        let inbox = PgInboxStore::new(pool.clone(), &schema);
        let m = outbox_testkit::message("orders", "order.created");
        let insert = format!("INSERT INTO {effects} VALUES ($1, 1)");
        let run = |fail: bool| {
            let insert = insert.clone();
            let id = *m.id.as_uuid();
            outbox_adapters_postgres::TxHandler::from(Box::new(
                move |conn: &mut sqlx::PgConnection| {
                    Box::pin(async move {
                        sqlx::query(sqlx::AssertSqlSafe(insert))
                            .bind(id)
                            .execute(&mut *conn)
                            .await
                            .map_err(|e| e.to_string())?;
                        if fail {
                            Err("downstream refused".into())
                        } else {
                            Ok(())
                        }
                    })
                        as std::pin::Pin<
                            Box<
                                dyn std::future::Future<
                                        Output = Result<(), outbox_core::HandlerFailure>,
                                    > + Send
                                    + '_,
                            >,
                        >
                },
            ))
        };
        let count = || async {
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {effects}"
            )))
            .fetch_one(&pool)
            .await
            .expect("count")
        };
        let retry = |_, _: &_| Decision::RetryAfter(Duration::from_millis(10));
        let lease = lease("worker");

        // A failing handler: its write is rolled back, the failure is stored.
        let out = inbox
            .consume_in_transaction("billing", &m, &lease, retry, run(true))
            .await
            .expect("consume");
        assert_eq!(out, ConsumeOutcome::Failed("downstream refused".into()));
        assert_eq!(
            count().await,
            0,
            "the failed handler's write was rolled back"
        );
        let rec = inbox
            .get_delivery("billing", m.id)
            .await
            .expect("get")
            .expect("row");
        assert_eq!(rec.status, InboxStatus::ConsumeFailed);
        assert_eq!(
            rec.consume.last_error.as_deref(),
            Some("downstream refused")
        );

        // Another message succeeds: effect and inbox row commit together.
        let m2 = outbox_testkit::message("orders", "order.created");
        let insert2 = insert.clone();
        let id2 = *m2.id.as_uuid();
        let ok: outbox_adapters_postgres::TxHandler<'_> =
            Box::new(move |conn: &mut sqlx::PgConnection| {
                Box::pin(async move {
                    sqlx::query(sqlx::AssertSqlSafe(insert2))
                        .bind(id2)
                        .execute(&mut *conn)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(())
                })
            });
        assert_eq!(
            inbox
                .consume_in_transaction("billing", &m2, &lease, retry, ok)
                .await
                .expect("consume"),
            ConsumeOutcome::Consumed
        );
        assert_eq!(count().await, 1);
        // Redelivered: the handler does not run again.
        let again: outbox_adapters_postgres::TxHandler<'_> =
            Box::new(|_conn: &mut sqlx::PgConnection| {
                Box::pin(async move { panic!("a duplicate must not reach the handler") })
            });
        assert_eq!(
            inbox
                .consume_in_transaction("billing", &m2, &lease, retry, again)
                .await
                .expect("consume"),
            ConsumeOutcome::Duplicate
        );
        assert_eq!(count().await, 1, "effect exactly once");
        assert_eq!(
            inbox
                .get_delivery("billing", m2.id)
                .await
                .expect("get")
                .expect("row")
                .status,
            InboxStatus::Consumed
        );
    });
}

/// A handler that runs `statements` on the inbox transaction's connection, in order,
/// then returns `result`: to play a handler that ends that transaction itself.
fn scripted(
    statements: Vec<String>,
    result: Result<(), outbox_core::HandlerFailure>,
) -> outbox_adapters_postgres::TxHandler<'static> {
    Box::new(move |conn: &mut sqlx::PgConnection| {
        Box::pin(async move {
            for sql in &statements {
                sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| format!("{sql}: {e}"))?;
            }
            result
        })
    })
}

async fn effects_table(pool: &outbox_adapters_postgres::PgPool, schema: &PgSchema) -> String {
    let effects = format!("{}.effects", schema.quoted());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {effects} (n int)"
    )))
    .execute(pool)
    .await
    .expect("effects table");
    effects
}

async fn effect_rows(pool: &outbox_adapters_postgres::PgPool, effects: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {effects}"
    )))
    .fetch_one(pool)
    .await
    .expect("count effects")
}

/// Claims every due delivery of `consumer` and retries each with `handler()`, as the
/// consume sweep does; returns the outcomes.
async fn retry_all_due(
    inbox: &PgInboxStore,
    consumer: &str,
    handler: impl Fn() -> outbox_adapters_postgres::TxHandler<'static>,
) -> Vec<ConsumeOutcome> {
    let sweep = lease("sweep");
    let mut outcomes = Vec::new();
    for c in inbox.claim_due(consumer, &sweep, 10).await.expect("claim") {
        outcomes.push(
            inbox
                .retry_in_transaction(
                    consumer,
                    &sweep,
                    &c.message,
                    c.attempts,
                    |_, _| Decision::RetryAfter(Duration::ZERO),
                    handler(),
                )
                .await
                .expect("retry"),
        );
    }
    outcomes
}

/// An operator's reconsume of a failed delivery while the consume sweep's retry
/// of it runs (its handler slow, the retry's transaction holding the row): the
/// retry consumes it, the reconsume is refused, and the handler's effect happens
/// once. (A reconsume that waited on the row lock and re-checked its guard on the
/// consumed row turned it back to `sent`, and the sweep ran the handler again.)
#[tokio::test]
async fn a_reconsume_racing_a_retry_does_not_run_the_handler_twice() {
    with_db!(|pool, schema| {
        let effects = effects_table(&pool, &schema).await;
        let inbox = Arc::new(PgInboxStore::new(pool.clone(), &schema));
        let operator_pool = common::pool().await.expect("a second pool");
        let operator = PgInboxStore::new(operator_pool, &schema);
        let m = outbox_testkit::message("orders", "order.created");
        let retry_now = |_, _: &_| Decision::RetryAfter(Duration::ZERO);
        let first = inbox
            .consume_in_transaction(
                "billing",
                &m,
                &lease("worker"),
                retry_now,
                scripted(vec![], Err("boom".into())),
            )
            .await
            .expect("first attempt");
        assert!(matches!(first, ConsumeOutcome::Failed(_)), "{first:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let sweep = lease("sweep");
        let due = inbox.claim_due("billing", &sweep, 10).await.expect("claim");
        assert_eq!(due.len(), 1);
        let claimed = due.into_iter().next().expect("one");

        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let insert = format!("INSERT INTO {effects} VALUES (1)");
        let slow: outbox_adapters_postgres::TxHandler<'static> =
            Box::new(move |conn: &mut sqlx::PgConnection| {
                Box::pin(async move {
                    sqlx::query(sqlx::AssertSqlSafe(insert))
                        .execute(&mut *conn)
                        .await
                        .map_err(|e| e.to_string())?;
                    let _ = started_tx.send(());
                    let _ = go_rx.await;
                    Ok(())
                })
            });
        let retry = tokio::spawn({
            let inbox = Arc::clone(&inbox);
            async move {
                inbox
                    .retry_in_transaction(
                        "billing",
                        &sweep,
                        &claimed.message,
                        claimed.attempts,
                        retry_now,
                        slow,
                    )
                    .await
            }
        });
        started_rx.await.expect("the handler runs");
        // The operator acts while the handler runs; release the handler only after
        // the reconsume has had time to reach (and, before the fix, wait on) the row.
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let _ = go_tx.send(());
        });
        let reconsumed = operator.reconsume_delivery("billing", m.id, false).await;
        let reconsumed_again = operator.reconsume_delivery("billing", m.id, true).await;
        release.await.expect("release");
        let out = retry.await.expect("retry task").expect("retry");
        assert_eq!(out, ConsumeOutcome::Consumed);
        for (again, r) in [(false, reconsumed), (true, reconsumed_again)] {
            match r {
                Err(PortError::Busy { .. }) => {}
                other => panic!("reconsume (again={again}) while held: {other:?}"),
            }
        }
        let rec = inbox
            .get_delivery("billing", m.id)
            .await
            .expect("get")
            .expect("row");
        assert_eq!(rec.status, InboxStatus::Consumed);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let handler = {
            let effects = effects.clone();
            move || scripted(vec![format!("INSERT INTO {effects} VALUES (2)")], Ok(()))
        };
        let outcomes = retry_all_due(&inbox, "billing", handler).await;
        assert!(outcomes.is_empty(), "ran the handler again: {outcomes:?}");
        assert_eq!(effect_rows(&pool, &effects).await, 1, "exactly one effect");
    })
}

#[tokio::test]
async fn a_handler_that_rolls_back_the_inbox_transaction_and_writes_goes_dead_at_once() {
    with_db!(|pool, schema| {
        let effects = effects_table(&pool, &schema).await;
        let inbox = PgInboxStore::new(pool.clone(), &schema);
        let m = outbox_testkit::message("orders", "order.created");
        // ROLLBACK ends the inbox transaction; the INSERT then autocommits.
        let handler = || {
            scripted(
                vec![
                    "ROLLBACK".into(),
                    format!("INSERT INTO {effects} VALUES (1)"),
                ],
                Ok(()),
            )
        };
        // The policy would retry at once: only the ended transaction makes it dead.
        let retry = |_, _: &_| Decision::RetryAfter(Duration::ZERO);
        let out = inbox
            .consume_in_transaction("billing", &m, &lease("worker"), retry, handler())
            .await
            .expect("consume");
        let ConsumeOutcome::Dead(reason) = out else {
            panic!("expected a failure, got {out:?}");
        };
        assert!(
            reason.contains("ended the inbox transaction itself"),
            "reason: {reason}"
        );
        assert_eq!(
            effect_rows(&pool, &effects).await,
            1,
            "the autocommitted write"
        );
        let rec = inbox
            .get_delivery("billing", m.id)
            .await
            .expect("get")
            .expect("row");
        assert_eq!(rec.status, InboxStatus::Dead, "dead at once, not retried");
        assert_eq!(rec.consume.last_error.as_deref(), Some(reason.as_str()));

        // A consume sweep finds nothing to retry, so the write is not repeated.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let outcomes = retry_all_due(&inbox, "billing", handler).await;
        assert!(outcomes.is_empty(), "retried a dead row: {outcomes:?}");
        assert_eq!(
            effect_rows(&pool, &effects).await,
            1,
            "the write happened once"
        );
    });
}

#[tokio::test]
async fn a_retry_whose_handler_rolls_back_the_inbox_transaction_goes_dead_at_once() {
    with_db!(|pool, schema| {
        let effects = effects_table(&pool, &schema).await;
        let inbox = PgInboxStore::new(pool.clone(), &schema);
        let m = outbox_testkit::message("orders", "order.created");
        let retry = |_, _: &_| Decision::RetryAfter(Duration::ZERO);
        // First attempt: an ordinary failure, stored for a retry.
        let out = inbox
            .consume_in_transaction(
                "billing",
                &m,
                &lease("worker"),
                retry,
                scripted(vec![], Err("not yet".into())),
            )
            .await
            .expect("consume");
        assert_eq!(out, ConsumeOutcome::Failed("not yet".into()));
        // The retry ends the transaction and writes outside it, twice if asked.
        let handler = || {
            scripted(
                vec![
                    "ROLLBACK".into(),
                    format!("INSERT INTO {effects} VALUES (1)"),
                ],
                Ok(()),
            )
        };
        let outcomes = retry_all_due(&inbox, "billing", handler).await;
        assert_eq!(outcomes.len(), 1, "{outcomes:?}");
        let ConsumeOutcome::Dead(reason) = &outcomes[0] else {
            panic!("expected a failure, got {outcomes:?}");
        };
        assert!(
            reason.contains("ended the inbox transaction itself"),
            "reason: {reason}"
        );
        let rec = inbox
            .get_delivery("billing", m.id)
            .await
            .expect("get")
            .expect("row");
        assert_eq!(rec.status, InboxStatus::Dead);
        assert_eq!(rec.consume.attempts, 2);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(retry_all_due(&inbox, "billing", handler).await.is_empty());
        assert_eq!(
            effect_rows(&pool, &effects).await,
            1,
            "the write happened once"
        );
    });
}

#[tokio::test]
async fn a_handler_that_commits_the_inbox_transaction_then_fails_is_reported_consumed() {
    with_db!(|pool, schema| {
        let effects = effects_table(&pool, &schema).await;
        let inbox = PgInboxStore::new(pool.clone(), &schema);
        let retry = |_, _: &_| Decision::RetryAfter(Duration::ZERO);
        // COMMIT makes the inbox row and the write permanent; the Err comes too late.
        let handler = || {
            scripted(
                vec![format!("INSERT INTO {effects} VALUES (1)"), "COMMIT".into()],
                Err("failed after committing".into()),
            )
        };

        // On arrival.
        let m = outbox_testkit::message("orders", "order.created");
        let out = inbox
            .consume_in_transaction("billing", &m, &lease("worker"), retry, handler())
            .await
            .expect("consume");
        assert_eq!(out, ConsumeOutcome::Consumed, "the row is consumed: say so");
        let rec = inbox
            .get_delivery("billing", m.id)
            .await
            .expect("get")
            .expect("row");
        assert_eq!(rec.status, InboxStatus::Consumed);
        assert_eq!(effect_rows(&pool, &effects).await, 1);

        // On a retry.
        let m2 = outbox_testkit::message("orders", "order.created");
        inbox
            .consume_in_transaction(
                "billing",
                &m2,
                &lease("worker"),
                retry,
                scripted(vec![], Err("not yet".into())),
            )
            .await
            .expect("consume");
        let outcomes = retry_all_due(&inbox, "billing", handler).await;
        assert_eq!(outcomes, [ConsumeOutcome::Consumed]);
        let rec = inbox
            .get_delivery("billing", m2.id)
            .await
            .expect("get")
            .expect("row");
        assert_eq!(rec.status, InboxStatus::Consumed);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(retry_all_due(&inbox, "billing", handler).await.is_empty());
        assert_eq!(effect_rows(&pool, &effects).await, 2, "once per message");
    });
}

/// The look for work when a relay declares itself idle counts only what a claim
/// would take: a delayed message still waiting, or a keyed one behind its key's
/// head in flight, must not wake it (it would claim nothing and spin).
#[tokio::test]
async fn an_idle_relay_is_not_woken_for_what_it_cannot_claim() {
    with_db!(|pool, schema| {
        let outbox = PgOutbox::new(schema.clone());
        let store = outbox_adapters_postgres::PgOutboxStore::new(pool.clone(), schema.clone());
        let mut wakeup = PgWakeup::connect(&pool, &schema, "relay-idle")
            .await
            .expect("listen");
        let mut tx = pool.begin().await.expect("begin");
        outbox
            .enqueue(
                &mut tx,
                NewMessage::new("orders", "later", b"{}".to_vec())
                    .deliver_after(Duration::from_secs(3600)),
            )
            .await
            .expect("enqueue");
        for _ in 0..2 {
            outbox
                .enqueue(
                    &mut tx,
                    NewMessage::new("orders", "keyed", b"{}".to_vec()).with_ordering_key("k"),
                )
                .await
                .expect("enqueue");
        }
        tx.commit().await.expect("commit");
        // The head of k in flight: its second message is held back.
        let claimed = store
            .claim_pending(
                &outbox_ports::Lease::new("relay-idle#1", Duration::from_secs(60)),
                10,
            )
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 1, "only k's head");
        assert_eq!(
            wakeup.wait(Duration::from_millis(300)).await.expect("wait"),
            Wake::TimedOut,
            "nothing claimable: a delayed message waiting and a keyed one held back"
        );
        // Something claimable: woken at once.
        let mut tx = pool.begin().await.expect("begin");
        outbox
            .enqueue(&mut tx, NewMessage::new("orders", "now", b"{}".to_vec()))
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
        assert_eq!(
            wakeup.wait(Duration::from_secs(30)).await.expect("wait"),
            Wake::WorkPending
        );
    });
}

#[tokio::test]
async fn an_idle_relay_is_woken_by_a_commit_and_producers_notify_only_then() {
    with_db!(|pool, schema| {
        let outbox = PgOutbox::new(schema.clone());
        let mut wakeup = PgWakeup::connect(&pool, &schema, "relay-a")
            .await
            .expect("listen");

        // Nothing pending, nothing committed: the fallback timeout.
        assert_eq!(
            wakeup.wait(Duration::from_millis(200)).await.expect("wait"),
            Wake::TimedOut
        );

        // A commit while the relay waits wakes it.
        let producer = {
            let pool = pool.clone();
            let outbox = outbox.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let mut tx = pool.begin().await.expect("begin");
                outbox
                    .enqueue(&mut tx, NewMessage::new("orders", "k", b"{}".to_vec()))
                    .await
                    .expect("enqueue");
                tx.commit().await.expect("commit");
                std::time::Instant::now()
            })
        };
        let woke = wakeup.wait(Duration::from_secs(30)).await.expect("wait");
        let woken_at = std::time::Instant::now();
        let committed_at = producer.await.expect("producer");
        assert_eq!(woke, Wake::Notified);
        eprintln!(
            "commit -> wake-up: {:?}",
            woken_at.saturating_duration_since(committed_at)
        );

        // Work already there when declaring idle: no wait at all.
        assert_eq!(
            wakeup.wait(Duration::from_secs(30)).await.expect("wait"),
            Wake::WorkPending
        );

        // No relay idle: producers do not notify (a raw listener hears nothing).
        let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
            .await
            .expect("listener");
        listener
            .listen(&schema.wakeup_channel())
            .await
            .expect("listen");
        let mut tx = pool.begin().await.expect("begin");
        outbox
            .enqueue(&mut tx, NewMessage::new("orders", "k", b"{}".to_vec()))
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
        let heard = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
        assert!(
            heard.is_err(),
            "a producer notified although no relay was idle"
        );
    });
}

#[tokio::test]
async fn the_lock_is_renewed_while_held_and_reports_a_stolen_lease() {
    with_db!(|pool, schema| {
        let lock = PgLock::new(pool.clone(), &schema, "test");
        let ttl = Duration::from_millis(1500);
        let guard = lock
            .acquire("sweep", ttl, Duration::from_millis(100))
            .await
            .expect("acquire")
            .expect("free");
        tokio::time::sleep(ttl * 3).await;
        assert!(guard.is_held(), "renewal kept the lease alive past its TTL");
        assert!(
            lock.acquire("sweep", ttl, Duration::from_millis(100))
                .await
                .expect("acquire")
                .is_none()
        );
        // Someone else takes the row (as after a pause past the TTL).
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {}.outbox_locks SET holder = 'thief', expires_at = now() + interval '1 hour'",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("steal");
        tokio::time::sleep(ttl).await;
        assert!(!guard.is_held(), "the guard noticed its lease was taken");
        guard.release().await.expect("release");
        assert!(
            lock.acquire("sweep", ttl, Duration::from_millis(100))
                .await
                .expect("acquire")
                .is_none(),
            "releasing a lost lock must not free the thief's"
        );
    });
}

#[tokio::test]
async fn retention_deletes_old_sent_rows_in_bounded_batches() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        store
            .enqueue(outbox_testkit::messages(25))
            .await
            .expect("enqueue");
        let l = lease("relay");
        let claimed = store.claim_pending(&l, 20).await.expect("claim");
        let ids: Vec<_> = claimed.iter().map(|c| c.message.id).collect();
        store.mark_sent(&l, &ids).await.expect("mark");
        assert_eq!(
            store
                .delete_sent_older_than(Duration::from_secs(3600), 7)
                .await
                .expect("retention"),
            0
        );
        sqlx::query(sqlx::AssertSqlSafe(format!("UPDATE {}.outbox_messages SET sent_at = now() - interval '2 hours' WHERE status = 'sent'", schema.quoted())))
            .execute(&pool)
            .await
            .expect("age rows");
        assert_eq!(
            store
                .delete_sent_older_than(Duration::from_secs(3600), 7)
                .await
                .expect("retention"),
            20
        );
        assert_eq!(store.count(OutboxStatus::Sent).await.expect("count"), 0);
        assert_eq!(
            store.stats().await.expect("stats").pending,
            5,
            "unsent rows are never deleted"
        );
    });
}

#[tokio::test]
async fn inbox_retention_deletes_only_old_consumed_deliveries() {
    with_db!(|pool, schema| {
        let inbox = PgInboxStore::new(pool.clone(), &schema);
        let l = lease("worker");
        let msgs = outbox_testkit::messages(12);
        for m in &msgs {
            inbox
                .record_arrival("billing", m, &l)
                .await
                .expect("arrive");
        }
        for m in &msgs[..10] {
            assert!(
                inbox
                    .mark_consumed("billing", m.id, &l)
                    .await
                    .expect("consumed")
            );
        }
        inbox
            .mark_consume_failed(
                "billing",
                msgs[10].id,
                &l,
                "x",
                Decision::RetryAfter(Duration::from_secs(60)),
            )
            .await
            .expect("failed");
        assert_eq!(
            inbox
                .delete_consumed_older_than("billing", Duration::from_secs(3600), 3)
                .await
                .expect("retention"),
            0
        );
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {}.outbox_inbox SET consumed_at = now() - interval '2 hours'",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("age rows");
        assert_eq!(
            inbox
                .delete_consumed_older_than("billing", Duration::from_secs(3600), 3)
                .await
                .expect("retention"),
            10
        );
        let s = inbox.stats("billing").await.expect("stats");
        assert_eq!(
            (s.consumed, s.consume_failed, s.received),
            (0, 1, 1),
            "unfinished deliveries are kept"
        );
    });
}

/// Waits until a statement of `schema` naming `what` waits for a row lock.
async fn wait_until_blocked(
    pool: &outbox_adapters_postgres::PgPool,
    schema: &PgSchema,
    what: &str,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE $1 AND query LIKE $2",
        )
        .bind(format!("%{}%", schema.quoted()))
        .bind(format!("{what}%"))
        .fetch_one(pool)
        .await
        .expect("pg_stat_activity");
        if waiting > 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the statement never waited for the row lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_retention_never_deletes_a_row_reconsumed_while_it_ran() {
    with_db!(|pool, schema| {
        let inbox = PgInboxStore::new(pool.clone(), &schema);
        let l = lease("worker");
        let m = outbox_testkit::message("contract", "order.created");
        inbox
            .record_arrival("billing", &m, &l)
            .await
            .expect("arrive");
        assert!(
            inbox
                .mark_consumed("billing", m.id, &l)
                .await
                .expect("consumed")
        );
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {}.outbox_inbox SET consumed_at = now() - interval '2 hours'",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("age rows");
        // An operator's reconsume, not yet committed when retention looks.
        let mut reconsume = pool.begin().await.expect("begin");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {}.outbox_inbox SET status = 'received', attempts = 0, next_attempt_at = now(), \
             consumed_at = NULL WHERE consumer = 'billing' AND message_id = $1",
            schema.quoted()
        )))
        .bind(m.id.as_uuid())
        .execute(&mut *reconsume)
        .await
        .expect("reconsume");
        let retention = {
            let inbox = inbox.clone();
            tokio::spawn(async move {
                inbox
                    .delete_consumed_batch("billing", Duration::from_secs(3600), 10)
                    .await
            })
        };
        wait_until_blocked(&pool, &schema, "DELETE").await;
        reconsume.commit().await.expect("commit reconsume");
        let deleted = retention.await.expect("task").expect("retention");
        assert_eq!(deleted, 0, "the reconsumed row was deleted");
        let r = inbox
            .get_delivery("billing", m.id)
            .await
            .expect("get")
            .expect("row kept");
        assert_eq!(r.status, InboxStatus::Received);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sent_retention_never_deletes_a_row_requeued_while_it_ran() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        let m = outbox_testkit::message("contract", "order.created");
        store.enqueue(vec![m.clone()]).await.expect("enqueue");
        let l = lease("relay");
        assert_eq!(store.claim_pending(&l, 10).await.expect("claim").len(), 1);
        store.mark_sent(&l, &[m.id]).await.expect("sent");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {}.outbox_messages SET sent_at = now() - interval '2 hours'",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("age rows");
        let mut requeue = pool.begin().await.expect("begin");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {}.outbox_messages SET status = 'pending', sent_at = NULL WHERE id = $1",
            schema.quoted()
        )))
        .bind(m.id.as_uuid())
        .execute(&mut *requeue)
        .await
        .expect("requeue");
        let retention = {
            let store = store.clone();
            tokio::spawn(
                async move { store.delete_sent_batch(Duration::from_secs(3600), 10).await },
            )
        };
        wait_until_blocked(&pool, &schema, "DELETE").await;
        requeue.commit().await.expect("commit requeue");
        let deleted = retention.await.expect("task").expect("retention");
        assert_eq!(deleted, 0, "the requeued row was deleted");
        assert_eq!(
            store
                .get_message(m.id)
                .await
                .expect("get")
                .expect("row kept")
                .status,
            OutboxStatus::Pending
        );
    });
}

#[tokio::test]
async fn bad_input_is_a_clear_error_and_writes_nothing() {
    with_db!(|pool, schema| {
        let outbox = PgOutbox::new(schema.clone()).with_max_payload_bytes(1024);
        let mut conn = pool.acquire().await.expect("conn");
        let err = outbox
            .enqueue(&mut conn, NewMessage::new("orders", "k", vec![0; 1025]))
            .await
            .expect_err("oversized");
        assert!(matches!(err, PortError::InvalidMessage(_)), "{err}");
        assert!(err.to_string().contains("1025"), "{err}");
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {}.outbox_messages",
            schema.quoted()
        )))
        .fetch_one(&pool)
        .await
        .expect("count");
        assert_eq!(n, 0);
        // Migrations are idempotent.
        migrate(&pool, &schema).await.expect("second migrate");
        // Hostile schema names never reach SQL.
        assert!(PgSchema::new("x\"; DROP SCHEMA public; --").is_err());
        // Unparseable URLs name no password.
        let e = connect("postgres://u:hunter2@[::1", 1, Duration::from_secs(1))
            .await
            .expect_err("bad url");
        assert!(!e.to_string().contains("hunter2"), "{e}");
        let e = connect(
            "postgres://u:hunter2@127.0.0.1:1/db",
            1,
            Duration::from_secs(2),
        )
        .await
        .expect_err("closed port");
        assert!(!e.to_string().contains("hunter2"), "{e}");
        assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
    });
}

#[tokio::test]
async fn a_killed_connection_is_a_retryable_error_and_the_store_carries_on() {
    with_db!(|pool, schema| {
        // A pool of its own, named, so that only its sessions are killed.
        let name = outbox_testkit::unique_key("killme");
        let options = common::url()
            .parse::<sqlx::postgres::PgConnectOptions>()
            .expect("url")
            .application_name(&name);
        let own = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .expect("own pool");
        let store = PgOutboxStore::new(own, schema.clone());
        store
            .enqueue(outbox_testkit::messages(3))
            .await
            .expect("enqueue");
        let killed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1) k",
        )
        .bind(&name)
        .fetch_one(&pool)
        .await
        .expect("terminate");
        assert!(killed >= 1, "no session of the store was killed");
        let mut errors = 0;
        let mut claimed = Vec::new();
        for _ in 0..20 {
            match store.claim_pending(&lease("relay"), 10).await {
                Ok(c) => {
                    claimed = c;
                    break;
                }
                Err(e) => {
                    assert!(e.is_retryable(), "{e}");
                    errors += 1;
                }
            }
        }
        assert_eq!(
            claimed.len(),
            3,
            "after {errors} retryable errors the rows are still there"
        );
    });
}

/// sqlx's migrator holds a session-wide advisory lock (one per database) while it
/// runs and releases it only when it succeeds: a failed migration used to put its
/// connection back into the pool still holding the lock, and every later migration
/// in that database (any schema, any process) then waited for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_migration_leaves_no_lock_behind() {
    with_db!(|pool, schema| {
        // A schema where the first migration cannot run: its table already exists.
        let broken = PgSchema::new(&format!("{}_broken", schema.as_str())).expect("name");
        for sql in [
            format!("CREATE SCHEMA {}", broken.quoted()),
            format!("CREATE TABLE {}.outbox_messages (x int)", broken.quoted()),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&pool)
                .await
                .expect("prepare");
        }
        let err = migrate(&pool, &broken).await.expect_err("cannot migrate");
        assert!(err.to_string().contains(broken.as_str()), "{err}");
        // The same pool (the connection may come back) and another schema.
        let next = PgSchema::new(&format!("{}_next", schema.as_str())).expect("name");
        let migrated = tokio::time::timeout(Duration::from_secs(20), migrate(&pool, &next)).await;
        for s in [&broken, &next] {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS {} CASCADE",
                s.quoted()
            )))
            .execute(&pool)
            .await;
        }
        migrated
            .expect("a later migration is not blocked by the failed one's lock")
            .expect("migrate");
    });
}

/// A connection the server closed while it sat in the pool (a restart, an idle
/// timeout) is replaced when taken, not handed out: the pool pings a connection
/// before handing it out (sqlx's `test_before_acquire`, kept on: skipping the ping
/// for a connection released less than a second before bought nothing measurable,
/// see BENCHMARKS.md).
#[tokio::test]
async fn a_connection_the_server_closed_while_idle_in_the_pool_is_replaced_when_taken() {
    let Some(admin) = common::pool().await else {
        return;
    };
    let pool = connect(&common::url(), 1, Duration::from_secs(5))
        .await
        .expect("pool");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .expect("pid");
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&admin)
        .await
        .expect("terminate");
    assert!(ended);
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let again: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .expect("an idle connection the server closed is replaced, not handed out");
    assert_ne!(again, pid);
}

/// A schema without every migration this build embeds is refused, naming what it
/// has, what is needed and `outbox migrate`; so is one without any tables.
#[tokio::test]
async fn a_schema_behind_this_build_is_refused_naming_outbox_migrate() {
    with_db!(|pool, schema| {
        outbox_adapters_postgres::check_current(&pool, &schema)
            .await
            .expect("a freshly migrated schema is current");
        let table = format!("{}._sqlx_migrations", schema.quoted());
        let newest: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT max(version) FROM {table}"
        )))
        .fetch_one(&pool)
        .await
        .expect("versions");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE version = $1"
        )))
        .bind(newest)
        .execute(&pool)
        .await
        .expect("forget the newest");
        let behind = outbox_adapters_postgres::check_current(&pool, &schema)
            .await
            .expect_err("one migration behind")
            .to_string();
        assert!(
            behind.contains("is at migration")
                && behind.contains(&format!("needs migration {newest}"))
                && behind.contains("outbox migrate"),
            "{behind}"
        );
        let empty = PgSchema::new(&format!("{schema}_none")).expect("name");
        let none = outbox_adapters_postgres::check_current(&pool, &empty)
            .await
            .expect_err("no tables")
            .to_string();
        assert!(none.contains("without the outbox's tables"), "{none}");
        migrate(&pool, &schema).await.expect("migrate again");
        outbox_adapters_postgres::check_current(&pool, &schema)
            .await
            .expect("current once migrated");
    })
}

/// A failure mark never fails because of the attempt history it appends to: a
/// row whose history was edited by hand into anything (a string, an object, JSON
/// null) is still marked, and its history reads as what can be read.
#[tokio::test]
async fn a_history_edited_by_hand_never_stops_a_failure_mark() {
    with_db!(|pool, schema| {
        let store = PgOutboxStore::new(pool.clone(), schema.clone());
        for junk in [r#""junk""#, r#"{"a": 1}"#, "null", r#"[{"attempt": "x"}]"#] {
            let m = outbox_testkit::message("history-junk", "k");
            store.enqueue(vec![m.clone()]).await.expect("enqueue");
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE {}.outbox_messages SET failed_attempts = $1::jsonb WHERE id = $2",
                schema.quoted()
            )))
            .bind(junk)
            .bind(m.id.as_uuid())
            .execute(&pool)
            .await
            .expect("edit by hand");
            let l = lease("junk");
            let claimed = store.claim_pending(&l, 10).await.expect("claim");
            assert_eq!(claimed.len(), 1, "{junk}");
            let marked = store
                .mark_publish_failed(
                    &l,
                    &[outbox_ports::PublishFailure {
                        id: m.id,
                        error: "no route".into(),
                        decision: Decision::Dead,
                    }],
                )
                .await
                .expect("the mark does not fail");
            assert_eq!(marked, 1, "{junk}");
            let record = store.get_message(m.id).await.expect("get").expect("row");
            assert_eq!(record.status, OutboxStatus::Dead, "{junk}");
            let last = record.publish.failed_attempts.last().expect("this attempt");
            assert_eq!(
                (last.attempt, last.error.as_str()),
                (1, "no route"),
                "{junk}"
            );
        }
    })
}
