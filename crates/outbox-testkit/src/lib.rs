//! Shared contract tests for the ports of `outbox`: one suite per port, run against
//! the memory adapters and every real adapter, so that they all behave alike.
//!
//! An adapter crate runs a suite with a macro and an async function that makes a
//! fresh, isolated instance of its adapter:
//!
//! ```text
//! async fn fresh_outbox() -> std::sync::Arc<dyn outbox_testkit::outbox::OutboxSubject> { ... }
//! outbox_testkit::outbox_store_contract!(crate::fresh_outbox);
//! ```
//!
//! Each case becomes its own `#[tokio::test]` (the calling crate needs tokio with the
//! `macros` and `rt` features as a dev-dependency). The cases use real time with short
//! leases, because database adapters take time from the database, not from a clock
//! the test could pause.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox_core::{Message, MessageId, NewMessage, Timestamp};

pub mod attempt_history;
pub mod audit;
pub mod cluster;
pub mod containers;
pub mod inbox;
pub mod inbox_operator;
pub mod inbox_replay;
pub mod lock;
pub mod outbox;
pub mod outbox_operator;
pub mod pauses;
pub mod proxy;
pub mod replay;
pub mod services;
pub mod state;
pub mod through;
pub mod throughput;
pub mod tls;
pub mod urls;

/// A short lease used by the cases; a test that waits for expiry sleeps longer.
pub const SHORT_TTL: Duration = Duration::from_millis(300);
/// A lease long enough to outlive any case.
pub const LONG_TTL: Duration = Duration::from_secs(60);

/// A fresh message to `exchange` with routing key `key` and a small JSON body. Ids
/// are version 7 and unique within the process.
#[must_use]
pub fn message(exchange: &str, key: &str) -> Message {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, Ordering::SeqCst);
    let now = Timestamp::now_utc();
    let mut random = [0u8; 10];
    random[..8].copy_from_slice(&seq.to_be_bytes());
    random[8..].copy_from_slice(&(std::process::id() as u16).to_be_bytes());
    NewMessage::new(exchange, key, format!("{{\"n\":{seq}}}").into_bytes())
        .with_type("test.message")
        .into_message(MessageId::v7(now, random), now)
}

/// `n` fresh messages.
#[must_use]
pub fn messages(n: usize) -> Vec<Message> {
    (0..n)
        .map(|_| message("contract", "contract.key"))
        .collect()
}

#[doc(hidden)]
#[macro_export]
macro_rules! __contract_cases {
    ($module:ident, $make:path, [$($case:ident),* $(,)?]) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let port = $make().await;
                    $crate::$module::$case(port).await;
                }
            )*
        }
    };
}

/// Runs the [`OutboxStore`](outbox_ports::OutboxStore) contract; `$make` is the
/// path of an async fn returning a fresh `Arc<dyn outbox::OutboxSubject>` (the
/// store, checked through the operator's reads of it).
#[macro_export]
macro_rules! outbox_store_contract {
    ($make:path) => {
        $crate::__contract_cases!(
            outbox,
            $make,
            [
                claims_pending_in_enqueue_order,
                a_delayed_message_is_claimed_only_once_due,
                keyed_messages_are_claimed_one_at_a_time_in_order,
                keyed_order_holds_under_interleaved_relays_10_seeds,
                a_leased_row_is_not_claimed_twice,
                marks_are_fenced_by_the_lease_holder,
                a_failed_publish_waits_for_its_backoff,
                dead_messages_can_be_requeued,
                requeue_refuses_a_message_a_relay_holds,
                an_expired_lease_brings_rows_back,
                release_returns_rows_unchanged,
                stats_count_by_status,
                an_invalid_message_stores_nothing,
                only_dead_messages_are_deleted,
                retention_deletes_only_old_sent_messages,
                concurrent_claimers_take_each_row_once,
            ]
        );
    };
}

/// Runs the [`InboxStore`](outbox_ports::InboxStore) and
/// [`InboxRetention`](outbox_ports::InboxRetention) contract; `$make` is the path
/// of an async fn returning a fresh `Arc<dyn inbox::InboxSubject>`.
#[macro_export]
macro_rules! inbox_store_contract {
    ($make:path) => {
        $crate::__contract_cases!(
            inbox,
            $make,
            [
                first_arrival_is_new_and_the_next_a_duplicate,
                consumers_are_isolated,
                a_failed_delivery_is_claimed_when_due,
                dead_after_the_last_failure,
                an_abandoned_arrival_is_claimed_after_its_lease,
                marks_are_fenced_by_the_lease_holder,
                reconsume_brings_a_consumed_delivery_back,
                reconsume_takes_only_the_status_acted_on,
                dead_letters_are_kept,
                a_delivery_the_broker_gave_up_on_is_dead_unless_held_already,
                keyed_deliveries_wait_behind_an_unfinished_one,
                a_dead_delivery_does_not_hold_its_key,
                retention_deletes_only_old_consumed_deliveries,
            ]
        );
    };
}

/// Runs the [`DistributedLock`](outbox_ports::DistributedLock) contract; `$make` is
/// the path of an async fn returning a fresh `Arc<dyn DistributedLock>`.
#[macro_export]
macro_rules! lock_contract {
    ($make:path) => {
        $crate::__contract_cases!(
            lock,
            $make,
            [
                one_holder_at_a_time,
                release_lets_the_next_holder_in,
                fencing_tokens_grow,
                whether_a_key_is_held_can_be_read,
            ]
        );
    };
}

/// Runs the [`SweepStateStore`](outbox_ports::SweepStateStore) contract; `$make` is
/// the path of an async fn returning a fresh `Arc<dyn SweepStateStore>`.
#[macro_export]
macro_rules! sweep_state_contract {
    ($make:path) => {
        $crate::__contract_cases!(
            state,
            $make,
            [
                absent_until_written,
                older_tokens_are_fenced,
                reports_expire,
            ]
        );
    };
}

/// Runs the [`OutboxOperator`](outbox_ports::OutboxOperator) contract; `$make` is
/// the path of an async fn returning a fresh
/// [`OutboxUnderTest`](crate::outbox_operator::OutboxUnderTest).
#[macro_export]
macro_rules! outbox_operator_contract {
    ($make:path) => {
        $crate::__contract_cases!(
            outbox_operator,
            $make,
            [
                pages_are_keyset_newest_first,
                limit_is_bounded_and_items_carry_a_preview,
                each_filter_field_narrows,
                q_finds_by_id_and_by_correlation_id,
                bulk_requeue_honours_max_and_status,
                bulk_delete_honours_force_and_leases,
                single_actions_are_guarded,
                publish_now_makes_a_delayed_message_due,
                published_per_minute_counts_sent_messages,
                failures_are_grouped_per_exchange_exactly,
                exchanges_are_counted_by_status,
                lists_go_oldest_first_when_asked,
                a_filter_by_error_group_takes_those_only,
                blocked_keys_are_listed_in_key_order,
            ]
        );
    };
}

/// Runs the attempt history contract ([`crate::attempt_history`]) on an outbox and
/// an inbox: `$outbox` and `$inbox` are paths of async fns returning a fresh
/// [`OutboxUnderTest`](crate::outbox_operator::OutboxUnderTest) and
/// [`InboxUnderTest`](crate::inbox_operator::InboxUnderTest).
#[macro_export]
macro_rules! attempt_history_contract {
    ($outbox:path, $inbox:path) => {
        mod attempt_history {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn failed_publishes_are_kept_newest_ten() {
                $crate::attempt_history::failed_publishes_are_kept_newest_ten($outbox().await)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn failed_handler_attempts_are_kept_newest_ten() {
                $crate::attempt_history::failed_handler_attempts_are_kept_newest_ten(
                    $inbox().await,
                )
                .await;
            }
        }
    };
}

/// Runs the replay contract ([`crate::replay`]); `$make` is the path of an async fn
/// returning a fresh [`OutboxUnderTest`](crate::outbox_operator::OutboxUnderTest).
#[macro_export]
macro_rules! replay_contract {
    ($make:path) => {
        $crate::__contract_cases!(
            replay,
            $make,
            [
                a_dead_message_is_replayed_once_as_a_new_one,
                only_a_dead_unkeyed_message_is_replayed,
            ]
        );
    };
}

/// Runs the inbox's replay contract ([`crate::inbox_replay`]); `$make` is the path of an
/// async fn returning a fresh
/// [`InboxUnderTest`](crate::inbox_operator::InboxUnderTest).
#[macro_export]
macro_rules! inbox_replay_contract {
    ($make:path) => {
        $crate::__contract_cases!(
            inbox_replay,
            $make,
            [a_dead_delivery_is_replayed_once_as_a_new_one]
        );
    };
}

/// Runs the [`InboxOperator`](outbox_ports::InboxOperator) contract; `$make` is the
/// path of an async fn returning a fresh
/// [`InboxUnderTest`](crate::inbox_operator::InboxUnderTest).
#[macro_export]
macro_rules! inbox_operator_contract {
    ($make:path) => {
        $crate::__contract_cases!(
            inbox_operator,
            $make,
            [
                deliveries_page_newest_first_per_consumer,
                bulk_reconsume_honours_max_and_status,
                deliveries_of_a_message_cover_every_consumer,
                consumers_and_dead_letters,
                consumed_per_minute_counts_consumed_deliveries,
                failures_are_grouped_per_consumer_exactly,
            ]
        );
    };
}

/// Runs the [`PauseStore`](outbox_ports::PauseStore) contract, with what pauses
/// do to the claims and the inbox of the same store; `$make` is the path of an
/// async fn returning a fresh [`PausesUnderTest`](crate::pauses::PausesUnderTest).
#[macro_export]
macro_rules! pause_contract {
    ($make:path) => {
        $crate::__contract_cases!(
            pauses,
            $make,
            [
                pause_and_resume_say_whether_they_changed_anything,
                claims_pass_over_a_paused_exchange_until_it_is_resumed,
                a_paused_keyed_head_holds_its_key_back,
                the_inbox_tells_a_consumer_it_is_paused,
            ]
        );
    };
}

/// Runs the [`AuditLog`](outbox_ports::AuditLog) contract; `$make` is the path of
/// an async fn returning a fresh `Arc<dyn AuditLog>`.
#[macro_export]
macro_rules! audit_log_contract {
    ($make:path) => {
        $crate::__contract_cases!(
            audit,
            $make,
            [
                records_are_listed_newest_first,
                an_empty_log_has_an_empty_page,
                writes_are_read_back_by_target,
            ]
        );
    };
}

/// A key no other test uses, for lock and state cases on shared servers.
#[must_use]
pub fn unique_key(prefix: &str) -> String {
    format!("{prefix}.{}", message("k", "k").id)
}

/// The [`outbox_ports::ThroughputLog`] contract: `throughput_log_contract!(make)`,
/// where `make` is an async function returning a fresh `Arc<dyn ThroughputLog>`.
#[macro_export]
macro_rules! throughput_log_contract {
    ($make:path) => {
        $crate::__contract_cases!(
            throughput,
            $make,
            [
                adds_sum_up_per_minute_and_kind,
                an_empty_log_has_no_minutes,
                named_adds_sum_up_per_name_and_kind,
                too_many_names_are_refused,
            ]
        );
    };
}
